// Megatron-LM's offline-distillation flags (--logits-save-*, --logits-load-*): their checks, in
// Megatron's words where it has them, and Gale's one-line refusals of what does not compose yet.
#include <cmath>
#include <filesystem>

#include "core/log.h"
#include "train/arguments.h"

namespace gale {

void add_logits_kd_args(ArgParser& p, LogitsKdArgs& a) {
  p.group("logits distillation");
  p.add("--logits-save-top-k", &a.logits_save_top_k, "number of top logits to save (required with --logits-save-dir)");
  p.add("--logits-save-top-p", &a.logits_save_top_p,
        "top-P (nucleus) threshold applied after the top-K selection when saving logits, in (0, 1]");
  p.add("--logits-save-top-p-min-k", &a.logits_save_top_p_min_k,
        "minimum entries kept per token when top-P masking is active (default 1)");
  p.add("--logits-save-dir", &a.logits_save_dir, "directory to save the teacher's top-K log-probabilities to");
  p.add_choice("--logits-save-dtype", &a.logits_save_dtype, {"fp16", "bf16", "fp32"},
               "dtype of the saved top-K log-probabilities (default fp16)");
  p.add("--logits-load-dir", &a.logits_load_dir, "directory of a teacher's saved logits to distil from");
  p.add("--logits-load-decode-threads", &a.logits_load_decode_threads,
        "Megatron's decode threads of its logits loader (accepted; Gale's reader decodes on the training thread)");
  p.add("--logits-load-prefetch-factor", &a.logits_load_prefetch_factor,
        "Megatron's DataLoader prefetch factor of its logits loader (accepted; Gale's reader does not prefetch)");
  p.add("--logits-load-msc-prefetch-depth", &a.logits_load_msc_prefetch_depth,
        "Megatron's object-storage shard prefetch depth (accepted; Gale reads local directories)");
  p.add("--logits-load-kd-loss-alpha", &a.logits_load_kd_loss_alpha,
        "the loss is alpha * kd_loss + (1 - alpha) * lm_loss (default 1)");
  p.add_flag("--logits-load-ignore-errors", &a.logits_load_ignore_errors,
             "KD loss errors are logged as warnings and training falls back to the LM-only loss");
}

Status validate_logits_kd_args(const Arguments& a, const ArgParser& p) {
  const LogitsKdArgs& k = a.logits_kd;
  // Megatron ignores the other flags without their directory; Gale says so.
  if (k.logits_save_dir.empty())
    for (const char* f : {"--logits-save-top-k", "--logits-save-top-p", "--logits-save-top-p-min-k", "--logits-save-dtype"})
      if (p.was_set(f)) warn_rank0(std::string(f) + " has no effect without --logits-save-dir");
  if (k.logits_load_dir.empty())
    for (const char* f : {"--logits-load-kd-loss-alpha", "--logits-load-ignore-errors", "--logits-load-decode-threads",
                          "--logits-load-prefetch-factor", "--logits-load-msc-prefetch-depth"})
      if (p.was_set(f)) warn_rank0(std::string(f) + " has no effect without --logits-load-dir");
  std::error_code ec;
  if (!k.logits_save_dir.empty()) {
    if (!p.was_set("--logits-save-top-k"))
      return InvalidArgument("--logits-save-top-k is required when --logits-save-dir is set.");
    if (k.logits_save_top_k < 1)
      return InvalidArgument("--logits-save-top-k: expected a positive number of logits, found ", k.logits_save_top_k);
    if (p.was_set("--logits-save-top-p") && !(k.logits_save_top_p > 0.0 && k.logits_save_top_p <= 1.0))
      return InvalidArgument("--logits-save-top-p: expected a value in (0, 1], found ", k.logits_save_top_p);
    if (k.logits_save_top_p_min_k < 1)
      return InvalidArgument("--logits-save-top-p-min-k: expected at least 1, found ", k.logits_save_top_p_min_k);
    if (std::filesystem::exists(k.logits_save_dir, ec) && !std::filesystem::is_directory(k.logits_save_dir, ec))
      return InvalidArgument("--logits-save-dir: '", k.logits_save_dir, "' exists and is not a directory");
    if (!a.training.freeze_all_layers)
      warn_rank0("--logits-save-dir without --freeze-all-layers: the LM loss is still computed and gradients will "
                 "update the model while logits are dumped. This is intended only when dumping logits during active "
                 "training; for a frozen-teacher dump pass --freeze-all-layers.");
  }
  if (!k.logits_load_dir.empty()) {
    if (!std::filesystem::is_directory(k.logits_load_dir, ec))
      return NotFound("--logits-load-dir: '", k.logits_load_dir, "' is not a directory");
    if (!std::isfinite(k.logits_load_kd_loss_alpha))
      return InvalidArgument("--logits-load-kd-loss-alpha: expected a finite number, found ", k.logits_load_kd_loss_alpha);
    if (k.logits_load_decode_threads < 1 || k.logits_load_prefetch_factor < 1 || k.logits_load_msc_prefetch_depth < 0)
      return InvalidArgument("--logits-load-decode-threads and --logits-load-prefetch-factor: expected at least 1, "
                             "--logits-load-msc-prefetch-depth at least 0, found ", k.logits_load_decode_threads, ", ",
                             k.logits_load_prefetch_factor, ", ", k.logits_load_msc_prefetch_depth);
  }
  // What the training loop's hooks (train/logits_kd_hooks.h) do not compose with yet, one line each.
  if (k.logits_save_dir.empty() && k.logits_load_dir.empty()) return Status::Ok();
  if (!k.logits_save_dir.empty() && !k.logits_load_dir.empty())
    return Unimplemented("--logits-save-dir with --logits-load-dir: saving a student's logits while it distils is not supported");
  const char* flag = k.logits_save_dir.empty() ? "--logits-load-dir" : "--logits-save-dir";
  const ParallelArgs& par = a.parallel;
  // Megatron's shards hold each CP rank's tokens in its load-balanced order (chunks r and 2C-1-r).
  if (par.context_parallel_size > 1 && par.context_parallel_algo != "megatron_cp_algo")
    return Unimplemented(flag, " with --context-parallel-algo ", par.context_parallel_algo,
                         ": not supported (the cp{C} shards hold Megatron's load-balanced split; use megatron_cp_algo)");
  if (par.tp_2d) return Unimplemented(flag, " with --tp-2d: not supported yet");
  if (a.qad.qad_enable) return Unimplemented(flag, " with --qad-enable: not supported (two distillation losses)");
  if (a.dpo.enabled()) return Unimplemented(flag, " with --stage dpo: not supported");
  return Status::Ok();
}

}  // namespace gale
