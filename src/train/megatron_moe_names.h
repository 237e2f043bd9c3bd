// Megatron-Core's MoE layers in its checkpoints (docs/formats/megatron-checkpoint.md): names, layouts, expert-parallel files.
//
// Gale's MoE parameters carry Megatron's SequentialMLP names with global expert numbers
// (decoder.layers.i.mlp.experts.local_experts.<e>.linear_fc1.weight [2 Fe or Fe, H], linear_fc2.weight
// [H, Fe], mlp.router.weight [E, H], mlp.router.expert_bias [E], mlp.router.qb_beta [E] (Megatron main's
// quantile_balancing buffer, f32, replicated over TP), mlp.shared_experts.linear_fc1/fc2,
// mlp.shared_experts.gate_weight [1, H]). Megatron's files hold them in other layouts:
//  - legacy `torch` format, one file per (TP, PP, EP) rank, mp_rank_TT[_PPP][_EEE] (the _EEE part only
//    with expert parallelism, so mp_rank_TT_NNN is a pipeline rank or an expert rank as the args say);
//    each EP rank numbers its El = E / EP experts from 0:
//      SequentialMLP:        mlp.experts.local_experts.<j>.linear_fc1.weight ...
//      TEGroupedMLP:         mlp.experts.linear_fc1.weight<j> [rows, H], mlp.experts.linear_fc2.weight<j> [H, Fe]
//      GroupedMLP (--moe-grouped-gemm without Transformer Engine): mlp.experts.weight1 [H, El * rows]
//                            whose memory is [El, H, rows] and mlp.experts.weight2 [El * Fe, H] ([El, Fe, H])
//    the experts' fc1 and fc2 split over expert-TP ranks as the dense MLP's (SwiGLU halves per rank);
//  - `torch_dist`: global tensors mlp.experts.experts.linear_fc1.weight [E, rows, H] (after the layer
//    dimension is taken off), the same key for all three expert implementations.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "ckpt/pickle.h"
#include "core/status.h"
#include "train/arguments.h"
#include "train/megatron_dist_checkpoint.h"

namespace gale {

// Rewrites the expert entries of one state dict (a torch-format rank file's 'model', or torch_dist's
// global dict) in place to Gale's per-expert names with global expert numbers: local expert j of
// expert-parallel rank `ep_rank` is expert ep_rank * local_experts + j. Errors name `where` and the
// tensor: an expert index not below local_experts, a grouped tensor whose size does not split into
// local_experts experts, a torch_dist expert tensor whose leading dimension is not local_experts.
Status globalize_megatron_experts(PyValue& state_dict, int64_t ep_rank, int64_t local_experts, const std::string& where);

// Whether `rest` (a layer's tensor name after "decoder.layers.<i>.", experts globalized) is one of
// the MoE tensors Gale's model has.
bool megatron_moe_tensor(const std::string& rest);

// Megatron's args (JSON of the Namespace's scalars) with its MoE flags as Gale's checkpoint args
// spell them: moe_layer_freq (an int or a list in Megatron's Namespace `ns`) as Gale's string,
// moe_shared_expert_gate false when absent (Megatron has no flag for the gate). Unchanged for a
// dense model.
nlohmann::json megatron_moe_args_json(nlohmann::json args, const PyValue* ns);

// The MoE flags of Megatron's args (after megatron_moe_args_json); errors name `where` and the key.
StatusOr<MoeArgs> megatron_moe_args(const nlohmann::json& args, const std::string& where, int64_t num_layers);

// Every MoE layer of `moe.layer_pattern` (global layer numbers) in `tensors` (Gale's names) has exactly
// experts 0 .. num_experts - 1, each with its fc1 and fc2 weights, and a router; DataLoss naming
// `where`, the layer and the expert otherwise (a missing expert-parallel piece, an expert numbered
// past num_experts, experts in a dense layer).
Status check_megatron_experts(const std::map<std::string, Tensor>& tensors, const MoeArgs& moe, int64_t num_layers,
                              const std::string& where);

// The run's MoE flags against the checkpoint's (`saved`, from Megatron's args in `dir`) where
// Megatron's strict load_state_dict would fail: num_experts, --moe-ffn-hidden-size, the MoE layers
// (--moe-layer-freq), --moe-shared-expert-intermediate-size, --moe-router-enable-expert-bias (the
// expert_bias buffer) and quantile_balancing in --moe-router-load-balancing-type (Megatron main's
// persistent qb_beta buffer); FailedPrecondition naming the flag and both values. Routing rules (top-k,
// score function, ...) may differ, as in Megatron.
Status check_megatron_moe_run(const MoeArgs& saved, const MoeArgs& run, const std::string& dir);

// torch_dist's global state (and optimizer state) with its experts globalized (all E experts on
// "expert rank 0"), when its args have num_experts.
Status globalize_dist_experts(MegatronDistState& state, const std::string& where);

// The torch format's rank files keyed by (tensor, pipeline, expert) rank -> one state per (tensor,
// pipeline) rank: expert rank 0's dict with every expert rank's experts globalized into each of its
// model chunks ('model', 'model0', ...). `files` / `roots` come in keyed by the three ranks, `args`
// are the files' args (JSON of the Namespace's scalars); the merged ones replace them. Errors: a
// missing expert rank's file, num_experts not a multiple of the expert ranks, a rank file without
// the chunk rank 0 has; Unimplemented for a MoE checkpoint saved with expert_tensor_parallel_size
// other than tensor_model_parallel_size (its experts are not split as the dense layers).
Status merge_expert_rank_files(const std::map<std::tuple<int64_t, int64_t, int64_t>, std::string>& files,
                               const std::map<std::tuple<int64_t, int64_t, int64_t>, PyRef>& roots,
                               const nlohmann::json& args, std::map<std::pair<int64_t, int64_t>, std::string>* merged_files,
                               std::map<std::pair<int64_t, int64_t>, PyRef>* merged_roots);

// ---- writing Megatron's torch format (SequentialMLP names, --transformer-impl local) ----

// The MoE sizes against a target TP x EP layout (expert TP = TP): InvalidArgument naming
// --target-expert-parallel-size / --target-tensor-parallel-size when they do not divide the experts,
// moe_ffn_hidden_size or the shared expert's size; EP > 1 for a dense model; Unimplemented for a
// shared expert gate (Megatron-Core's shared experts have none) and input jitter.
Status check_megatron_moe_target(const MoeArgs& moe, int64_t tp, int64_t ep);

// Gale's expert tensor `name` (global layer and expert numbers) as expert-parallel rank *ep_rank's
// local name (expert g -> rank g / local_experts, local number g % local_experts); false for
// tensors that are not an expert's (every expert-parallel rank's file holds them).
bool megatron_local_expert(const std::string& name, int64_t local_experts, int64_t* ep_rank, std::string* local);

// The linear modules of a layer whose `_extra_state` (None) Megatron's local spec saves, relative to
// the layer: attention's, then the dense MLP's or (`moe_layer`) each local expert's and the shared expert's.
std::vector<std::string> megatron_extra_state_linears(const MoeArgs& moe, bool moe_layer, int64_t local_experts);

// Megatron's MoE args for the Namespace of a written checkpoint (nothing for a dense model):
// num_experts, moe_router_topk, moe_ffn_hidden_size, moe_layer_freq (an int, or the list of 0/1 per
// layer), the routing flags, moe_shared_expert_intermediate_size, moe_grouped_gemm False,
// expert_model_parallel_size `ep` and expert_tensor_parallel_size `tp`.
void add_megatron_moe_args(const MoeArgs& moe, int64_t tp, int64_t ep, PyValue& ns);

}  // namespace gale
