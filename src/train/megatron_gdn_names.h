// Gated DeltaNet (-2) layers in Megatron's legacy `torch` checkpoints: their names and how TP splits each tensor.
//
// Megatron-Core's GatedDeltaNet / GatedDeltaNet2 (megatron/core/ssm/gated_delta_net/) hold, per GDN
// layer, under self_attention.: in_proj.weight (Transformer Engine's fused layer-norm linear, whose
// in_proj.layer_norm_weight [/ _bias] is the layer's pre-norm), conv1d.weight [C, 1, K], dt_bias, A_log,
// out_norm.weight [DV], out_proj.weight. The model's other layers are Transformer Engine's
// (linear_qkv.layer_norm_weight, mlp.linear_fc1.layer_norm_weight): a GDN model keeps those names,
// which are Gale's too (model/transformer_layer.cc).
// Tensor parallelism (Megatron's GatedDeltaNet at TP > 1): in_proj is column-parallel with each of
// its sections split on its own, so TP rank r's in_proj.weight is the row concatenation
// [q_r | k_r | v_r | z_r | β_r | α_r] (GDN2: [q_r | k_r | v_r | z_r | f_r | b_r | w_r]) of rank r's
// 1/TP of each section, and the whole tensor is [q | k | v | z | β | α] (Gale's layout,
// model/gated_delta_net.h; torch_dist saves the sections as separate keys in_proj.weight.query, ...:
// train/megatron_gdn_dist.h joins them);
// conv1d.weight splits q | k | v the same way; dt_bias and A_log are split contiguously (partition_dim
// 0: value heads, or GDN2's key channels / key heads); out_proj is row-parallel (columns); out_norm and
// the fused norms are replicated. Gale's conv1d.weight is [C, K] (Megatron's without its unit dimension).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/pickle.h"
#include "core/status.h"
#include "core/tensor.h"
#include "train/arguments.h"

namespace gale {

// The sizes of a GDN model's mixers as the checkpoint's args record them (Megatron's
// linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim,
// linear_conv_kernel_dim; GDN2 when experimental_attention_variant is "gdn2").
struct MegatronGdnSizes {
  int64_t NK = 0, NV = 0, DK = 0, DV = 0, K = 0;
  bool gdn2 = false;
  int64_t qk_dim() const { return NK * DK; }
  int64_t v_dim() const { return NV * DV; }
  // in_proj's sections (whole model) in order: q, k, v, z, then β, α (GDN) or f, b, w (GDN2).
  std::vector<int64_t> in_proj_sections() const;
  // conv1d's: q, k, v.
  std::vector<int64_t> conv_sections() const { return {qk_dim(), qk_dim(), v_dim()}; }
};

// nullopt unless args' experimental_attention_variant is "gdn" or "gdn2" in a non-hybrid model; a
// missing size is DataLoss naming `where` and the key.
StatusOr<std::optional<MegatronGdnSizes>> megatron_gdn_sizes(const nlohmann::json& args, const std::string& where);

// Whether the layer-relative name `rest` is a tensor of a GDN model's layers that the dense GPT
// names do not cover: the GDN mixer's, and the fused norms of Transformer Engine's spec.
bool megatron_gdn_tensor(const std::string& rest);

// Whether `rest` is a GDN mixer tensor whose TP layout megatron_gdn_merge_tp / cut_tp handle (the
// mixer's own tensors; the fused norms are replicated and go through megatron_tp_split.h).
bool megatron_gdn_mixer_tensor(const std::string& rest);

// The whole tensor of `rest` (a GDN mixer tensor) from TP rank t's pieces parts[t]; conv1d.weight
// comes back as [C, K]. Errors (DataLoss naming `where`): pieces of different shapes, a piece whose
// rows are not the sections' 1/TP.
StatusOr<Tensor> megatron_gdn_merge_tp(const std::string& rest, const std::vector<Tensor>& parts,
                                       const MegatronGdnSizes& s, const std::string& where);

// TP rank t's piece (of `tp`) of the whole tensor `whole` of `rest` (conv1d.weight [C, K] becomes
// Megatron's [C/TP, 1, K]). InvalidArgument when tp does not divide the heads.
StatusOr<Tensor> megatron_gdn_cut_tp(const std::string& rest, const Tensor& whole, const MegatronGdnSizes& s,
                                     int64_t tp, int64_t t);

// The sizes of a GDN model's ModelArgs (nullopt: not a non-hybrid GDN model).
std::optional<MegatronGdnSizes> megatron_gdn_sizes_of(const ModelArgs& m);

// The linears of a GDN layer whose `_extra_state` Megatron saves: self_attention.in_proj and out_proj.
std::vector<std::string> megatron_gdn_linears();

// The GDN args Megatron's GPT model records (experimental_attention_variant, linear_attention_freq as
// the per-layer list, the five sizes), and transformer_impl "transformer_engine" (Megatron builds
// GDN with Transformer Engine's spec only).
void megatron_gdn_args(const ModelArgs& m, PyValue& ns);

// refuse_variant_conversion (train/checkpoint_args.h) for Megatron's formats: Ok for a Gated
// DeltaNet (-2) GPT model, which Megatron's torch format reads and writes; its refusals otherwise
// (a hybrid model's 'G' layers, DeepSeek sparse attention).
Status refuse_megatron_variant(const ModelArgs& m, const std::string& where);

}  // namespace gale
