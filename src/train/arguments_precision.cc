// Megatron's precision-aware optimizer flags and its gradient-reduction dtype flags
// (features/feature_precision_aware_optimizer.cc validates them).
#include "train/arguments.h"

namespace gale {

void add_precision_args(ArgParser& p, TrainingArgs& a) {
  p.group("precision-aware optimizer");
  p.add_flag("--use-precision-aware-optimizer", &a.use_precision_aware_optimizer,
             "Megatron: Transformer Engine's precision-aware FusedAdam: Adam's moments stored in "
             "--exp-avg-dtype / --exp-avg-sq-dtype with one f32 scale per optimizer segment; needs "
             "--use-distributed-optimizer and --optimizer adam");
  p.add_choice("--main-grads-dtype", &a.main_grads_dtype, {"fp32", "bf16"},
               "Megatron: dtype of the main gradients with --use-precision-aware-optimizer (bf16: with --bf16 the "
               "gradients are reduced over data parallelism in bf16, as --grad-reduce-in-bf16)");
  p.add_choice("--main-params-dtype", &a.main_params_dtype, {"fp32", "fp16"},
               "Megatron: dtype of the main parameters with --use-precision-aware-optimizer (fp16: not supported yet)");
  p.add_choice("--exp-avg-dtype", &a.exp_avg_dtype, {"fp32", "fp16", "fp8"},
               "Megatron: dtype of Adam's exp_avg with --use-precision-aware-optimizer (fp16: scaled to 32752, fp8: "
               "E4M3 scaled to 448, one f32 scale per optimizer segment)");
  p.add_choice("--exp-avg-sq-dtype", &a.exp_avg_sq_dtype, {"fp32", "fp16", "fp8"},
               "Megatron: dtype of Adam's exp_avg_sq with --use-precision-aware-optimizer (as --exp-avg-dtype)");
  p.add_flag("--grad-reduce-in-bf16", &a.grad_reduce_in_bf16,
             "Megatron: with --bf16, reduce the gradients over data parallelism in bf16 (a half-size collective; each "
             "bucket rounded to bf16 before the sum and the sum rounded to bf16)");
  p.add_flag("--accumulate-allreduce-grads-in-fp32", &a.accumulate_allreduce_grads_in_fp32,
             "Megatron: accumulate and reduce gradients in fp32 (Gale's default; --grad-reduce-in-bf16 overrides it, "
             "and --main-grads-dtype must then be fp32)");
}

}  // namespace gale
