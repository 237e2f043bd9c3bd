// Megatron's FP8 flags (its Transformer-Engine argument group; features/feature_fp8.cc, model/fp8.h).
#include "train/arguments.h"

namespace gale {

void add_fp8_args(ArgParser& p, ModelArgs& a) {
  p.group("FP8 training (emulated)");
  p.add_choice("--fp8-format", &a.fp8_format, {"e4m3", "hybrid"},
               "FP8-emulated linear GEMMs (model/fp8.h): e4m3 everywhere, or hybrid (E4M3 forward, E5M2 gradients)");
  p.add("--fp8-recipe", &a.fp8_recipe,
        "--fp8-format's scaling: delayed (amax history), tensorwise (current per-tensor amax) or mxfp8 (E8M0 per 32)");
  p.add("--fp8-margin", &a.fp8_margin, "delayed scaling: scale = fp8_max / amax / 2^margin");
  p.add("--fp8-interval", &a.fp8_interval, "deprecated in Megatron and ignored (as there)");
  p.add("--fp8-amax-history-len", &a.fp8_amax_history_len, "delayed scaling: amax history entries per tensor");
  p.add_choice("--fp8-amax-compute-algo", &a.fp8_amax_compute_algo, {"most_recent", "max"},
               "delayed scaling: the amax from the history's newest entry or its maximum");
  p.add_false("--no-fp8-wgrad", &a.fp8_wgrad, "--fp8-format: the weight-gradient GEMM in the run's precision");
  p.add_flag("--fp8-param-gather", &a.fp8_param_gather,
             "Megatron's FP8 parameter copy for the all-gather (not supported yet: features/feature_fp8.cc)");
  p.add_flag("--first-last-layers-bf16", &a.first_last_layers_bf16,
             "--fp8-format: the first and last decoder layers' GEMMs not in FP8 (not with --fp8-recipe delayed)");
  p.add("--num-layers-at-start-in-bf16", &a.num_layers_at_start_in_bf16,
        "--first-last-layers-bf16: decoder layers at the start kept out of FP8");
  p.add("--num-layers-at-end-in-bf16", &a.num_layers_at_end_in_bf16,
        "--first-last-layers-bf16: decoder layers at the end kept out of FP8");
}

}  // namespace gale
