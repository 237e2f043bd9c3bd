// Hugging Face config.json <-> Megatron model flags, for the architectures `gale convert` handles (docs/formats/hf-conversion.md).
//
//   GPT2LMHeadModel     LayerNorm, GeLU MLP, learned absolute positions, linear biases, tied output
//   LlamaForCausalLM    RMSNorm, SwiGLU, RoPE (rotate-half), no biases, GQA, tied or untied output
//   Qwen2ForCausalLM    LLaMA + QKV bias (Megatron's --add-qkv-bias)
//   MistralForCausalLM  LLaMA, when sliding_window is null or covers max_position_embeddings
//   MixtralForCausalLM  Mistral with a SwiGLU mixture of experts in every layer: num_local_experts ->
//                       --num-experts, num_experts_per_tok -> --moe-router-topk, intermediate_size ->
//                       --moe-ffn-hidden-size (and --ffn-hidden-size). Mixtral's routing (softmax over
//                       all experts, top-k, renormalised over the k) is Megatron's default (top-k of the
//                       logits, softmax over the k); router_jitter_noise must be 0.
//   Qwen3ForCausalLM    LLaMA (no q/k/v bias; attention_bias must be false) + q_norm/k_norm: RMSNorm
//                       over head_dim on every query/key head before RoPE (--qk-layernorm); head_dim
//                       -> --kv-channels (it may differ from hidden_size / num_attention_heads)
//   Qwen2MoeForCausalLM Qwen2 (q/k/v biases: --add-qkv-bias) with a SwiGLU mixture of experts and a
//                       gated shared expert: num_experts -> --num-experts, num_experts_per_tok ->
//                       --moe-router-topk, moe_intermediate_size -> --moe-ffn-hidden-size,
//                       shared_expert_intermediate_size -> --moe-shared-expert-intermediate-size with
//                       --moe-shared-expert-gate, intermediate_size -> --ffn-hidden-size (the dense
//                       layers); the sparse layers (layer i is sparse when (i + 1) % decoder_sparse_step
//                       == 0 and i is not in mlp_only_layers) -> --moe-layer-freq as a list.
//                       norm_topk_prob false (softmax over all experts, top-k, not renormalised) is
//                       --moe-router-pre-softmax; true (renormalised over the k) is Megatron's default.
//
// Anything else in config.json that changes the model (rope_scaling, attention_bias, another
// hidden_act, an active sliding window, ...) is refused with one line naming the file and the key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/arguments.h"

namespace gale {

enum class HfArchitecture { kGpt2, kLlama, kQwen2, kMistral, kMixtral, kQwen2Moe, kQwen3 };

// "GPT2LMHeadModel", "LlamaForCausalLM", ...
const char* hf_architecture_name(HfArchitecture a);

// One model in both vocabularies: the HF architecture and the Megatron flags that build it in Gale.
struct HfModel {
  HfArchitecture arch = HfArchitecture::kLlama;
  // Validated Megatron model flags: num_kv_heads, kv_channels, ffn_hidden_size, seq_length
  // (= max_position_embeddings) and padded_vocab_size all set.
  ModelArgs model;
  MoeArgs moe;                          // Mixtral's / Qwen2-MoE's experts (layer_pattern set); disabled for dense models
  int64_t vocab_size = 0;               // HF's vocab_size: the rows that are real tokens
  int64_t target_tensor_parallel = 1;   // the TP size the padding was computed for
  std::string torch_dtype;              // config.json's torch_dtype, "" when absent
  std::vector<std::string> warnings;    // accepted differences, printed by the caller
};

// Reads an HF config (the parsed config.json at `path`) and pads the vocabulary as Megatron does:
// a multiple of divisible_by x tensor_parallel. Errors name `path` and the key.
StatusOr<HfModel> hf_model_from_config(const nlohmann::json& config, const std::string& path, int64_t divisible_by,
                                       int64_t tensor_parallel);

// The HF architecture of a Gale model (from its Megatron flags), `vocab_size` real rows. Unimplemented
// for models no supported HF architecture describes (e.g. LayerNorm with RoPE, or experts in only some
// layers); `where` names the checkpoint.
StatusOr<HfModel> hf_model_from_args(const ModelArgs& m, const MoeArgs& moe, int64_t vocab_size,
                                     const std::string& where);

// The config.json transformers reads for `m` ("torch_dtype" = `torch_dtype`, e.g. "float32").
nlohmann::json hf_config_json(const HfModel& m, const std::string& torch_dtype);

}  // namespace gale
