// Hugging Face config.json <-> Megatron model flags, for the architectures `gale convert` handles (docs/formats/hf-conversion.md).
//
//   GPT2LMHeadModel     LayerNorm, GeLU MLP, learned absolute positions, linear biases, tied output
//   LlamaForCausalLM    RMSNorm, SwiGLU, RoPE (rotate-half), no biases, GQA, tied or untied output
//   Qwen2ForCausalLM    LLaMA + QKV bias (Megatron's --add-qkv-bias)
//   MistralForCausalLM  LLaMA + sliding_window W -> --sliding-window W (none when null or at least
//                       max_position_embeddings; absent: 4096, transformers' default); a LLaMA-shaped model with --sliding-window is
//                       written as Mistral. Qwen2 / Qwen2-MoE / Qwen3: use_sliding_window with
//                       sliding_window W in the layers i >= max_window_layers, or those layer_types names
//                       "sliding_attention": in every layer -> --sliding-window W (written back with
//                       max_window_layers 0); in only some layers of a Qwen2 / Qwen3 -> --sliding-window W
//                       --window-attn-skip-freq as a list (1: windowed), written back as layer_types and
//                       max_window_layers (the leading full layers); Qwen2-MoE's partial windows are refused.
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
//   Qwen3MoeForCausalLM Qwen3's attention (q_norm/k_norm: --qk-layernorm, head_dim -> --kv-channels, no
//                       biases) with Qwen2-MoE's sparse layers without the shared expert: num_experts (or
//                       num_local_experts, as transformers 5.x writes it) -> --num-experts, num_experts_per_tok
//                       -> --moe-router-topk, moe_intermediate_size -> --moe-ffn-hidden-size,
//                       intermediate_size -> --ffn-hidden-size (the dense layers), decoder_sparse_step /
//                       mlp_only_layers -> --moe-layer-freq as a list, norm_topk_prob as Qwen2-MoE's,
//                       router_aux_loss_coef -> --moe-aux-loss-coeff. use_sliding_window true is refused.
//                       A --qk-layernorm MoE model without a shared expert is written as Qwen3-MoE.
//   Qwen3NextForCausalLM Gated DeltaNet layers (--experimental-attention-variant gdn,
//                       layer_types / full_attention_interval -> --linear-attention-freq as a list,
//                       linear_* sizes -> --linear-*) and gated full attention (--attention-output-gate,
//                       --qk-layernorm, partial_rotary_factor -> --rotary-percent), zero-centred RMSNorms
//                       (--apply-layernorm-1p), and Qwen2-MoE's sparse layers (gated shared expert).
//                       No linear_attention layer: gated attention alone (--attention-output-gate without
//                       an attention variant); num_experts 0 or no sparse layer: every MLP dense. A Gated
//                       DeltaNet or --attention-output-gate model is written as Qwen3-Next only with all of
//                       these, and MoE (if any) with a gated shared expert (qwen3_next_from_args);
//                       rope_theta and partial_rotary_factor are written in rope_parameters (transformers 5.x).
//   DeepseekV3ForCausalLM multi-latent attention (--multi-latent-attention --qk-layernorm): q_lora_rank
//                       (null, a direct query projection, is refused: transformers does not norm its input,
//                       Megatron's --qk-layernorm does), kv_lora_rank, qk_nope_head_dim -> --qk-head-dim,
//                       qk_rope_head_dim -> --qk-pos-emb-head-dim, v_head_dim; rope_scaling yarn ->
//                       --rotary-scaling-factor / --mscale / --mscale-all-dim (only Gale's fixed YaRN
//                       constants: original_max_position_embeddings 4096, beta_fast 32, beta_slow 1, factor
//                       = max_position_embeddings / 4096); rope_interleave must be true. Layers from
//                       first_k_dense_replace on (--moe-layer-freq as a list) have n_routed_experts
//                       sigmoid-scored experts (--moe-router-score-function sigmoid), chosen on score +
//                       e_score_correction_bias (--moe-router-enable-expert-bias), group-limited when
//                       topk_group < n_group (--moe-router-num-groups / --moe-router-group-topk; HF's group
//                       score is the sum of its 2 best, Megatron's of its k / topk_group best, so
//                       num_experts_per_tok must be 2 x topk_group), scaled by routed_scaling_factor
//                       (--moe-router-topk-scaling-factor), renormalised over the k (norm_topk_prob must be
//                       true when k > 1, false when k = 1), and n_shared_experts x moe_intermediate_size ->
//                       --moe-shared-expert-intermediate-size (no gate); num_nextn_predict_layers D > 0 ->
//                       --mtp-num-layers D (multi-token prediction, train/hf_weights.h). first_k_dense_replace
//                       (default 3) >= num_hidden_layers: a dense MLA model (no expert keys read or written;
//                       with MTP layers refused). Refused:
//                       attention_bias, quantization_config, scoring_func other than sigmoid, topk_method
//                       other than noaux_tc.
//
//   GptOssForCausalLM   gpt-oss: GQA attention with q/k/v/o biases (attention_bias must be true) and one
//                       learned sink logit per head (--add-bias-linear, --softmax-type learnable), head_dim
//                       -> --kv-channels, layer_types -> --sliding-window sliding_window with
//                       --window-attn-skip-freq as a list (1: sliding_attention) when full and sliding
//                       layers mix (all sliding: no skip list; all full: no window), rope_scaling as the
//                       LLaMA family's (gpt-oss's yarn with truncate false), RMSNorm, and in every layer
//                       num_local_experts experts (--num-experts, --moe-router-topk num_experts_per_tok,
//                       --moe-ffn-hidden-size intermediate_size, --moe-aux-loss-coeff router_aux_loss_coef)
//                       routed by a router with a bias (Megatron's mlp.router.bias under --add-bias-linear):
//                       the top k of the logits, softmax over the k (Megatron's default), with gpt-oss's
//                       activation (--quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7;
//                       swiglu_limit must be 7, which transformers hard-codes). Refused: quantization_config
//                       (MXFP4 checkpoints: only bf16 / f32 safetensors are read).
//   InternLM2ForCausalLM InternLM2 / InternLM2.5 (trust_remote_code): LLaMA's block under InternLM2's names, its
//                       fused attention.wqkv already in Megatron's per-group [q heads; k; v] layout; "bias" must
//                       be false (absent: InternLM2Config's default true, refused: Megatron's biases cover the
//                       MLP too). rope_scaling {"type": "linear", "factor": F} -> --rotary-seq-len-interpolation-factor
//                       F; {"type": "dynamic", "factor": F} (dynamic NTK) changes nothing up to
//                       max_position_embeddings P and is read as plain RoPE at --seq-length P, with a warning, and
//                       written back from the checkpoint's hf_source; anything else is refused.
//   Phi3ForCausalLM     Phi-3 / Phi-3.5-mini: LLaMA's block with fused self_attn.qkv_proj [q; k; v] and
//                       mlp.gate_up_proj [gate; up]; sliding_window W -> --sliding-window W as Mistral's (none
//                       when null or at least max_position_embeddings); partial_rotary_factor must be 1;
//                       rope_scaling null, or longrope / su -> --rope-scaling-type longrope with --short-factor /
//                       --long-factor, --rope-scaling-original-max-position-embeddings (rope_scaling's or the
//                       top-level original_max_position_embeddings) and attention_factor as both mscales
//                       (model/longrope_rope.h); written back as Phi-3.5 spells it. A Gale LongRoPE model is
//                       written only as Phi3ForCausalLM (hf_model_from_args).
//   BaichuanForCausalLM Baichuan2-7B (trust_remote_code): LLaMA's multi-head block with the fused
//                       self_attn.W_pack [q; k; v]; RoPE base 10000 (no rope_theta key; another rope_theta is
//                       refused); lm_head is a NormHead (each vocabulary row divided by its L2 norm in the forward):
//                       normalised once at conversion, as Baichuan's NormHead does in eval mode, so Gale trains a
//                       plain --untie-embeddings-and-output-weights head from there. Baichuan2-13B's form (ALiBi,
//                       model_max_length without max_position_embeddings) and z_loss_weight != 0 are refused.
//   ChatGLMModel        ChatGLM3-6B / GLM-4-9B-chat in the THUDM (trust_remote_code) format, also named
//                       ChatGLMForConditionalGeneration (written back as ChatGLMModel): num_layers, ffn_hidden_size,
//                       kv_channels -> --kv-channels, multi_query_group_num -> --num-query-groups (when
//                       multi_query_attention), padded_vocab_size (the vocabulary), seq_length, layernorm_epsilon,
//                       add_qkv_bias -> --add-qkv-bias; RoPE on the first half of each head in interleaved pairs
//                       is --rotary-percent 0.5 --rotary-interleaved (MindSpeed-LLM's --use-glm-rope
//                       --rotary-percent 0.5), rope_ratio R -> --rotary-base 10000·R. Required: rmsnorm true,
//                       add_bias_linear false, post_layer_norm true, apply_residual_connection_post_layernorm
//                       false, original_rope true, pre_seq_len null. A Gale model with --rotary-interleaved
//                       --rotary-percent 0.5 (RMSNorm, SwiGLU, untied, no other biases) is written as ChatGLMModel.
// A Gale checkpoint converted from InternLM2, Phi-3 or Baichuan records that in its hf_source section and is written
// back in the same architecture when its flags still fit it (hf_keep_source_architecture).
//   GemmaForCausalLM    Gemma (v1): LLaMA's layout and weight names (GQA / MQA, RoPE, no biases, head_dim ->
//                       --kv-channels) with MindSpeed-LLM's Gemma flags: GemmaRMSNorm's x·(1 + w) is
//                       --add-rmsnorm-offset (the weights copied as stored), the embedding normalizer
//                       √hidden_size is --input-embeds-norm, and the GeGLU MLP is --gelu-tanh
//                       (hidden_activation, else hidden_act: gelu_pytorch_tanh or gelu_new; transformers'
//                       default) or --geglu ("gelu", the exact GeLU). tie_word_embeddings defaults to true.
//                       A model with these flags (and no other Gale-only feature) is written as Gemma.
//   Gemma2ForCausalLM   Gemma-2: Gemma's flags and names plus its sandwich norms (--post-norm; weights in
//                       hf_weights.h), query_pre_attn_scalar -> --query-pre-attn-scalar (written back as
//                       head_dim when unset), attn_logit_softcapping / final_logit_softcapping ->
//                       --attn-logit-softcapping / --output-logit-softcapping (null: none; absent: 50 / 30,
//                       Gemma2Config's defaults), sliding_window W (absent: 4096) in the layers layer_types
//                       names "sliding_attention" (absent: the even layers 0, 2, ..., as every transformers
//                       release windows them; MindSpeed-LLM's --interleave-sliding-window) -> --sliding-window
//                       W --window-attn-skip-freq as a list (every layer: no list); W >= max_position_embeddings
//                       is no window (written so when the Gale model has none). hidden_activation alone picks
//                       the GeLU (Gemma2MLP ignores hidden_act; absent: gelu_pytorch_tanh), head_dim defaults to
//                       256. Refused: rope_scaling (transformers 4.x's Gemma-2 ignores it, 5.x applies it),
//                       use_bidirectional_attention, a non-integer query_pre_attn_scalar. A model with
//                       --post-norm, soft-capping or --query-pre-attn-scalar is written as Gemma-2 only.
//   Gemma3ForCausalLM   Gemma-3's text model (model_type gemma3_text): Gemma-2's reading (train/hf_gemma2.h)
//                       with q_norm / k_norm (--qk-layernorm, 1 + w like every Gemma norm), null soft-caps by
//                       default and the sliding layers from layer_types, else sliding_window_pattern P
//                       (default 6: layer i full iff (i + 1) % P == 0). Only where it maps onto one RoPE:
//                       rope_local_base_freq (the sliding layers' base) must equal rope_theta and rope_scaling
//                       (the full layers' only) must be null; both are refused otherwise. A --post-norm model
//                       with --qk-layernorm is written as Gemma-3.
//
// Anything else in config.json that changes the model (rope_scaling, attention_bias, another
// hidden_act, a per-layer sliding window, ...) is refused with one line naming the file and the key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/arguments.h"

