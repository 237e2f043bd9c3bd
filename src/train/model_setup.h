// From validated flags to the model, optimizer and scheduler configurations.
#pragma once

#include "model/activation_compress.h"
#include "model/activation_swap.h"
#include "model/smart_swap.h"
#include "model/config.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "train/arguments.h"

namespace gale {

// Requires a.model.padded_vocab_size to be set (it depends on the tokenizer).
ModelConfig model_config_from_args(const Arguments& a);
OptimizerConfig optimizer_config_from_args(const Arguments& a);
// --swap-attention, --swap-modules, --swap-attention-dir.
SwapAttentionConfig swap_attention_config_from_args(const Arguments& a);
// --smart-swap, --smart-swap-warmup-iters, --smart-swap-reduction-mb / --smart-swap-target-mb
// (MiB, rounded to whole bytes), --swap-attention-dir.
SmartSwapConfig smart_swap_config_from_args(const Arguments& a);
// --compress-activation, --compress-dense (validated by their features).
ActivationCompressConfig activation_compress_config_from_args(const Arguments& a);
// Megatron's get_optimizer_param_scheduler: steps counted in samples.
LrSchedule lr_schedule_from_args(const Arguments& a);
// --fp16's loss scaler: constant with --loss-scale, else dynamic from --initial-loss-scale,
// --min-loss-scale, --loss-scale-window and --hysteresis (growth ×2, backoff ×0.5 as Megatron).
GradScalerConfig grad_scaler_config_from_args(const Arguments& a);
// --recompute-granularity selective --recompute-modules: `layernorm` recomputes both norms' outputs
// in every layer (on top of what MindSpeed's --recompute-norm set in `plan`); core_attn needs
// nothing (attention probabilities are never kept).
void apply_recompute_modules(const ModelArgs& m, RecomputePlan* plan);
// Iterations of the run: --train-iters, or Megatron's update_train_iters for --train-samples
// (--train-samples // global batch size, or with --rampup-batch-size the ramp-up's iterations plus
// whole global batches of the rest: NumMicroBatchesCalculator::train_iters_for_samples).
int64_t train_iters_from_args(const Arguments& a);

}  // namespace gale
