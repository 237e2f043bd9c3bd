// Megatron's bucket-space distributed optimizer state (dp_reshardable, dp_zero_gather_scatter) -> model space.
//
// The distributed optimizer's bucket-space layouts save the saving run's data-parallel buffers as they are:
// one 1-D tensor per bucket and state,
//   optimizer.distributed.dp_group_idx_<G>.gbuf_idx_<I>.dtype_<(param dtype, grad dtype)>.bucket_idx_<B>.<state>
// (state: `param` the fp32 master copies, `exp_avg`, `exp_avg_sq`), holding the bucket's first numel_unpadded
// elements in buffer order (core_v0.12's fully_sharded_bucket_space stores the same padded to a multiple of
// DP, but is refused by the caller until a fixture from Megatron's writer proves it); `dp_zero_gather_scatter`
// one object `optimizer.distributed.dp_group_idx_<G>.param_state`, {0: {(param dtype, grad dtype): {'param',
// 'exp_avg', 'exp_avg_sq': every bucket's unpadded elements one after another, 'numel_unpadded'}}}. The param
// groups with the step (`.optimizer`), the loss scaler (`.grad_scaler`) and, with dp_reshardable, the bucket
// sizes (`.per_bucket_numel`, `.per_bucket_numel_unpadded`) are objects under the same dp_group_idx_<G> prefix,
// stored as "<key>/shard_0_1", each value in a one-element list.
//
// Which elements belong to which parameter is Megatron's _ParamAndGradBuffer layout, rebuilt here from the
// saved args and model tensors: the parameters in reverse model.parameters() order (which depends on
// args.transformer_impl: the local spec registers input_layernorm before self_attention, Transformer Engine
// fuses the norms into linear_qkv / linear_fc1 and registers them after linear_proj), each starting at a
// multiple of 64 elements, a bucket closing after the parameter that brings it to bucket_size elements
// (args.ddp_bucket_size, or the parameter count / args.ddp_num_buckets, or max(40M, 1M * DP); unbounded
// without args.overlap_grad_reduce), the next bucket starting at a multiple of lcm(DP, 128). The result is
// checked against the saved per_bucket_numel_unpadded (or the gathered total) and, element by element, against
// the model weights:
// every master copy, rounded to the weights' dtype, must be the saved weight (Megatron copies the masters
// into the weights after each step), so a layout Gale got wrong is refused, never loaded.
//
// Refused (Unimplemented, naming --no-load-optim): saving runs at TP or PP > 1 (each model-parallel rank's
// buffers hold its local shards), several buffers (MoE expert parameters, several parameter dtypes), models
// whose parameter names Gale cannot place in Megatron's order, args without transformer_impl. A checkpoint
// whose buckets disagree with the rebuilt layout is DataLoss, naming the bucket, what was expected and found.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/dcp_reader.h"
#include "ckpt/pickle.h"
#include "core/status.h"
#include "train/megatron_dist_optimizer.h"

namespace gale {

// One parameter (one layer's slice of a stacked model key) in Megatron's gradient buffer.
struct MegatronBucketParam {
  std::string key;     // the model key in the checkpoint ("decoder.layers.mlp.linear_fc1.weight")
  int64_t layer = -1;  // the slice of a stacked key ("decoder.layers.<rest>"); -1: the whole tensor
  int64_t numel = 0;
  int bucket = 0;
  int64_t begin = 0;  // offset in its bucket
};

struct MegatronBucketLayout {
  std::vector<MegatronBucketParam> params;  // buffer order (the model's parameters reversed)
  std::vector<int64_t> bucket_numel_unpadded;
};

// The parameters of the model keys `c` holds in Megatron's model.parameters() order (layers by number, a
// stacked key as one entry per layer), for args.transformer_impl `impl` ("local" or "transformer_engine").
StatusOr<std::vector<MegatronBucketParam>> megatron_parameter_order(const DcpCheckpoint& c, const std::string& impl,
                                                                    int64_t num_layers, const std::string& dir);

// Megatron's _ParamAndGradBuffer layout of `params` (in model order) with the distributed optimizer:
// `bucket_size` 0 = one bucket.
MegatronBucketLayout megatron_bucket_layout(std::vector<MegatronBucketParam> params, int64_t bucket_size);

// Fills o->tensors (fp32_param, exp_avg, exp_avg_sq by model key, global shapes as saved) from the
// bucket-space state of `c` (layout o->layout); `args` Megatron's args Namespace.
Status read_megatron_bucket_state(const DcpCheckpoint& c, const PyValue* args, const std::string& dir,
                                  MegatronOptimizerState* o);

}  // namespace gale
