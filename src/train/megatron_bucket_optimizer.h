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
// At TP or PP > 1 each model-parallel rank (tensor rank t, pipeline rank p) has its own buffers, saved (in either
// layout) under dp_group_idx_<t + TP·p> (DistributedOptimizer's data_parallel_group_idx, the rank in the TP x PP
// group): the layout is rebuilt per rank from its local parameters (Megatron's TP pieces of each tensor,
// megatron_tp_split.h: rows of linear_qkv / linear_fc1 (SwiGLU: [gate piece; up piece]) / word embeddings /
// output layer, columns of linear_proj / linear_fc2, norms and row-parallel biases whole; the stage's layers — those
// of Megatron's split, megatron_stage_layers: even, or uneven with decoder_first/last_pipeline_num_layers or
// account_for_embedding/loss_in_pipeline_split —, the embedding on the first stage, the final norm and
// output layer on the last), checked against that rank's per_bucket_numel_unpadded (dp_zero_gather_scatter: its
// gathered total) and its masters against its piece of the weights; the pieces are then merged into global tensors
// (SwiGLU halves joined separately) at the global layer numbers.
//
// Tied embeddings at PP > 1 (no args.untie_embeddings_and_output_weights): the last stage keeps its own copy of the
// word embedding (GPTModel's output_layer.weight, saved in the model state only as a replica of the embedding), at
// the output layer's place; both copies are Megatron's shared_embedding, which the distributed optimizer's buffer puts
// in a bucket of its own (the open bucket closes at the copy's 64-aligned start). The copy's masters are checked
// against the embedding's piece and its state must equal the first stage's bit for bit (Megatron all-reduces the two
// copies' gradients), else DataLoss.
//
// MoE (args.num_experts > 0): Megatron's ChainedOptimizer [dense, experts] saves each optimizer's objects and buffers
// under its chained_<i>. prefix. The dense buffer (chained_0., dp_group_idx_<t + TP·p>) holds every parameter but the
// experts' — MoELayer registers its router, its experts, then its shared experts (the router's expert_bias is a buffer,
// in none) —; the experts (mlp.experts.experts.linear_fc1/fc2, stacked [L, E, ...]) sit in Megatron's
// expert_parallel_buffers: expert-parallel rank e's buffer (chained_1., dp_group_idx_<e + EP·p>, its rank in the
// tp-ep-pp expert group at expert TP 1) holds its E / EP local experts of the stage's layers, each local expert's
// linear_fc1 then linear_fc2, laid out and checked (bucket sizes, masters against the [layer][expert] slice of the
// weights) as above, then placed at its global expert.
//
// Virtual pipeline chunks (args.virtual_pipeline_model_parallel_size or num_layers_per_virtual_pipeline_stage, an even
// split): each chunk is its own DDP module, so pipeline rank p's optimizer holds one buffer per chunk, numbered in
// chunk order (gbuf_idx_<v>; per_bucket_numel_unpadded lists one {dtype: sizes} per chunk); chunk v holds virtual
// stage v·PP + p's layers, the embedding in rank 0's chunk 0, the final norm and output layer in the last rank's last
// chunk; training.get_model disables bucketing for the chunks after the first (one bucket each).
//
// Refused (Unimplemented, naming --no-load-optim): virtual pipeline chunks with an uneven split, tied embeddings or
// MoE, pipeline_model_parallel_layout, several buffers of one optimizer
// (several parameter dtypes), expert TP > 1, MoE with Transformer Engine's names or per-layer expert keys, models whose
// parameter names Gale cannot place in Megatron's order, args without transformer_impl; a split Megatron refuses itself (num_layers not divisible by PP without the uneven flags, ...) is
// DataLoss naming the args. A checkpoint whose buckets disagree with the rebuilt layout is DataLoss, naming the bucket
// (and the model-parallel rank), what was expected and found.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ckpt/dcp_reader.h"
#include "ckpt/pickle.h"
#include "core/status.h"
#include "core/tensor.h"
#include "train/megatron_dist_optimizer.h"

