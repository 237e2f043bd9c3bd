// DeepSeek-V3.2 (Hugging Face's DeepseekV32ForCausalLM, model_type deepseek_v32) <-> Gale's DeepSeek sparse attention.
//
// DeepSeek-V3.2-Exp is DeepSeek-V3 (train/hf_config.h read_deepseek_v3: MLA with a query latent,
// DeepSeek's MoE) plus a lightning indexer in every layer's attention, which Gale builds with
// --experimental-attention-variant dsa (model/dsa_indexer.h). config.json's index_n_heads,
// index_head_dim and index_topk are --dsa-indexer-n-heads, --dsa-indexer-head-dim and
// --dsa-indexer-topk; the indexer's tensors map row for row:
//   model.layers.i.self_attn.indexer.wq_b.weight          [NI·DI, Cq]  <-> decoder.layers.i.self_attention.indexer.linear_wq_b.weight
//   model.layers.i.self_attn.indexer.wk.weight            [DI, H]      <-> ...indexer.linear_wk.weight
//   model.layers.i.self_attn.indexer.k_norm.{weight,bias} [DI]         <-> ...indexer.k_norm.{weight,bias}
//   model.layers.i.self_attn.indexer.weights_proj.weight  [NI, H]      <-> ...indexer.linear_weights_proj.weight
// Both sides keep each indexer head's rotary dims first, rotated in the rotate-half (non-interleaved)
// layout, while MLA's q_pe / k_pe stay in DeepSeek's interleaved layout; both scale the head weights
// by NI^-1/2 · DI^-1/2 and score Σ_h w_h · ReLU(q_h · k).
//
// Where DeepSeek's reference differs from Megatron-Core's DSA (which Gale implements):
//  - DeepSeek's inference code rotates q and k by a Hadamard transform (orthonormal, scale DI^-1/2)
//    and quantises both to fp8 (blocks of 128, one scale each) before scoring. The rotation leaves
//    every q·k unchanged; the fp8 rounding does not, so Gale's fp32 scores can pick other keys than
//    the fp8 kernel where two keys' scores are within its rounding (transformers' DeepseekV32 skips
//    both as Gale does). Weights are the same either way; nothing to refuse.
//  - k_norm is a LayerNorm with eps 1e-6 fixed in DeepSeek's and transformers' code; Gale's uses the
//    model's --norm-epsilon (rms_norm_eps): a config with another rms_norm_eps is refused, as is a
//    Gale model with another --norm-epsilon on export.
//  - quantised (fp8) checkpoints (quantization_config, weight_scale_inv) are refused by the
//    DeepSeek-V3 reader: dequantize them to bf16 first.
//  - the multi-token-prediction layers (num_nextn_predict_layers) carry an indexer too; Gale does
//    not convert them with DSA yet: refused (pass --mtp-num-layers 0 to leave them out).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/arguments.h"
#include "train/hf_config.h"

namespace gale {

inline constexpr const char* kDeepseekV32Name = "DeepseekV32ForCausalLM";

// Whether a Gale model converts as DeepseekV32ForCausalLM (an MLA model with the DSA indexer).
inline bool hf_is_deepseek_v32(const ModelArgs& m) { return m.experimental_attention_variant == "dsa"; }

// config.json's indexer keys (index_n_heads, index_head_dim, index_topk; transformers' defaults 64,
// 128, 2048) into out.model after read_deepseek_v3 filled the rest. Errors name `path` and the key.
Status read_deepseek_v32_indexer(const nlohmann::json& config, const std::string& path, HfModel& out);

// Whether the DSA model `m` (already DeepSeek-V3-shaped) can be written as DeepseekV32ForCausalLM.
Status deepseek_v32_from_args(const ModelArgs& m, const std::string& where);

// The keys DeepseekV32ForCausalLM adds to DeepSeek-V3's config.json (and its names).
void add_deepseek_v32_config(const ModelArgs& m, nlohmann::json* out);

// The indexer's tensors of one layer: HF's name (after "model.layers.i."), Gale's (after
// "decoder.layers.i."), and the shape.
struct IndexerPair {
  std::string hf, gale;
  std::vector<int64_t> shape;
};
std::vector<IndexerPair> deepseek_v32_indexer_pairs(const ModelArgs& m);

// Refuses a DSA model with multi-token-prediction layers in a conversion (`mtp_layers` > 0).
Status refuse_deepseek_v32_mtp(const ModelArgs& m, int64_t mtp_layers, const std::string& where);

}  // namespace gale
