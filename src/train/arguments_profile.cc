// Megatron's and MindSpeed's profiling flags: the --profile window and its trace options,
// --record-memory-history (train/profiler.h; README "Profiling").
#include "train/arguments.h"

namespace gale {

void add_profile_args(ArgParser& p, ProfileArgs& a) {
  p.group("profiling");
  p.add_flag("--profile", &a.profile,
             "record a Chrome trace (Perfetto, chrome://tracing) of the --profile-step-start .. --profile-step-end "
             "iterations on --profile-ranks: step phases, kernels, GEMMs, communication");
  p.add("--profile-step-start", &a.profile_step_start,
        "the trace starts after this many iterations (Megatron's global step; default 10)");
  p.add("--profile-step-end", &a.profile_step_end, "the trace ends after this iteration (default 12)");
  p.add_list("--profile-ranks", &a.profile_ranks_flag, "global ranks that record a trace (default 0; -1: every rank)",
             /*min_values=*/1);
  p.add_flag("--use-pytorch-profiler", &a.use_pytorch_profiler,
             "accepted: Gale's trace is written in the Chrome format the PyTorch profiler writes");
  p.add_flag("--record-memory-history", &a.record_memory_history,
             "the last rank records every allocation and free of the host allocator (size, tag) from the first "
             "training iteration and writes a snapshot at every log line and at the end");
  p.add("--memory-snapshot-path", &a.memory_snapshot_path,
        "where --record-memory-history writes its JSON snapshot (default snapshot.json)");
  p.add_choice("--profile-level", &a.profile_level, {"level_none", "level0", "level1", "level2"},
               "MindSpeed's detail: level_none step phases; level0 (default) + kernels and GEMMs; level1 + "
               "communication; level2 + every kernel call's sizes and FLOPs");
  p.add_flag("--profile-with-cpu", &a.profile_with_cpu, "accepted: Gale's trace is the CPU's");
  p.add_flag("--profile-with-stack", &a.profile_with_stack, "call stacks in the trace (not supported yet)");
  p.add_flag("--profile-with-memory", &a.profile_with_memory,
             "each span's live bytes at its end and their change, and a host-memory counter track");
  p.add_flag("--profile-record-shapes", &a.profile_record_shapes, "each kernel call's sizes (GEMM M, N, K, ...)");
  p.add("--profile-save-path", &a.profile_save_path,
        "the traces' directory (default: --tensorboard-dir when given, else ./profile_dir)");
}

Status validate_profile_args(Arguments& a, const ArgParser& p, int64_t world_size) {
  ProfileArgs& f = a.profile;
  if (f.profile_with_stack)
    return Unimplemented("--profile-with-stack: not supported yet (Gale's trace records no call stacks; the spans "
                         "name the step phase and the kernel)");
  f.profile_ranks.clear();
  for (const std::string& v : f.profile_ranks_flag) {
    const size_t digits = !v.empty() && (v[0] == '-' || v[0] == '+') ? 1 : 0;
    if (v.size() == digits || v.size() > digits + 9 || v.find_first_not_of("0123456789", digits) != std::string::npos)
      return InvalidArgument("--profile-ranks: expected global ranks (integers, -1 for every rank), found '", v, "'");
    const int64_t r = std::stoll(v);
    if (r < -1 || r >= world_size)
      return InvalidArgument("--profile-ranks: rank ", r, " is not a rank of this run (expected -1 or 0 .. ",
                             world_size - 1, " for a world of ", world_size, ")");
    f.profile_ranks.push_back(r);
  }
  if (!f.profile) return Status::Ok();  // the other flags only tune --profile (Megatron ignores them too)
  if (f.profile_step_start < 0)
    return InvalidArgument("--profile-step-start: expected an iteration >= 0, found ", f.profile_step_start);
  if (f.profile_step_end <= f.profile_step_start)
    return InvalidArgument("--profile-step-end ", f.profile_step_end, " must be greater than --profile-step-start ",
                           f.profile_step_start, " (the trace covers the iterations after start, up to and with end)");
  (void)p;
  return Status::Ok();
}

}  // namespace gale
