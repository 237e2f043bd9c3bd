// Multi-latent attention in Megatron's checkpoints: Megatron-Core's MLA state-dict names <-> Gale's, and their TP layout.
//
// Megatron-Core's MLASelfAttention (megatron/core/transformer/multi_latent_attention.py) holds, per layer,
// under self_attention.:
//   linear_q_proj.weight        [NH·(Dn + R), H]    without a query latent (q_lora_rank None)
//   linear_q_down_proj.weight   [Cq, H]             with one
//   linear_q_up_proj.weight     [NH·(Dn + R), Cq]
//   linear_kv_down_proj.weight  [Ckv + R, H]
//   linear_kv_up_proj.weight    [NH·(Dn + Dv), Ckv]
//   linear_proj.weight          [H, NH·Dv]
// and with --qk-layernorm the latents' norms: the local spec's q_layernorm / kv_layernorm (.weight, and
// .bias with LayerNorm), which Transformer Engine's spec fuses into the up projections
// (linear_q_up_proj.layer_norm_weight, linear_kv_up_proj.layer_norm_weight); Gale's names are the
// fused ones (model/mla_attention.h). Without a query latent Megatron has no query norm.
// Tensor parallelism: linear_q_proj, linear_q_up_proj and linear_kv_up_proj are column-parallel (rows
// split over heads), linear_proj row-parallel (columns); the down projections are column-parallel
// in the local spec (rows split; core_v0.12.1's TE spec too) and duplicated (whole on every rank)
// in newer Transformer Engine specs and in DeepSeek sparse attention's spec; the norms are duplicated.
// DeepSeek sparse attention (--experimental-attention-variant dsa): Megatron-Core main's DSAttention
// is the MLA's core_attention and holds the lightning indexer, so Gale's self_attention.indexer.*
// (model/dsa_indexer.h) is Megatron's self_attention.core_attention.indexer.{linear_wq_b.weight,
// linear_wk.weight, k_norm.weight, k_norm.bias, linear_weights_proj.weight}, duplicated on every TP
// rank; its q_layernorm / kv_layernorm are unfused (the local names) in every backend. Its earlier
// AbsorbedMLASelfAttention saved linear_k_up_proj.weight [NH·Dn, Ckv] and linear_v_up_proj.weight
// [NH·Dv, Ckv] (column-parallel) instead of linear_kv_up_proj: read, they are combined per head. Megatron's fused down projection
// (--mla-down-proj-fusion: linear_qkv_down_proj.weight [Cq + Ckv + R, H], the row concatenation
// [q_down; kv_down], column-parallel with each rank's [q rows; kv rows], and the folded input norm
// linear_qkv_down_proj.layer_norm_weight / _bias) is read by splitting it back into Gale's (and
// Megatron's on-disk) unfused names; Gale writes the unfused names, which Megatron's fused model
// loads (it synthesizes the fused weight from them).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/pickle.h"
#include "core/status.h"
#include "core/tensor.h"
#include "train/arguments.h"

namespace gale {

// Whether the layer-relative name `rest` ("self_attention.linear_q_down_proj.weight", ...) is one of
// Megatron's MLA attention tensors (either spec's names), other than linear_proj.
bool megatron_mla_tensor(const std::string& rest);

// Whether `rest` is an MLA projection that the local spec makes column-parallel (TP splits its rows).
bool megatron_mla_column_parallel(const std::string& rest);

// The merged tensors of a Megatron MLA checkpoint (global layer numbers; `args` its args Namespace)
// under Gale's names: q_layernorm / kv_layernorm renamed to the fused names, and down projections
// that a duplicated spec saved whole on each of `tp` ranks (merged as tp stacked copies) cut back to
// one copy; a fused linear_qkv_down_proj split into the two down projections and its layer_norm_* into
// input_layernorm.*. Errors name `where`: a down projection of another size, copies that differ, and (Unimplemented)
// qk_layernorm without a query latent (Megatron norms the kv latent only; Gale's --qk-layernorm without
// --q-lora-rank also norms linear_q_proj's input).
Status megatron_mla_to_gale(const nlohmann::json& args, int64_t tp, const std::string& where,
                            std::map<std::string, Tensor>& tensors);

// The layer-relative name Megatron's local spec gives Gale's MLA tensor `rest` (the norms as
// q_layernorm / kv_layernorm; anything else unchanged). linear_q_proj.layer_norm_weight /
// layer_norm_bias (Gale's query norm without a query latent) has no Megatron counterpart: Unimplemented.
StatusOr<std::string> megatron_mla_local_name(const std::string& rest);

// The attention linears of a Megatron MLA layer (as "self_attention.linear_..."; their `_extra_state`
// entries are written next to the weights): linear_q_proj or linear_q_down_proj + linear_q_up_proj,
// linear_kv_down_proj, linear_kv_up_proj, linear_proj.
std::vector<std::string> megatron_mla_linears(const ModelArgs& model);

// Megatron's MLA flags of `model` into `ns`, the dict of an args Namespace (q_lora_rank None without a
// query latent; rope_type as later Megatron records it).
void megatron_mla_args(const ModelArgs& model, PyValue& ns);

// Whether Megatron keeps Gale's tensor `name` whole on every TP rank although the MLA spec splits
// it: DeepSeek sparse attention's spec (Megatron-Core main's get_dsa_module_spec_for_backend) builds
// linear_q_down_proj and linear_kv_down_proj as duplicated linears.
bool megatron_mla_duplicated(const ModelArgs& model, const std::string& name);

// The TP sizes Megatron's local spec needs of `model` (column-parallel down projections: the query
// latent and Ckv + R divisible by tp): InvalidArgument naming the flag otherwise.
Status check_megatron_mla_tp(const ModelArgs& model, int64_t tp);

}  // namespace gale
