// Megatron's optimizer state in a legacy `torch`-format checkpoint (--ckpt-format torch), read back in model space.
//
//   GALE_ASSIGN_OR_RETURN(MegatronOptimizerState o, read_megatron_torch_optimizer(files, roots, name_of, swiglu));
//   o.tensors["exp_avg"]["decoder.layers.3.mlp.linear_fc1.weight"]   // Gale's name, the TP pieces merged
//
// Each model-parallel rank's iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt holds, next to its 'model', the state
// dict of its own optimizer (megatron/training/checkpointing.py saves optimizer.state_dict() and
// opt_param_scheduler.state_dict() there):
//  - the non-distributed optimizers: FP32Optimizer's is torch's optimizer state dict {'state': {param index:
//    {'step', 'exp_avg', 'exp_avg_sq'} (Adam) or {'momentum_buffer'} (SGD)}, 'param_groups': [{'params': [param
//    indices], 'wd_mult', 'step' (apex / TE FusedAdam), ...}]}; Float16OptimizerWithFloat16Params's (--bf16,
//    --fp16) is {'optimizer': that dict over the fp32 master copies, 'grad_scaler' (--fp16), 'fp32_from_fp16_params':
//    the master copies, one list per param group}. The parameter indices count through the param groups in their
//    order, each group's parameters in the rank's model.parameters() order (megatron_bucket_optimizer.h's
//    megatron_parameter_order over the rank's own tensors); Megatron's param groups are one with weight decay
//    (wd_mult 1) and one without (wd_mult 0: biases and 1-D tensors, q/k_layernorm excepted with
//    apply_wd_to_qk_layernorm), in an order that differs between releases (main: decayed first; core_v0.12: the group
//    of the rank's first parameter first), so each saved group is matched by its wd_mult;
//  - the distributed optimizer (args.use_distributed_optimizer): DistributedOptimizer.state_dict() ({'optimizer':
//    {'param_groups' without params, each with the 'step'}, 'grad_scaler'}) and, written by data-parallel rank 0 in the
//    same directory, distrib_optim.pt = get_parameter_state_dp_zero() (its save_parameter_state: the rank's buffers
//    gathered over DP, bucket padding stripped, {'buckets_coalesced': True, 0: {(param dtype, grad dtype): {'param',
//    'exp_avg', 'exp_avg_sq', 'numel_unpadded'}}}), cut into parameters by the buffer layout
//    megatron_bucket_layout rebuilds from the saved args (layout "dp_zero_gather_scatter").
// Every rank's pieces are checked against its model tensors (shapes; the fp32 master copies, rounded to the weights'
// dtype, must be the saved weights), merged over tensor parallelism and numbered with the stage's global layers, so
// the result does not depend on the saving run's TP, PP or DP (any data-parallel size can resume it). Tied embeddings
// at PP > 1: the last stage's output_layer.weight copy must hold the embedding's state bit for bit (DataLoss else).
// The scheduler state is rank 0's opt_param_scheduler; the step must agree over ranks and param groups.
// Virtual pipeline chunks ('model0', 'model1', ... in every rank file): the optimizers' param groups walk the rank's
// chunks in order (Megatron's _get_param_groups over its model chunks), each chunk's parameters in its
// model.parameters() order (the embedding in rank 0's chunk 0, the final norm and output layer in the last rank's last
// chunk); chunk v of pipeline rank p holds virtual stage v * PP + p's layers, numbered globally chunk-major. The
// distributed optimizer's distrib_optim.pt holds a buffer per chunk (keys 0, 1, ...), only the first chunk bucketed
// (training.get_model disables bucketing for the others).
// Multi-latent attention (args.multi_latent_attention) at any TP, non-distributed or distributed: the parameter order is
// each rank file's saved state dict's own (torch's state_dict() and parameters() walk the modules in the same
// registration order), checked the same way; the caller renames the merged state to Gale's MLA names.
// MoE (args.num_experts) at any TP (expert TP = TP), PP (untied embeddings) and expert-parallel size (`experts`: the
// files by expert rank; the TP pieces merged as the weights', each stage's layers at their global numbers): the parameter
// order is each file's saved state dict's (the router's expert_bias / qb_beta buffers left out). At EP 1 Megatron's
// experts keep allreduce, so one optimizer holds every parameter (the file as a dense model's). At EP > 1 each expert
// rank's file holds ChainedOptimizer.state_dict()'s list [dense, expert] (the dense state read from expert rank 0's,
// the expert state over the file's local experts, param groups is_expert_parallel) and, with the distributed
// optimizer, distrib_optim.pt = ChainedOptimizer.save_parameter_state's list [dense or None, expert or None], each cut
// by its own buffer; every file's masters are checked against its weights, then the experts numbered globally
// (megatron_moe_names.h's globalize_megatron_experts, as the weights).
// Refused, naming --no-load-optim: a checkpoint without optimizer state (FailedPrecondition), rank files with different
// chunk counts, MoE with expert TP other than TP, tied embeddings at PP > 1,
// virtual pipeline chunks or without `experts` (torch_dcp), a dense model's ChainedOptimizer list, param groups other than the
// two of weight decay on / off (e.g. --decoupled-lr, lr multipliers), the distributed optimizer's older per-bucket
// distrib_optim.pt (no 'buckets_coalesced') (all Unimplemented); a missing distrib_optim.pt (NotFound); state that does
// not fit the rank's parameters (DataLoss naming the file, parameter, expected and found).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "ckpt/pickle.h"
#include "core/status.h"
#include "train/megatron_dist_optimizer.h"

namespace gale {

// The torch format's rank files of a MoE model as saved, by (tensor, pipeline, expert-parallel) rank: each holds its own
// experts (numbered from 0) and its own expert optimizer state.
struct MegatronExpertRankFiles {
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::string> files;
  std::map<std::tuple<int64_t, int64_t, int64_t>, PyRef> roots;
};

// `files` and `roots`: each (tensor rank, pipeline rank)'s model_optim_rng.pt path and state dict; `gale_name` maps a
// torch-format name with the stage's layer offset to Gale's; `swiglu`: linear_fc1 holds [gate; up] per TP rank;
// `experts`: a MoE model's files by expert-parallel rank too (needed when args.num_experts is set).
StatusOr<MegatronOptimizerState> read_megatron_torch_optimizer(
    const std::map<std::pair<int64_t, int64_t>, std::string>& files,
    const std::map<std::pair<int64_t, int64_t>, PyRef>& roots,
    const std::function<std::string(const std::string&, int64_t)>& gale_name, bool swiglu,
    const MegatronExpertRankFiles& experts = {});

}  // namespace gale