namespace gale {

enum class HfArchitecture {
  kGpt2, kLlama, kQwen2, kMistral, kMixtral, kQwen2Moe, kDeepseekV3, kQwen3, kBloom, kQwen3Moe, kQwen3Next, kGptOss,
  kInternLM2, kPhi3,
  kGemma, kGemma2, kGemma3,
  kBaichuan, kChatGLM
};

// "GPT2LMHeadModel", "LlamaForCausalLM", ...
const char* hf_architecture_name(HfArchitecture a);

// One model in both vocabularies: the HF architecture and the Megatron flags that build it in Gale.
struct HfModel {
  HfArchitecture arch = HfArchitecture::kLlama;
  // Validated Megatron model flags: num_kv_heads, kv_channels, ffn_hidden_size, seq_length
  // (= max_position_embeddings) and padded_vocab_size all set.
  ModelArgs model;
  // Mixtral's / Qwen2-MoE's / Qwen3-MoE's / Qwen3-Next's / DeepSeek-V3's experts (layer_pattern set); disabled for
  // dense models
  MoeArgs moe;
  int64_t vocab_size = 0;               // HF's vocab_size: the rows that are real tokens
  int64_t target_tensor_parallel = 1;   // the TP size the padding was computed for
  std::string torch_dtype;              // config.json's torch_dtype, "" when absent
  // DeepSeek-V3's multi-token prediction: the MTP layers converted (model.layers.{L + k} <-> mtp.layers.{k},
  // k < mtp_layers; model.mtp_num_layers agrees), and those config.json declares (import only; the
  // files' layers from L + mtp_layers on are left out).
  int64_t mtp_layers = 0;
  int64_t mtp_layers_in_files = 0;
  std::vector<std::string> warnings;    // accepted differences, printed by the caller
  // InternLM2's rope_scaling {"type": "dynamic", ...} as config.json gave it (read as plain RoPE); null otherwise.
  nlohmann::json internlm2_dynamic_rope;
};

// Reads an HF config (the parsed config.json at `path`) and pads the vocabulary as Megatron does:
// a multiple of divisible_by x tensor_parallel. Errors name `path` and the key.
StatusOr<HfModel> hf_model_from_config(const nlohmann::json& config, const std::string& path, int64_t divisible_by,
                                       int64_t tensor_parallel);

// The HF architecture of a Gale model (from its Megatron flags), `vocab_size` real rows. Unimplemented
// for models no supported HF architecture describes (e.g. LayerNorm with RoPE, or experts in only some
// layers, or an MLA model that is not DeepSeek-V3-shaped, or MTP layers in anything but DeepSeek-V3);
// `where` names the checkpoint.
StatusOr<HfModel> hf_model_from_args(const ModelArgs& m, const MoeArgs& moe, int64_t vocab_size,
                                     const std::string& where);

// A checkpoint converted from InternLM2ForCausalLM, Phi3ForCausalLM or BaichuanForCausalLM (`hf_source`: its
// "hf_source" section, {"architecture", "rope_scaling"}) is written back as that architecture when `m` (from
// hf_model_from_args) is a LLaMA (InternLM2: plain or linear-interpolated RoPE) or Mistral (Phi-3) with head_dim =
// hidden / heads and no RoPE scaling Phi-3 lacks, or (Baichuan) an untied multi-head LLaMA with --rotary-base 10000
// and no RoPE scaling. Returns a line for the log when the recorded architecture cannot hold the model (it is then
// written as m->arch), else "".
std::string hf_keep_source_architecture(HfModel* m, const nlohmann::json& hf_source);

// The config.json transformers reads for `m` ("torch_dtype" = `torch_dtype`, e.g. "float32").
nlohmann::json hf_config_json(const HfModel& m, const std::string& torch_dtype);

}  // namespace gale
