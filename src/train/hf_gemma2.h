// Gemma-2 / Gemma-3 text (Hugging Face's Gemma2ForCausalLM, Gemma3ForCausalLM): config.json keys beyond Gemma's, both ways.
//
// Gemma2ForCausalLM is Gemma (train/hf_config.h: --add-rmsnorm-offset, --input-embeds-norm, the GeGLU,
// head_dim, tied embeddings) with MindSpeed-LLM's Gemma-2 flags (train/arguments_gemma2.cc):
//   the four norms per layer                -> --post-norm (the weights: train/hf_weights.h)
//   query_pre_attn_scalar S (absent: 256)   -> --query-pre-attn-scalar S (a positive integer; scores · S^-1/2)
//   attn_logit_softcapping C (absent: 50)   -> --attn-logit-softcapping C (null: none)
//   final_logit_softcapping C (absent: 30)  -> --output-logit-softcapping C (null: none)
//   sliding_window W (absent: 4096)         -> --sliding-window W in the layers layer_types names
//                                              "sliding_attention"; absent layer_types: the even layers
//                                              0, 2, 4, ... (transformers' layer_idx % 2 == 0, MindSpeed-LLM's
//                                              --interleave-sliding-window: 1-based layers 1, 3, 5, ...) ->
//                                              --window-attn-skip-freq as the per-layer list (1: windowed);
//                                              no list when every layer is windowed. W >= max_position_embeddings
//                                              hides no key: no window.
// Both sides hide the keys j <= i - W from query i (transformers' tril(diagonal=-W), Megatron's
// --window-size (W - 1, 0)). Refused: rope_scaling (transformers 4.x's Gemma-2 ignores it, 5.x's
// applies it), use_bidirectional_attention true, sliding_window null, a query_pre_attn_scalar that is not
// a positive integer. transformers releases before layer_types window the even layers whatever
// layer_types says: a config whose layer_types differs from that is read as written, with a warning.
//
// Gemma3ForCausalLM (model_type gemma3_text) is read the same way with q_norm / k_norm (--qk-layernorm),
// soft-caps absent meaning none, and the default sliding layers from sliding_window_pattern P (absent: 6;
// layer i full iff (i + 1) % P == 0). Gale's RoPE is one base and one scaling for every layer:
// rope_local_base_freq (absent: 10000) must equal rope_theta and rope_scaling must be null, else refused.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "train/hf_config.h"

namespace gale {

// Gemma-2's (out.arch kGemma2) or Gemma-3's (kGemma3) own keys of `config` (path: for the messages) into
// out.model (post_norm set; qk_layernorm for Gemma-3), after the LLaMA-family reader has read the shared
// ones; warnings go to out.warnings.
Status read_gemma2_keys(const nlohmann::json& config, const std::string& path, HfModel& out);

// Gemma-2's keys for hf_config_json: query_pre_attn_scalar (--kv-channels when unset), the soft-caps
// (null when unset), sliding_window and layer_types (max_position_embeddings and the even layers
// when the model has no window), hidden_activation, attention_bias, cache_implementation; for Gemma-3
// also rope_local_base_freq (= rope_theta) and sliding_window_pattern when one period gives the layers.
void add_gemma2_config(const HfModel& hf, nlohmann::json* j);

}  // namespace gale
