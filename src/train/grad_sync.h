// The gradient side of a training iteration around the schedule and the optimizer, as Megatron:
//
//   start_grad_sync_iteration(engine, m);   // zero grads, arm the data-parallel buckets
//   forward_backward(...);                  // buckets may start reducing during backward
//   finalize_model_grads(engine);           // Megatron's finalize_model_grads
//   optimizer_step(engine, lr, wd, zeros);  // step, then the distributed optimizer's all-gather
//
// finalize_model_grads makes each rank's gradients the ones its optimizer step needs:
//   1. data parallelism: finish the bucketed average over the data-parallel (x context-parallel)
//      group — all-reduce, or reduce-scatter with the distributed optimizer (then only this rank's
//      shard of each bucket holds the reduced gradient);
//   2. sequence parallelism: gradients of parameters replicated across TP but fed by a split
//      sequence (norm weights, row-parallel biases) are partial per TP rank: all-reduce over TP;
//   3. tied embedding and output weights on different pipeline stages: all-reduce over the
//      embedding group (first and last stage).
//   4. --moe-router-enable-expert-bias: every MoE layer's expert bias moves by the step's token
//      counts summed over TP×DP×CP (Megatron does it here too, before the optimizer step; the bias
//      does not enter the gradients, so the order does not matter).
//   5. --calculate-per-token-loss (`num_tokens`: this rank's Σ mask over the iteration's
//      micro-batches, meaningful on the last pipeline stage only): the count is broadcast from the
//      last pipeline stage, summed over the data-parallel group (without CP: every cp rank already
//      holds its sequences' whole count) and every gradient is multiplied by 1 / that total (none
//      when it is 0). Step 1 then sums without the 1/DP factor (DataParallelConfig::grad_scale 1).
// --quant-grads (optim/quant_grads.h): step 1 completes each chunk's FP16 main gradients, aligns
// their scales over the data-parallel group (MIN) and sums them through the sync's buckets a
// scratch-sized piece at a time (QuantGradStore::reduce, instead of the sync's own reduction),
// rounding the sums to FP16; steps 2-3 run in f32 on the resident parameters' slots (the only
// ones they touch), step 4's factor is applied as the store hands the gradients out.
// Steps 2 and 3 are sums over other groups, so they commute with step 1; with the distributed
// optimizer they are right on the owned shards because every member of those groups owns the
// same elements (same bucket layout, and the shared embedding in a bucket of its own).
#pragma once

#include <optional>

#include "train/engine.h"

namespace gale {

// Zeroes every chunk's gradients and prepares the data-parallel sync for `num_microbatches`.
void start_grad_sync_iteration(Engine& engine, int64_t num_microbatches);

// Times all-grads-sync (step 1), layernorm-grads-all-reduce (2) and embedding-grads-all-reduce (3)
// with engine.timers, as Megatron's finalize_model_grads.
void finalize_model_grads(Engine& engine, std::optional<double> num_tokens = std::nullopt);

// The optimizer step, then (distributed optimizer) the all-gather of the updated parameter
// shards — deferred to the next forward with --overlap-param-gather.
// `inv_grad_scale`: --fp16's 1 / loss scale (Optimizer::step), else 1. Times the optimizer's phases
// and params-all-gather (distributed optimizer without --overlap-param-gather) with engine.timers.
StepResult optimizer_step(Engine& engine, double lr, double wd, bool count_zeros, float inv_grad_scale = 1.0f,
                          std::optional<double> decoupled_lr = std::nullopt);

// ZeRO-3 (Engine::zero3): every parameter of every chunk gathered for this object's lifetime
// (reading or writing them all: checkpoints); released at the end, each rank's shard first taken
// back from the gathered values when `write_back` (a load). Nothing without ZeRO-3.
class GatheredParams {
 public:
  GatheredParams(const Engine& engine, bool write_back);
  ~GatheredParams();
  GatheredParams(const GatheredParams&) = delete;
  GatheredParams& operator=(const GatheredParams&) = delete;

 private:
  const Engine& engine_;
  bool write_back_;
};

// Completes every parameter all-gather still pending (before reading all parameters: saving a
// checkpoint, comparing them). A no-op without the distributed optimizer.
void finish_param_sync(const Engine& engine);

}  // namespace gale
