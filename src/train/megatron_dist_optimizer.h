// Megatron's optimizer state in a torch_dist checkpoint, read back in model space (Adam's moments, fp32 master params).
//
//   GALE_ASSIGN_OR_RETURN(DcpCheckpoint c, DcpCheckpoint::open(iter_dir));
//   GALE_ASSIGN_OR_RETURN(MegatronOptimizerState o, read_megatron_dist_optimizer(c, *common, args, iter_dir));
//   o.tensors["exp_avg"]["decoder.layers.self_attention.linear_qkv.weight"]   // [L, ...], as the model key
//
// Megatron (megatron/core/optimizer, docs/formats/megatron-checkpoint.md) saves, under `optimizer`:
//  - the non-distributed optimizers (FP32Optimizer, Float16OptimizerWithFloat16Params): a sharded tensor
//    `optimizer.state.<state>.<model key>` per optimizer state (exp_avg, exp_avg_sq for Adam;
//    momentum_buffer for SGD) and `optimizer.state.fp32_param.<model key>` for the fp32 master copies of
//    bf16/fp16 params, each sharded exactly as the model tensor; in common.pt the torch optimizer's
//    {'state': {'common_step': step}, 'param_groups': [...]} (under 'optimizer' with the float16 one, with
//    its 'grad_scaler');
//  - the distributed optimizer: common.pt {'optimizer': {'param_groups': [... 'step' ...]}, 'grad_scaler',
//    'param_state_sharding_type'} and, for the model-space layouts, the same keys
//    (`fully_sharded_model_space`, the default of core_v0.12's --ckpt-fully-parallel-save: each DP rank's
//    flattened range of every parameter, which Megatron's torch_dist writer stores as an N-D flattened
//    tensor of global shape [X / x, Y / y, ..., x * y * ...] for a model tensor [X, Y, ...] of local
//    shape [x, y, ...]; `fully_reshardable`: whole tensors, the master copies under
//    `optimizer.state.param.<key>`).
//  - the distributed optimizer's bucket-space layouts `dp_reshardable` (Megatron main's default without
//    --dist-ckpt-optim-fully-reshardable: one tensor per data-parallel bucket) and `dp_zero_gather_scatter`
//    (the buffers gathered into one object), the param groups as objects; cut into parameters by
//    megatron_bucket_optimizer.h, which rebuilds each model-parallel rank's buffer layout of the saving run
//    (at any TP x PP with the even pipeline split).
//  - Megatron main's --optimizer lion without the distributed optimizer: a ChainedOptimizer [Lion, AdamW] (Lion
//    for the 2-D parameters but the word embedding and output layer) whose tensors keep the plain names above
//    (Lion's exp_avg; AdamW's exp_avg and exp_avg_sq) and whose common.pt 'optimizer' is {0: Lion's, 1: AdamW's}
//    (the step: AdamW's common_step; Lion keeps none); type "lion".
//  - Megatron main's ChainedOptimizer of the dense parameters' optimizer and, with MoE, the expert parameters' one
//    (over the expert-data-parallel group): common.pt's 'optimizer' is {0: dense, 1: experts}, each as above, with one
//    param_state_sharding_type and steps that agree; in the model-space and non-distributed layouts the tensors keep
//    the plain names (chained_optim_avoid_prefix), the experts' as the stacked global expert keys.
// The result holds every state as global tensors of the model key's shape, the master copies under
// "fp32_param", whatever layout saved them. Refused with an error naming the layout and --no-load-optim:
// fully_sharded_bucket_space (core_v0.12: no fixture from Megatron's writer yet), the limits of
// megatron_bucket_optimizer.h, chained optimizers in the bucket-space layouts (chained_<i>.optimizer.distributed.*:
// Unimplemented) or whose layouts differ (DataLoss), --optimizer lion's distributed-optimizer form (Unimplemented;
// Megatron main never saves Lion through its DistributedOptimizer: validate_args turns --use-distributed-optimizer
// with --optimizer lion into the layer-wise distributed optimizer, whose chained layout Gale does not read), a
// checkpoint without optimizer state (FailedPrecondition) and steps that differ between param groups or chained
// optimizers.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/dcp_reader.h"
#include "ckpt/pickle.h"
#include "core/status.h"
#include "core/tensor.h"

namespace gale {

struct MegatronOptimizerState {
  std::string layout;  // "fully_sharded_model_space", "fully_reshardable", "dp_reshardable",
                       // "dp_zero_gather_scatter" or "non-distributed"
  std::string type;    // Megatron's args.optimizer ("adam", "sgd", "lion"); without it, what the state names say
  int64_t step = 0;    // optimizer steps taken (torch's Adam step; 0 when not recorded, e.g. SGD)
  nlohmann::json scheduler;    // opt_param_scheduler's state dict (max_lr, num_steps, ...)
  nlohmann::json grad_scaler;  // {"scale", "growth_tracker", "hysteresis_tracker"} when saved (--fp16), else null
  bool fp32_masters = false;   // set by read_megatron_checkpoint when the master copies became the weights
  // state ("exp_avg", "exp_avg_sq", "momentum_buffer", "fp32_param") -> tensor name -> global tensor
  std::map<std::string, std::map<std::string, Tensor>> tensors;
};

// The optimizer state of the torch_dist iteration directory `dir`: `c` its DCP index, `common` common.pt's
// dict, `args` Megatron's args Namespace (for args.optimizer). Tensors are keyed by Megatron's sharded
// model keys (stacked layers as saved).
StatusOr<MegatronOptimizerState> read_megatron_dist_optimizer(const DcpCheckpoint& c, const PyValue& common,
                                                              const PyValue* args, const std::string& dir);

// A dict of Python scalars (opt_param_scheduler, grad_scaler; one-element tensors as numbers) as a JSON object.
nlohmann::json megatron_scalars_json(const PyValue& d);

// The optimizer steps taken recorded in torch's optimizer state dict `inner` (state['common_step'], or each param
// group's 'step'); Unimplemented naming `where` when they differ, 0 when none is recorded.
StatusOr<int64_t> megatron_optimizer_step(const PyValue& inner, const std::string& where);

// The model-space tensor of global shape `global` from its N-D flattened form `flat` (shape [F_0, ..., F_{n-1},
// N] with F_d dividing global[d] and N the product of global[d] / F_d): each row of N elements is the local
// block at offsets f * (global / F), row-major. `what` names the tensor in errors.
StatusOr<Tensor> unflatten_model_space(const Tensor& flat, const Shape& global, const std::string& what);

}  // namespace gale