namespace gale {

// One parameter (one layer's slice of a stacked model key) in Megatron's gradient buffer.
struct MegatronBucketParam {
  std::string key;     // the model key in the checkpoint ("decoder.layers.mlp.linear_fc1.weight")
  int64_t layer = -1;  // the slice of a stacked key ("decoder.layers.<rest>"); -1: the whole tensor
  int64_t numel = 0;
  int bucket = 0;
  int64_t begin = 0;  // offset in its bucket
  Shape shape;        // its shape on the saving rank (one layer's slice, that rank's TP piece); empty: unknown
  // Megatron's shared_embedding (tied embeddings at PP > 1: the first stage's embedding, the last stage's copy): the
  // distributed optimizer's buffer gives it a bucket of its own (the open bucket closes at its aligned start).
  bool own_bucket = false;
  int64_t expert = -1;  // the global expert of a stacked experts key ([L, E, ...]: the [layer][expert] slice)
};

struct MegatronBucketLayout {
  std::vector<MegatronBucketParam> params;  // buffer order (the model's parameters reversed)
  std::vector<int64_t> bucket_numel_unpadded;
};

// One model-parallel rank of the saving run: its TP piece and its pipeline stage.
struct MegatronModelRank {
  int64_t tp_size = 1, tp_rank = 0;
  int64_t first_layer = 0, num_layers = -1;  // the stage's global layers [first, first + num); -1: every layer
  bool first_stage = true, last_stage = true;  // the embedding; the final norm and output layer
  bool swiglu = false;                         // linear_fc1 holds [gate; up]: each TP piece has both halves
  // Tied embeddings (no --untie-embeddings-and-output-weights): a last stage that is not also the first holds its own
  // copy of the word embedding as output_layer.weight, listed under the embedding's key at the output layer's place.
  bool tied_embeddings = false;
  // MoE: the expert parameters (mlp.experts.experts.*, stacked [L, E, ...]) sit in buffers of their own (Megatron's
  // expert_parallel_buffers). experts = false: the dense buffer's parameters (no expert ones); true: the expert
  // buffer's, expert-parallel rank ep_rank's E / ep_size local experts.
  bool experts = false;
  int64_t ep_size = 1, ep_rank = 0;
};

// The parameters of the model keys `c` holds in Megatron's model.parameters() order on model-parallel rank `rank`
// (layers by number, a stacked key as one entry per layer, numel and shape of that rank's TP piece), for
// args.transformer_impl `impl` ("local" or "transformer_engine"); `num_layers` is args.num_layers (the stacked
// keys' first dimension). DataLoss when a TP-split dimension does not divide by rank.tp_size.
StatusOr<std::vector<MegatronBucketParam>> megatron_parameter_order(const DcpCheckpoint& c, const std::string& impl,
                                                                    int64_t num_layers, const std::string& dir,
                                                                    const MegatronModelRank& rank = {});

// The same over the model keys and shapes of one saving rank (a torch-format rank file's state dict: its local TP
// pieces, so rank.tp_size 1, and its stage's layers numbered from 0).
StatusOr<std::vector<MegatronBucketParam>> megatron_parameter_order(const std::map<std::string, Shape>& shapes,
                                                                    const std::string& impl, int64_t num_layers,
                                                                    const std::string& dir,
                                                                    const MegatronModelRank& rank = {});

// Megatron's _ParamAndGradBuffer layout of `params` (in model order) with the distributed optimizer:
// `bucket_size` 0 = one bucket; a parameter with own_bucket closes the open bucket (at its 64-aligned start) and its
// own after it.
MegatronBucketLayout megatron_bucket_layout(std::vector<MegatronBucketParam> params, int64_t bucket_size);

// The layers of each of the `pp` pipeline stages of Megatron's split (one model chunk per stage) from its args:
// decoder_first/last_pipeline_num_layers (the others even over the middle stages), account_for_embedding/
// loss_in_pipeline_split (the embedding and the loss each take a layer's place on the first / last stage), else
// num_layers / pp each. DataLoss, naming the args, for a split Megatron refuses.
StatusOr<std::vector<int64_t>> megatron_stage_layers(const PyValue* args, int64_t pp, int64_t num_layers,
                                                     const std::string& what);

// The DDP bucket size of the saving run from its args (0 = one bucket); `num_parameters` the rank's parameter count
// (for args.ddp_num_buckets). DataLoss naming `where` when the args cannot tell.
StatusOr<int64_t> megatron_saved_bucket_size(const PyValue* args, int64_t num_parameters, const std::string& where);

// Where a piece sits: model key, layer (-1: the whole tensor), global expert (-1: not an expert's).
using MegatronPieceAt = std::tuple<std::string, int64_t, int64_t>;
// One model-parallel rank's state: state ("fp32_param", "exp_avg", ...) -> where -> its piece (f32).
using MegatronRankState = std::map<std::string, std::map<MegatronPieceAt, Tensor>>;

// DistributedOptimizer.get_parameter_state_dp_zero's dict `state` ({'buckets_coalesced': True, 0: {(param dtype,
// grad dtype): {'param', 'exp_avg', 'exp_avg_sq', 'numel_unpadded'}}}: the legacy format's distrib_optim.pt)
// cut into the parameters of `layout` (the masters as "fp32_param"); with virtual pipeline chunks buffer `gbuf` of
// `buffers` (one per chunk, keys 0..buffers-1). `file` and `what` name it in errors: a total other than the layout's,
// more buffers than `buffers` (Unimplemented).
StatusOr<MegatronRankState> megatron_split_dp_zero(const PyRef& state, const MegatronBucketLayout& layout,
                                                   const std::string& file, const std::string& what, int64_t gbuf = 0,
                                                   int64_t buffers = 1);

// Fills o->tensors (fp32_param, exp_avg, exp_avg_sq by model key, global shapes as saved, the TP pieces merged and
// every stage's layers in place) from the bucket-space state of `c` (layout o->layout); `args` Megatron's args
// Namespace.
Status read_megatron_bucket_state(const DcpCheckpoint& c, const PyValue* args, const std::string& dir,
                                  MegatronOptimizerState* o);

}  // namespace gale
