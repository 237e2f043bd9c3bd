// Model sections of checkpoint metadata: ModelConfig/ModelArgs to JSON and back.
#include "train/checkpoint_args.h"

#include "train/megatron_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <tuple>
#include <type_traits>

#include "ckpt/checkpoint_reader.h"
#include "model/hybrid_layers.h"
#include "train/longrope_factors.h"

namespace gale {

nlohmann::json checkpoint_model_section(const ModelConfig& c) {
  nlohmann::json j = {{"num_layers", c.num_layers},
                      {"hidden_size", c.hidden},
                      {"ffn_hidden_size", c.ffn},
                      {"num_attention_heads", c.heads},
                      {"num_query_groups", c.kv_heads},
                      {"kv_channels", c.head_dim},
                      {"padded_vocab_size", c.vocab},
                      {"max_position_embeddings", c.max_positions},
                      {"normalization", c.rms_norm ? "RMSNorm" : "LayerNorm"},
                      {"swiglu", c.swiglu},
                      {"add_bias_linear", c.add_bias_linear},
                      {"add_qkv_bias", c.add_qkv_bias},
                      {"untie_embeddings_and_output_weights", !c.tied_embeddings},
                      {"position_embedding_type", c.position == PositionEmbedding::kRope   ? "rope"
                                                  : c.position == PositionEmbedding::kNone ? "none"
                                                  : c.position == PositionEmbedding::kAlibi ? "alibi"
                                                                                           : "learned_absolute"}};
  // Recorded only when set, so that checkpoints saved before these flags still load.
  if (c.openai_gelu && !c.geglu) j["openai_gelu"] = true;  // --gelu-tanh records only itself
  if (c.embed_layernorm) j["embed_layernorm"] = true;
  if (c.squared_relu) j["squared_relu"] = true;
  if (c.quick_geglu) j["quick_geglu"] = true;
  // MindSpeed-LLM's Gemma flags (train/arguments_gemma.cc).
  if (c.geglu) j[c.openai_gelu ? "gelu_tanh" : "geglu"] = true;
  if (c.rmsnorm_offset) j["add_rmsnorm_offset"] = true;
  if (c.input_embeds_scale != 1.0f) j["input_embeds_norm"] = true;
  if (c.glu_linear_offset != 0.0f) j["glu_linear_offset"] = c.glu_linear_offset;
  if (c.activation_clamp > 0.0f) j["activation_func_clamp_value"] = c.activation_clamp;
  if (c.norm_weight_1p) j["apply_layernorm_1p"] = true;
  if (c.rope_scaling_factor > 0.0) j["rope_scaling_factor"] = c.rope_scaling_factor;
  if (c.rope_position_scale != 1.0) j["rope_position_scale"] = c.rope_position_scale;
  if (c.rope_interleaved) j["rotary_interleaved"] = true;
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  if (c.sliding_window > 0 && !c.window_layers.empty()) j["window_layers"] = c.window_layers;  // --window-attn-skip-freq
  if (c.mla.enabled) j["multi_latent_attention"] = true;
  if (!c.no_rope_layers.empty()) j["no_rope_layers"] = c.no_rope_layers;  // --no-rope-freq
  if (c.attention_output_gate) j["attention_output_gate"] = true;
  if (c.qk_l2_norm) j["qk_l2_norm"] = true;
  // Gemma-2's flags (train/arguments_gemma2.cc), recorded only when set
  if (c.attn_logit_softcapping > 0.0f) j["attn_logit_softcapping"] = c.attn_logit_softcapping;
  if (c.output_logit_softcapping > 0.0f) j["output_logit_softcapping"] = c.output_logit_softcapping;
  if (c.query_pre_attn_scalar > 0) j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
  if (c.post_norm) j["post_norm"] = true;
  if (c.mhc.enabled)  // --enable-mhc-connections: the n-stream layers and their modules' sizes
    j["mhc"] = {{"num_residual_streams", c.mhc.streams},
                {"sinkhorn_iterations", c.mhc.sinkhorn_iterations},
                {"init_gating_factor", c.mhc.init_gating_factor}};
  if (c.softmax_type != SoftmaxType::kVanilla)  // --softmax-type: sinks change every attention row
    j["softmax_type"] = c.softmax_type == SoftmaxType::kLearnable ? "learnable" : "off-by-one";
  if (c.yarn.enabled)  // RoPE with YaRN's tables: a checkpoint of one does not load into the other
    j["yarn"] = {{"rotary_scaling_factor", c.yarn.scaling_factor},
                 {"original_max_position_embeddings", c.yarn.original_max_positions},
                 {"beta_fast", c.yarn.beta_fast},
                 {"beta_slow", c.yarn.beta_slow},
                 {"mscale", c.yarn.mscale},
                 {"mscale_all_dim", c.yarn.mscale_all_dim},
                 {"correction_range_round_to_int", c.yarn.round_to_int}};
  if (c.longrope.enabled)  // LongRoPE's two tables and the choice without a cache
    j["longrope"] = {{"original_max_position_embeddings", c.longrope.original_max_positions},
                     {"short_factor", c.longrope.short_factor},
                     {"long_factor", c.longrope.long_factor},
                     {"short_mscale", c.longrope.short_mscale},
                     {"long_mscale", c.longrope.long_mscale},
                     {"long_without_cache", c.longrope.long_without_cache}};
  return j;
}

nlohmann::json model_flags_json(const ModelArgs& m) {
  nlohmann::json j = {{"num_layers", m.num_layers},
                      {"hidden_size", m.hidden_size},
                      {"ffn_hidden_size", m.ffn_hidden_size},
                      {"num_attention_heads", m.num_attention_heads},
                      {"kv_channels", m.kv_channels},
                      {"group_query_attention", m.group_query_attention},
                      {"num_query_groups", m.num_kv_heads},
                      {"seq_length", m.seq_length},
                      {"max_position_embeddings", m.max_position_embeddings},
                      {"position_embedding_type", m.position_embedding_type},
                      {"rotary_base", m.rotary_base},
                      {"rotary_percent", m.rotary_percent},
                      {"normalization", m.normalization},
                      {"norm_epsilon", m.norm_epsilon},
                      {"swiglu", m.swiglu},
                      {"untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights},
                      {"add_bias_linear", m.add_bias_linear},
                      {"add_qkv_bias", m.add_qkv_bias},
                      {"make_vocab_size_divisible_by", m.make_vocab_size_divisible_by},
                      {"padded_vocab_size", m.padded_vocab_size},
                      {"noop_layers", m.noop_layers},
                      {"multi_latent_attention", m.multi_latent_attention},
                      {"q_lora_rank", m.q_lora_rank == kUnset ? nlohmann::json() : nlohmann::json(m.q_lora_rank)},
                      {"kv_lora_rank", m.kv_lora_rank},
                      {"qk_head_dim", m.qk_head_dim},
                      {"qk_pos_emb_head_dim", m.qk_pos_emb_head_dim},
                      {"v_head_dim", m.v_head_dim},
                      {"qk_layernorm", m.qk_layernorm},
                      {"rope_type", m.rope_type.empty() ? nlohmann::json() : nlohmann::json(m.rope_type)},
                      {"rotary_scaling_factor", m.rotary_scaling_factor},
                      {"mscale", m.mscale},
                      {"mscale_all_dim", m.mscale_all_dim}};
  if (m.is_hybrid_model) {  // absent: a GPT model
    j["is_hybrid_model"] = true;
    j["hybrid_override_pattern"] = m.hybrid_override_pattern;
    j["hybrid_attention_ratio"] = m.hybrid_attention_ratio;  // the layers when there is no pattern
    j["hybrid_mlp_ratio"] = m.hybrid_mlp_ratio;
    j["mamba_state_dim"] = m.mamba_state_dim;
    j["mamba_head_dim"] = m.mamba_head_dim;
    j["mamba_num_groups"] = m.mamba_num_groups;
    if (m.hybrid_override_pattern.find(kHybridGatedDeltaNet) != std::string::npos) {  // 'G' layers' sizes
      j["linear_conv_kernel_dim"] = m.linear_conv_kernel_dim;
      j["linear_key_head_dim"] = m.linear_key_head_dim;
      j["linear_value_head_dim"] = m.linear_value_head_dim;
      j["linear_num_key_heads"] = m.linear_num_key_heads;
      j["linear_num_value_heads"] = m.linear_num_value_heads;
    }
  }
  if (m.experimental_attention_variant == "dsa") {  // absent: dense attention
    j["experimental_attention_variant"] = "dsa";
    j["dsa_indexer_n_heads"] = m.dsa_indexer_n_heads;
    j["dsa_indexer_head_dim"] = m.dsa_indexer_head_dim;
    j["dsa_indexer_topk"] = m.dsa_indexer_topk;
    j["dsa_indexer_loss_coeff"] = m.dsa_indexer_loss_coeff;
    j["dsa_indexer_use_sparse_loss"] = m.dsa_indexer_use_sparse_loss;
  }
  if (!m.heterogeneous_layers_config_encoded_json.empty())  // absent: None (Megatron keeps the text, as here)
    j["heterogeneous_layers_config_encoded_json"] = m.heterogeneous_layers_config_encoded_json;
  if (m.experimental_attention_variant == "gdn2" && m.is_hybrid_model)  // its 'G' layers are GatedDeltaNet2
    j["experimental_attention_variant"] = "gdn2";
  const bool gdn = m.experimental_attention_variant == "gdn" || m.experimental_attention_variant == "gdn2";
  if (gdn && !m.is_hybrid_model) {  // Megatron's config fields of Gated DeltaNet (-2)
    j["experimental_attention_variant"] = m.experimental_attention_variant;
    const std::vector<int>& pattern = m.linear_attention_pattern;
    j["linear_attention_freq"] = pattern;  // as the list Megatron's la_freq_type / config would hold
    j["linear_conv_kernel_dim"] = m.linear_conv_kernel_dim;
    j["linear_key_head_dim"] = m.linear_key_head_dim;
    j["linear_value_head_dim"] = m.linear_value_head_dim;
    j["linear_num_key_heads"] = m.linear_num_key_heads;
    j["linear_num_value_heads"] = m.linear_num_value_heads;
  }
  if (m.openai_gelu) j["openai_gelu"] = true;  // absent: exact GeLU
  if (m.embed_layernorm) j["embed_layernorm"] = true;  // absent: no embedding norm
  if (m.mtp_num_layers != kUnset) {  // recorded as Megatron does; inference builds the model without them
    j["mtp_num_layers"] = m.mtp_num_layers;
    j["mtp_loss_scaling_factor"] = m.mtp_loss_scaling_factor;
  }
  if (m.squared_relu) j["squared_relu"] = true;
  if (m.quick_geglu) j["quick_geglu"] = true;  // absent: False
  if (m.geglu) j["geglu"] = true;  // MindSpeed-LLM's Gemma flags (absent: False)
  if (m.gelu_tanh) j["gelu_tanh"] = true;
  if (m.add_rmsnorm_offset) j["add_rmsnorm_offset"] = true;
  if (m.input_embeds_norm) j["input_embeds_norm"] = true;
  if (m.glu_linear_offset != 0.0) j["glu_linear_offset"] = m.glu_linear_offset;  // absent: 0.0
  if (!unset(m.activation_func_clamp_value))  // absent: None
    j["activation_func_clamp_value"] = m.activation_func_clamp_value;
  if (m.apply_layernorm_1p) j["apply_layernorm_1p"] = true;
  if (m.rotary_interleaved) j["rotary_interleaved"] = true;
  if (m.sliding_window != kUnset) j["sliding_window"] = m.sliding_window;  // absent: None
  if (!m.window_attn_pattern.empty()) j["window_attn_skip_freq"] = m.window_attn_pattern;  // the per-layer list
  if (!unset(m.rotary_seq_len_interpolation_factor))
    j["rotary_seq_len_interpolation_factor"] = m.rotary_seq_len_interpolation_factor;
  if (m.use_rope_scaling) {                   // absent: no RoPE scaling
    j["use_rope_scaling"] = true;
    j["rope_scaling_factor"] = m.rope_scaling_factor;
  }
  if (!m.no_rope_pattern.empty()) j["no_rope_freq"] = m.no_rope_pattern;  // Megatron's config: the per-layer list
  if (m.attention_output_gate) j["attention_output_gate"] = true;  // absent: no gate
  if (m.qk_l2_norm) j["qk_l2_norm"] = true;  // absent: no L2 norm
  // Gemma-2's flags as MindSpeed-LLM's args hold them (absent: None / False)
  if (!unset(m.output_logit_softcapping)) j["output_logit_softcapping"] = m.output_logit_softcapping;
  if (!unset(m.attn_logit_softcapping)) j["attn_logit_softcapping"] = m.attn_logit_softcapping;
  if (m.query_pre_attn_scalar != kUnset) j["query_pre_attn_scalar"] = m.query_pre_attn_scalar;
  if (m.post_norm) j["post_norm"] = true;
  if (m.enable_mhc_connections) {  // Megatron-Core's mHC fields (absent: off)
    j["enable_mhc_connections"] = true;
    j["mhc_num_residual_streams"] = m.mhc_num_residual_streams;
    j["mhc_sinkhorn_iterations"] = m.mhc_sinkhorn_iterations;
    j["mhc_init_gating_factor"] = m.mhc_init_gating_factor;
    j["mhc_recompute_layer_num"] =
        m.mhc_recompute_layer_num == kUnset ? nlohmann::json() : nlohmann::json(m.mhc_recompute_layer_num);
  }
  if (m.softmax_type != "vanilla") j["softmax_type"] = m.softmax_type;  // absent: vanilla
  if (m.qk_clip || m.log_max_attention_logit) {  // MuonClip's flags (model/qk_clip.h); absent: off
    j["qk_clip"] = m.qk_clip;
    j["qk_clip_alpha"] = m.qk_clip_alpha;
    j["qk_clip_threshold"] = m.qk_clip_threshold;
    j["log_max_attention_logit"] = m.log_max_attention_logit;
  }
  if (m.use_mup) {  // Megatron's MuP args as given (None: unset); absent: off
    j["use_mup"] = true;
    j["mup_base_hidden_size"] =
        m.mup_base_hidden_size == kUnset ? nlohmann::json() : nlohmann::json(m.mup_base_hidden_size);
    j["mup_embedding_mult"] = m.mup_embedding_mult;
    j["mup_output_mult"] = m.mup_output_mult;
    j["mup_base_head_dim"] = unset(m.mup_base_head_dim) ? nlohmann::json() : nlohmann::json(m.mup_base_head_dim);
    j["mup_attn_scale_power"] = m.mup_attn_scale_power;
  }
  if (m.position_embedding_type == "yarn") {  // Megatron's yarn_* args (None: unset)
    j["yarn_original_max_position_embeddings"] = m.yarn_original_max_position_embeddings == kUnset
                                                     ? nlohmann::json()
                                                     : nlohmann::json(m.yarn_original_max_position_embeddings);
    j["yarn_beta_fast"] = unset(m.yarn_beta_fast) ? nlohmann::json() : nlohmann::json(m.yarn_beta_fast);
    j["yarn_beta_slow"] = unset(m.yarn_beta_slow) ? nlohmann::json() : nlohmann::json(m.yarn_beta_slow);
    j["yarn_correction_range_round_to_int"] = m.yarn_correction_range_round_to_int;
  }
  if (m.rope_scaling_type == "longrope") {  // MindSpeed-LLM's LongRoPE args, the factor lists parsed as its args hold them
    j["rope_scaling_type"] = m.rope_scaling_type;
    j["rope_scaling_original_max_position_embeddings"] = m.rope_scaling_original_max_position_embeddings;
    j["long_factor"] = m.long_factors;
    j["short_factor"] = m.short_factors;
    j["long_mscale"] = unset(m.long_mscale) ? nlohmann::json() : nlohmann::json(m.long_mscale);
    j["short_mscale"] = unset(m.short_mscale) ? nlohmann::json() : nlohmann::json(m.short_mscale);
    j["longrope_freqs_type"] = m.longrope_freqs_type;
  }
  return j;
}

namespace {

template <class T>
Status get(const nlohmann::json& args, const char* key, const std::string& where, T* out) {
  auto it = args.find(key);
  if (it == args.end())
    return InvalidArgument(where, ": args has no '", key, "' (a checkpoint saved before Gale recorded its model flags?)");
  const bool ok = std::is_same_v<T, bool>          ? it->is_boolean()
                  : std::is_same_v<T, std::string> ? it->is_string()
                  : std::is_integral_v<T>          ? it->is_number_integer()
                                                   : it->is_number();
  if (!ok) return InvalidArgument(where, ": args '", key, "' has the wrong type: ", it->dump());
  *out = it->get<T>();
  return Status::Ok();
}

}  // namespace

void add_moe_flags_json(const MoeArgs& moe, nlohmann::json* args) {
  if (!moe.enabled()) return;
  (*args)["num_experts"] = moe.num_experts;
  (*args)["moe_router_topk"] = moe.moe_router_topk;
  (*args)["moe_ffn_hidden_size"] = moe.moe_ffn_hidden_size;
  (*args)["moe_layer_freq"] = moe.moe_layer_freq;
  (*args)["moe_router_pre_softmax"] = moe.moe_router_pre_softmax;
  // The routing rules (the forward depends on them; absent in older checkpoints: the defaults).
  (*args)["moe_router_score_function"] = moe.moe_router_score_function;
  (*args)["moe_router_enable_expert_bias"] = moe.moe_router_enable_expert_bias;
  if (!unset(moe.moe_router_topk_scaling_factor))
    (*args)["moe_router_topk_scaling_factor"] = moe.moe_router_topk_scaling_factor;
  if (moe.moe_router_group_topk != kUnset) {
    (*args)["moe_router_num_groups"] = moe.moe_router_num_groups;
    (*args)["moe_router_group_topk"] = moe.moe_router_group_topk;
  }
  if (moe.moe_shared_expert_intermediate_size != kUnset) {  // absent: no shared expert (older checkpoints too)
    (*args)["moe_shared_expert_intermediate_size"] = moe.moe_shared_expert_intermediate_size;
    (*args)["moe_shared_expert_gate"] = moe.moe_shared_expert_gate;
  }
  if (!unset(moe.moe_input_jitter_eps))  // absent: no jitter (older checkpoints too)
    (*args)["moe_input_jitter_eps"] = moe.moe_input_jitter_eps;
  // The load-balancing losses, as Megatron's args hold them: a string and a number, or (several
  // types) a list of each (absent in older checkpoints: the defaults).
  if (moe.moe_router_load_balancing_types.empty()) {
    (*args)["moe_router_load_balancing_type"] = moe.moe_router_load_balancing_type;
    (*args)["moe_aux_loss_coeff"] = moe.moe_aux_loss_coeff;
  } else {
    (*args)["moe_router_load_balancing_type"] = moe.moe_router_load_balancing_types;
    (*args)["moe_aux_loss_coeff"] = moe.moe_aux_loss_coeffs;
  }
  if (moe.uses_load_balancing_type("quantile_balancing"))  // absent: not quantile balancing (older checkpoints too)
    (*args)["moe_router_quantile_balancing_ema"] = moe.moe_router_quantile_balancing_ema;
}

StatusOr<MoeArgs> moe_args_from_json(const nlohmann::json& args, const std::string& where, int64_t num_layers) {
  MoeArgs moe;
  if (!args.is_object() || !args.contains("num_experts") || args["num_experts"].is_null()) return moe;
  GALE_RETURN_IF_ERROR(get(args, "num_experts", where, &moe.num_experts));
  GALE_RETURN_IF_ERROR(get(args, "moe_router_topk", where, &moe.moe_router_topk));
  GALE_RETURN_IF_ERROR(get(args, "moe_ffn_hidden_size", where, &moe.moe_ffn_hidden_size));
  GALE_RETURN_IF_ERROR(get(args, "moe_layer_freq", where, &moe.moe_layer_freq));
  GALE_RETURN_IF_ERROR(get(args, "moe_router_pre_softmax", where, &moe.moe_router_pre_softmax));
  if (args.contains("moe_router_score_function"))
    GALE_RETURN_IF_ERROR(get(args, "moe_router_score_function", where, &moe.moe_router_score_function));
  if (args.contains("moe_router_enable_expert_bias"))
    GALE_RETURN_IF_ERROR(get(args, "moe_router_enable_expert_bias", where, &moe.moe_router_enable_expert_bias));
  if (args.contains("moe_router_quantile_balancing_ema"))
    GALE_RETURN_IF_ERROR(
        get(args, "moe_router_quantile_balancing_ema", where, &moe.moe_router_quantile_balancing_ema));
  if (args.contains("moe_router_topk_scaling_factor"))
    GALE_RETURN_IF_ERROR(get(args, "moe_router_topk_scaling_factor", where, &moe.moe_router_topk_scaling_factor));
  if (args.contains("moe_router_group_topk")) {
    GALE_RETURN_IF_ERROR(get(args, "moe_router_num_groups", where, &moe.moe_router_num_groups));
    GALE_RETURN_IF_ERROR(get(args, "moe_router_group_topk", where, &moe.moe_router_group_topk));
  }
  if (args.contains("moe_router_load_balancing_type")) {  // a string, or a list of strings (Megatron's list form)
    const nlohmann::json& t = args["moe_router_load_balancing_type"];
    const nlohmann::json& c = args.contains("moe_aux_loss_coeff") ? args["moe_aux_loss_coeff"] : nlohmann::json(0.0);
    if (t.is_array()) {
      for (const nlohmann::json& v : t) {
        if (!v.is_string()) return InvalidArgument(where, ": args 'moe_router_load_balancing_type' has the wrong type: ", t.dump());
        moe.moe_router_load_balancing_types.push_back(v.get<std::string>());
      }
      if (!c.is_array() || c.size() != t.size())
        return InvalidArgument(where, ": args 'moe_aux_loss_coeff' is ", c.dump(), ", expected a list of ", t.size(),
                               " numbers as 'moe_router_load_balancing_type' ", t.dump());
      for (const nlohmann::json& v : c) {
        if (!v.is_number()) return InvalidArgument(where, ": args 'moe_aux_loss_coeff' has the wrong type: ", c.dump());
        moe.moe_aux_loss_coeffs.push_back(v.get<double>());
      }
      if (moe.moe_router_load_balancing_types.size() == 1) {  // Megatron's one-element list is a scalar
        moe.moe_router_load_balancing_type = moe.moe_router_load_balancing_types[0];
        moe.moe_aux_loss_coeff = moe.moe_aux_loss_coeffs[0];
        moe.moe_router_load_balancing_types.clear();
        moe.moe_aux_loss_coeffs.clear();
      }
    } else {
      GALE_RETURN_IF_ERROR(get(args, "moe_router_load_balancing_type", where, &moe.moe_router_load_balancing_type));
      if (args.contains("moe_aux_loss_coeff"))
        GALE_RETURN_IF_ERROR(get(args, "moe_aux_loss_coeff", where, &moe.moe_aux_loss_coeff));
    }
  }
  if (args.contains("moe_shared_expert_intermediate_size")) {
    GALE_RETURN_IF_ERROR(
        get(args, "moe_shared_expert_intermediate_size", where, &moe.moe_shared_expert_intermediate_size));
    GALE_RETURN_IF_ERROR(get(args, "moe_shared_expert_gate", where, &moe.moe_shared_expert_gate));
  }
  if (args.contains("moe_input_jitter_eps"))
    GALE_RETURN_IF_ERROR(get(args, "moe_input_jitter_eps", where, &moe.moe_input_jitter_eps));
  StatusOr<std::vector<int>> pattern = parse_moe_layer_freq(moe.moe_layer_freq, num_layers);
  if (!pattern.ok()) return InvalidArgument(where, ": args 'moe_layer_freq': ", pattern.status().message());
  moe.layer_pattern = std::move(pattern.value());
  return moe;
}

StatusOr<ModelArgs> model_args_from_json(const nlohmann::json& args, const std::string& where) {
  if (!args.is_object()) return InvalidArgument(where, ": args is not a JSON object");
  ModelArgs m;
  GALE_RETURN_IF_ERROR(get(args, "num_layers", where, &m.num_layers));
  GALE_RETURN_IF_ERROR(get(args, "hidden_size", where, &m.hidden_size));
  GALE_RETURN_IF_ERROR(get(args, "ffn_hidden_size", where, &m.ffn_hidden_size));
  GALE_RETURN_IF_ERROR(get(args, "num_attention_heads", where, &m.num_attention_heads));
  GALE_RETURN_IF_ERROR(get(args, "kv_channels", where, &m.kv_channels));
  GALE_RETURN_IF_ERROR(get(args, "group_query_attention", where, &m.group_query_attention));
  GALE_RETURN_IF_ERROR(get(args, "num_query_groups", where, &m.num_query_groups));
  GALE_RETURN_IF_ERROR(get(args, "seq_length", where, &m.seq_length));
  GALE_RETURN_IF_ERROR(get(args, "max_position_embeddings", where, &m.max_position_embeddings));
  GALE_RETURN_IF_ERROR(get(args, "position_embedding_type", where, &m.position_embedding_type));
  GALE_RETURN_IF_ERROR(get(args, "rotary_base", where, &m.rotary_base));
  GALE_RETURN_IF_ERROR(get(args, "rotary_percent", where, &m.rotary_percent));
  GALE_RETURN_IF_ERROR(get(args, "normalization", where, &m.normalization));
  GALE_RETURN_IF_ERROR(get(args, "norm_epsilon", where, &m.norm_epsilon));
  GALE_RETURN_IF_ERROR(get(args, "swiglu", where, &m.swiglu));
  if (args.contains("openai_gelu")) GALE_RETURN_IF_ERROR(get(args, "openai_gelu", where, &m.openai_gelu));
  if (args.contains("embed_layernorm"))
    GALE_RETURN_IF_ERROR(get(args, "embed_layernorm", where, &m.embed_layernorm));
  if (args.contains("squared_relu")) GALE_RETURN_IF_ERROR(get(args, "squared_relu", where, &m.squared_relu));
  // Megatron main's gated-MLP options (Megatron records False / 0.0 / None; older checkpoints lack them).
  if (auto it = args.find("quick_geglu"); it != args.end() && !it->is_null())
    GALE_RETURN_IF_ERROR(get(args, "quick_geglu", where, &m.quick_geglu));
  // MindSpeed-LLM's Gemma flags (recorded only when set).
  for (auto [key, out] : {std::pair{"geglu", &m.geglu}, std::pair{"gelu_tanh", &m.gelu_tanh},
                          std::pair{"add_rmsnorm_offset", &m.add_rmsnorm_offset},
                          std::pair{"input_embeds_norm", &m.input_embeds_norm}})
    if (auto it = args.find(key); it != args.end() && !it->is_null()) GALE_RETURN_IF_ERROR(get(args, key, where, out));
  for (auto [key, out] : {std::pair{"glu_linear_offset", &m.glu_linear_offset},
                          std::pair{"activation_func_clamp_value", &m.activation_func_clamp_value}})
    if (auto it = args.find(key); it != args.end() && !it->is_null()) {
      if (!it->is_number()) return InvalidArgument(where, ": args '", key, "' is ", it->dump(), ", expected a number");
      *out = it->get<double>();
    }
  if (args.contains("apply_layernorm_1p"))
    GALE_RETURN_IF_ERROR(get(args, "apply_layernorm_1p", where, &m.apply_layernorm_1p));
  if (args.contains("rotary_interleaved"))
    GALE_RETURN_IF_ERROR(get(args, "rotary_interleaved", where, &m.rotary_interleaved));
  if (auto it = args.find("sliding_window"); it != args.end() && !it->is_null()) {
    GALE_RETURN_IF_ERROR(get(args, "sliding_window", where, &m.sliding_window));
    if (m.sliding_window < 1)
      return InvalidArgument(where, ": args 'sliding_window' is ", m.sliding_window, ", expected at least 1");
  }
  if (args.contains("rotary_seq_len_interpolation_factor"))
    GALE_RETURN_IF_ERROR(
        get(args, "rotary_seq_len_interpolation_factor", where, &m.rotary_seq_len_interpolation_factor));
  if (args.contains("use_rope_scaling")) {
    GALE_RETURN_IF_ERROR(get(args, "use_rope_scaling", where, &m.use_rope_scaling));
    GALE_RETURN_IF_ERROR(get(args, "rope_scaling_factor", where, &m.rope_scaling_factor));
  }
  if (auto it = args.find("attention_output_gate"); it != args.end() && !it->is_null())
    GALE_RETURN_IF_ERROR(get(args, "attention_output_gate", where, &m.attention_output_gate));
  if (auto it = args.find("qk_l2_norm"); it != args.end() && !it->is_null())
    GALE_RETURN_IF_ERROR(get(args, "qk_l2_norm", where, &m.qk_l2_norm));
  for (auto [key, out] : {std::pair{"output_logit_softcapping", &m.output_logit_softcapping},
                          std::pair{"attn_logit_softcapping", &m.attn_logit_softcapping}})
    if (auto it = args.find(key); it != args.end() && !it->is_null()) {
      if (!it->is_number()) return InvalidArgument(where, ": args '", key, "' is ", it->dump(), ", expected a number");
      *out = it->get<double>();
    }
  if (auto it = args.find("query_pre_attn_scalar"); it != args.end() && !it->is_null())
    GALE_RETURN_IF_ERROR(get(args, "query_pre_attn_scalar", where, &m.query_pre_attn_scalar));
  if (auto it = args.find("post_norm"); it != args.end() && !it->is_null())
    GALE_RETURN_IF_ERROR(get(args, "post_norm", where, &m.post_norm));
  if (auto it = args.find("enable_mhc_connections"); it != args.end() && !it->is_null()) {  // Megatron-Core's mHC
    GALE_RETURN_IF_ERROR(get(args, "enable_mhc_connections", where, &m.enable_mhc_connections));
    for (auto [key, dest] : {std::pair{"mhc_num_residual_streams", &m.mhc_num_residual_streams},
                             std::pair{"mhc_sinkhorn_iterations", &m.mhc_sinkhorn_iterations},
                             std::pair{"mhc_recompute_layer_num", &m.mhc_recompute_layer_num}})
      if (auto v = args.find(key); v != args.end() && !v->is_null()) GALE_RETURN_IF_ERROR(get(args, key, where, dest));
    if (auto v = args.find("mhc_init_gating_factor"); v != args.end() && !v->is_null())
      GALE_RETURN_IF_ERROR(get(args, "mhc_init_gating_factor", where, &m.mhc_init_gating_factor));
  }
  if (auto it = args.find("softmax_type"); it != args.end() && !it->is_null()) {  // Megatron-Core's; absent: vanilla
    GALE_RETURN_IF_ERROR(get(args, "softmax_type", where, &m.softmax_type));
    if (m.softmax_type != "vanilla" && m.softmax_type != "off-by-one" && m.softmax_type != "learnable")
      return InvalidArgument(where, ": args 'softmax_type' is '", m.softmax_type,
                             "', expected 'vanilla', 'off-by-one' or 'learnable'");
  }
  // --qk-clip and its flags (Megatron's args hold all four; absent: off and Megatron's defaults).
  for (const auto& [key, dest] : {std::pair{"qk_clip", &m.qk_clip}, std::pair{"log_max_attention_logit",
                                                                                &m.log_max_attention_logit}})
    if (auto it = args.find(key); it != args.end() && !it->is_null()) GALE_RETURN_IF_ERROR(get(args, key, where, dest));
  for (const auto& [key, dest] : {std::pair{"qk_clip_alpha", &m.qk_clip_alpha}, std::pair{"qk_clip_threshold",
                                                                                          &m.qk_clip_threshold}})
    if (auto it = args.find(key); it != args.end() && !it->is_null()) GALE_RETURN_IF_ERROR(get(args, key, where, dest));
  // --use-mup's args (absent or false: off): the model's multipliers and softmax scale depend on them.
  if (auto it = args.find("use_mup"); it != args.end() && !it->is_null()) {
    GALE_RETURN_IF_ERROR(get(args, "use_mup", where, &m.use_mup));
    if (m.use_mup) {
      for (auto [key, dest] : {std::pair{"mup_embedding_mult", &m.mup_embedding_mult},
                               std::pair{"mup_output_mult", &m.mup_output_mult},
                               std::pair{"mup_attn_scale_power", &m.mup_attn_scale_power},
                               std::pair{"mup_base_head_dim", &m.mup_base_head_dim}})
        if (auto v = args.find(key); v != args.end() && !v->is_null()) GALE_RETURN_IF_ERROR(get(args, key, where, dest));
      if (auto v = args.find("mup_base_hidden_size"); v != args.end() && !v->is_null())
        GALE_RETURN_IF_ERROR(get(args, "mup_base_hidden_size", where, &m.mup_base_hidden_size));
      if (m.mup_base_hidden_size != kUnset && m.mup_base_hidden_size <= 0)
        return InvalidArgument(where, ": args 'mup_base_hidden_size' is ", m.mup_base_hidden_size,
                               ", expected a positive integer");
      if (!unset(m.mup_base_head_dim) && !(m.mup_base_head_dim > 0.0))
        return InvalidArgument(where, ": args 'mup_base_head_dim' is ", m.mup_base_head_dim,
                               ", expected a positive number");
    }
  }
  // --no-rope-freq: Megatron's args hold the int or the per-layer list (None or absent: RoPE everywhere).
  if (auto it = args.find("no_rope_freq"); it != args.end() && !it->is_null()) {
    if (it->is_number_integer() && it->get<int64_t>() >= 1) {
      const int64_t k = it->get<int64_t>();
      for (int64_t i = 0; i < m.num_layers; ++i) m.no_rope_pattern.push_back((i + 1) % k == 0 ? 1 : 0);
    } else if (it->is_array() && static_cast<int64_t>(it->size()) == m.num_layers &&
               std::all_of(it->begin(), it->end(), [](const nlohmann::json& v) { return v == 0 || v == 1; })) {
      m.no_rope_pattern = it->get<std::vector<int>>();
    } else {
      return InvalidArgument(where, ": args 'no_rope_freq' is ", it->dump(), ", expected an int >= 1 or a list of ",
                             m.num_layers, " zeros and ones");
    }
    m.no_rope_freq = nlohmann::json(m.no_rope_pattern).dump();
  }
  if (m.position_embedding_type == "yarn") {  // Megatron's YaRN args; None or absent: the defaults
    for (auto [key, out] : {std::pair{"rotary_scaling_factor", &m.rotary_scaling_factor}, {"mscale", &m.mscale},
                            {"mscale_all_dim", &m.mscale_all_dim}, {"yarn_beta_fast", &m.yarn_beta_fast},
                            {"yarn_beta_slow", &m.yarn_beta_slow}})
      if (auto it = args.find(key); it != args.end() && !it->is_null()) GALE_RETURN_IF_ERROR(get(args, key, where, out));
    if (auto it = args.find("yarn_original_max_position_embeddings"); it != args.end() && !it->is_null())
      GALE_RETURN_IF_ERROR(get(args, "yarn_original_max_position_embeddings", where,
                               &m.yarn_original_max_position_embeddings));
    if (auto it = args.find("yarn_correction_range_round_to_int"); it != args.end() && !it->is_null())
      GALE_RETURN_IF_ERROR(get(args, "yarn_correction_range_round_to_int", where,
                               &m.yarn_correction_range_round_to_int));
  }
  if (auto it = args.find("rope_scaling_type"); it != args.end() && !it->is_null()) {  // LongRoPE's args
    GALE_RETURN_IF_ERROR(get(args, "rope_scaling_type", where, &m.rope_scaling_type));
    if (m.rope_scaling_type != "longrope")
      return InvalidArgument(where, ": args 'rope_scaling_type' is ", it->dump(), ", expected \"longrope\" or None");
    GALE_RETURN_IF_ERROR(get(args, "rope_scaling_original_max_position_embeddings", where,
                             &m.rope_scaling_original_max_position_embeddings));
    for (auto [key, values, text] : {std::tuple{"long_factor", &m.long_factors, &m.long_factor},
                                     std::tuple{"short_factor", &m.short_factors, &m.short_factor}}) {
      auto f = args.find(key);
      if (f == args.end() || !f->is_array() || f->empty() ||
          !std::all_of(f->begin(), f->end(), [](const nlohmann::json& v) { return v.is_number(); }))
        return InvalidArgument(where, ": args '", key, "' is ", f == args.end() ? std::string("absent") : f->dump(),
                               ", expected a list of numbers with rope_scaling_type longrope");
      *values = f->get<std::vector<double>>();
      *text = longrope_factor_text(*values);
    }
    for (auto [key, out] : {std::pair{"long_mscale", &m.long_mscale}, {"short_mscale", &m.short_mscale}})
      if (auto v = args.find(key); v != args.end() && !v->is_null()) GALE_RETURN_IF_ERROR(get(args, key, where, out));
    if (auto v = args.find("longrope_freqs_type"); v != args.end() && !v->is_null())
      GALE_RETURN_IF_ERROR(get(args, "longrope_freqs_type", where, &m.longrope_freqs_type));
  }
  GALE_RETURN_IF_ERROR(
      get(args, "untie_embeddings_and_output_weights", where, &m.untie_embeddings_and_output_weights));
  GALE_RETURN_IF_ERROR(get(args, "add_bias_linear", where, &m.add_bias_linear));
  GALE_RETURN_IF_ERROR(get(args, "add_qkv_bias", where, &m.add_qkv_bias));
  GALE_RETURN_IF_ERROR(get(args, "make_vocab_size_divisible_by", where, &m.make_vocab_size_divisible_by));
  GALE_RETURN_IF_ERROR(get(args, "padded_vocab_size", where, &m.padded_vocab_size));
  if (auto it = args.find("noop_layers"); it != args.end()) {  // absent in checkpoints saved before --noop-layers
    if (!it->is_array()) return InvalidArgument(where, ": args 'noop_layers' has the wrong type: ", it->dump());
    for (const auto& v : *it) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= m.num_layers)
        return InvalidArgument(where, ": args 'noop_layers' holds ", v.dump(), ", expected a layer index below ",
                               m.num_layers);
      m.noop_layers.push_back(v.get<int64_t>());
    }
    std::sort(m.noop_layers.begin(), m.noop_layers.end());
    for (size_t i = 0; i < m.noop_layers.size(); ++i)
      m.noop_layers_flag += (i ? "," : "") + std::to_string(m.noop_layers[i]);
  }
  // The hybrid Mamba model (absent: a GPT model).
  if (auto it = args.find("is_hybrid_model"); it != args.end() && it->is_boolean() && it->get<bool>()) {
    m.is_hybrid_model = true;
    GALE_RETURN_IF_ERROR(get(args, "hybrid_override_pattern", where, &m.hybrid_override_pattern));
    // gdn2 makes the 'G' layers Gated DeltaNet-2 (Megatron's hybrid_block.py).
    if (auto v = args.find("experimental_attention_variant"); v != args.end() && v->is_string() && *v == "gdn2")
      m.experimental_attention_variant = "gdn2";
    if (args.contains("hybrid_attention_ratio"))  // absent in checkpoints saved before Gale wrote them
      GALE_RETURN_IF_ERROR(get(args, "hybrid_attention_ratio", where, &m.hybrid_attention_ratio));
    if (args.contains("hybrid_mlp_ratio"))
      GALE_RETURN_IF_ERROR(get(args, "hybrid_mlp_ratio", where, &m.hybrid_mlp_ratio));
    GALE_RETURN_IF_ERROR(get(args, "mamba_state_dim", where, &m.mamba_state_dim));
    GALE_RETURN_IF_ERROR(get(args, "mamba_head_dim", where, &m.mamba_head_dim));
    GALE_RETURN_IF_ERROR(get(args, "mamba_num_groups", where, &m.mamba_num_groups));
    // Gated DeltaNet layers ('G'): their sizes, checked as the flags. Checkpoints saved before Gale
    // recorded them cannot say how the layers were built: refused, naming the missing key.
    if (m.hybrid_override_pattern.find(kHybridGatedDeltaNet) != std::string::npos) {
      for (auto [key, dest] : {std::pair{"linear_conv_kernel_dim", &m.linear_conv_kernel_dim},
                               std::pair{"linear_key_head_dim", &m.linear_key_head_dim},
                               std::pair{"linear_value_head_dim", &m.linear_value_head_dim},
                               std::pair{"linear_num_key_heads", &m.linear_num_key_heads},
                               std::pair{"linear_num_value_heads", &m.linear_num_value_heads}}) {
        if (!args.contains(key))
          return InvalidArgument(where, ": args has no '", key, "' for the Gated DeltaNet layers ('G') of "
                                 "hybrid_override_pattern '", m.hybrid_override_pattern, "' (a checkpoint saved "
                                 "before Gale recorded their sizes); give the model flags without "
                                 "--use-checkpoint-args");
        GALE_RETURN_IF_ERROR(get(args, key, where, dest));
      }
      ArgParser none("checkpoint args", "");  // no flag given: validate_gdn_args checks the values only
      if (Status s = validate_gdn_args(m, none); !s.ok()) return Status(s.code(), str_cat(where, ": args: ", s.message()));
    }
  }
  // Heterogeneous layers (absent or null: none).
  if (auto it = args.find("heterogeneous_layers_config_encoded_json"); it != args.end() && !it->is_null())
    GALE_RETURN_IF_ERROR(get(args, "heterogeneous_layers_config_encoded_json", where,
                             &m.heterogeneous_layers_config_encoded_json));
  // Multi-latent attention (absent in checkpoints saved before Gale had it: standard attention).
  if (args.contains("qk_layernorm"))  // the per-head q/k norms, or MLA's latent norms
    GALE_RETURN_IF_ERROR(get(args, "qk_layernorm", where, &m.qk_layernorm));
  if (auto it = args.find("multi_latent_attention"); it != args.end() && it->is_boolean() && it->get<bool>()) {
    m.multi_latent_attention = true;
    if (auto q = args.find("q_lora_rank"); q != args.end() && !q->is_null())
      GALE_RETURN_IF_ERROR(get(args, "q_lora_rank", where, &m.q_lora_rank));
    GALE_RETURN_IF_ERROR(get(args, "kv_lora_rank", where, &m.kv_lora_rank));
    GALE_RETURN_IF_ERROR(get(args, "qk_head_dim", where, &m.qk_head_dim));
    GALE_RETURN_IF_ERROR(get(args, "qk_pos_emb_head_dim", where, &m.qk_pos_emb_head_dim));
    GALE_RETURN_IF_ERROR(get(args, "v_head_dim", where, &m.v_head_dim));
    if (auto r = args.find("rope_type"); r != args.end() && !r->is_null())
      GALE_RETURN_IF_ERROR(get(args, "rope_type", where, &m.rope_type));
    GALE_RETURN_IF_ERROR(get(args, "rotary_scaling_factor", where, &m.rotary_scaling_factor));
    GALE_RETURN_IF_ERROR(get(args, "mscale", where, &m.mscale));
    GALE_RETURN_IF_ERROR(get(args, "mscale_all_dim", where, &m.mscale_all_dim));
  }
  // DeepSeek sparse attention: the indexer's sizes (a loss coefficient of None or absent: 0, as the
  // flag's default), checked as the flags.
  if (auto it = args.find("experimental_attention_variant"); it != args.end() && *it == "dsa") {
    m.experimental_attention_variant = "dsa";
    GALE_RETURN_IF_ERROR(get(args, "dsa_indexer_n_heads", where, &m.dsa_indexer_n_heads));
    GALE_RETURN_IF_ERROR(get(args, "dsa_indexer_head_dim", where, &m.dsa_indexer_head_dim));
    GALE_RETURN_IF_ERROR(get(args, "dsa_indexer_topk", where, &m.dsa_indexer_topk));
    if (auto c = args.find("dsa_indexer_loss_coeff"); c != args.end() && !c->is_null())
      GALE_RETURN_IF_ERROR(get(args, "dsa_indexer_loss_coeff", where, &m.dsa_indexer_loss_coeff));
    if (args.contains("dsa_indexer_use_sparse_loss"))
      GALE_RETURN_IF_ERROR(get(args, "dsa_indexer_use_sparse_loss", where, &m.dsa_indexer_use_sparse_loss));
    ArgParser none("checkpoint args", "");  // no flag given: the values only
    Status s = validate_dsa_args(m, none);
    if (s.ok()) s = check_dsa_model_args(m);
    if (!s.ok()) return Status(s.code(), str_cat(where, ": args: ", s.message()));
  }
  // Gated DeltaNet: its pattern and sizes, checked as the flags. Any other variant: inference and
  // conversion refuse it.
  if (auto it = args.find("experimental_attention_variant");
      it != args.end() && !it->is_null() && m.experimental_attention_variant != "dsa" &&
      !(m.is_hybrid_model && m.experimental_attention_variant == "gdn2")) {
    if (!it->is_string() || (it->get<std::string>() != "gdn" && it->get<std::string>() != "gdn2"))
      return Unimplemented(where, ": an attention variant (args 'experimental_attention_variant' ", it->dump(),
                           "): generation, evaluation and conversion are not supported yet");
    m.experimental_attention_variant = it->get<std::string>();
    auto freq = args.find("linear_attention_freq");
    if (freq == args.end() || !(freq->is_number_integer() || freq->is_array()))
      return InvalidArgument(where, ": args 'linear_attention_freq' of a Gated DeltaNet model: expected an int or a "
                             "list of one 0/1 per layer, found ", freq == args.end() ? "none" : freq->dump());
    m.linear_attention_freq = freq->dump();  // "4" or "[1,1,1,0]": the flag's spellings
    GALE_RETURN_IF_ERROR(get(args, "linear_conv_kernel_dim", where, &m.linear_conv_kernel_dim));
    GALE_RETURN_IF_ERROR(get(args, "linear_key_head_dim", where, &m.linear_key_head_dim));
    GALE_RETURN_IF_ERROR(get(args, "linear_value_head_dim", where, &m.linear_value_head_dim));
    GALE_RETURN_IF_ERROR(get(args, "linear_num_key_heads", where, &m.linear_num_key_heads));
    GALE_RETURN_IF_ERROR(get(args, "linear_num_value_heads", where, &m.linear_num_value_heads));
    ArgParser none("checkpoint args", "");  // no flag given: validate_gdn_args checks the values only
    if (Status s = validate_gdn_args(m, none); !s.ok())
      return Status(s.code(), str_cat(where, ": args: ", s.message()));
  }
  // Multi-token prediction (absent: none). Inference leaves the MTP layers out (train/inference_model.h).
  if (auto it = args.find("mtp_num_layers"); it != args.end() && !it->is_null()) {
    GALE_RETURN_IF_ERROR(get(args, "mtp_num_layers", where, &m.mtp_num_layers));
    if (m.mtp_num_layers < 1)
      return InvalidArgument(where, ": args 'mtp_num_layers' is ", m.mtp_num_layers, ", expected at least 1");
    if (args.contains("mtp_loss_scaling_factor"))
      GALE_RETURN_IF_ERROR(get(args, "mtp_loss_scaling_factor", where, &m.mtp_loss_scaling_factor));
  }
  // Megatron's --window-size (a pair (left, right)) and --window-attn-skip-freq (its int or the per-layer
  // list); None or absent: no window, every layer windowed. Checked as the flags are.
  if (auto it = args.find("window_size"); it != args.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() || !(*it)[1].is_number_integer())
      return InvalidArgument(where, ": args 'window_size' is ", it->dump(), ", expected a pair of ints (left, right)");
    m.window_size = str_cat((*it)[0].get<int64_t>(), ",", (*it)[1].get<int64_t>());
  }
  if (auto it = args.find("window_attn_skip_freq"); it != args.end() && !it->is_null()) {
    if (it->is_number_integer())
      m.window_attn_skip_freq = std::to_string(it->get<int64_t>());
    else if (it->is_array())
      m.window_attn_skip_freq = it->dump();
    else
      return InvalidArgument(where, ": args 'window_attn_skip_freq' is ", it->dump(),
                             ", expected an int >= 1 or a list of ", m.num_layers, " zeros and ones");
  }
  // MindSpeed-LLM's Gemma-2 args hold --interleave-sliding-window W instead of a window: --sliding-window W
  // --window-attn-skip-freq 2 (train/arguments_gemma2.cc) when the args have no window of their own.
  if (auto it = args.find("interleave_sliding_window");
      it != args.end() && !it->is_null() && m.sliding_window == kUnset && m.window_size.empty()) {
    GALE_RETURN_IF_ERROR(get(args, "interleave_sliding_window", where, &m.interleave_sliding_window));
    if (Status s = validate_gemma2_args(m); !s.ok()) return Status(s.code(), str_cat(where, ": args: ", s.message()));
  }
  if (Status s = validate_window_args(m); !s.ok()) return Status(s.code(), str_cat(where, ": args: ", s.message()));
  m.num_kv_heads = m.group_query_attention ? m.num_query_groups : m.num_attention_heads;
  if (!m.group_query_attention) m.num_query_groups = 1;  // as the flag's default, unused without GQA
  return m;
}

Status refuse_variant_conversion(const ModelArgs& m, const std::string& where) {
  const std::string& v = m.experimental_attention_variant;
  if (m.is_hybrid_model && m.hybrid_override_pattern.find(kHybridGatedDeltaNet) != std::string::npos)
    return Unimplemented(where, ": a hybrid model with Gated DeltaNet layers ('G' in hybrid_override_pattern '",
                         m.hybrid_override_pattern, "'): conversion to or from Megatron's and Hugging Face's formats "
                         "is not supported yet (Gale reads and writes Megatron's GPT models, not its hybrid "
                         "MambaModel; a GPT model with --experimental-attention-variant gdn converts)");
  if (v == "gdn2")  // no Hugging Face architecture holds it (Megatron's torch format does: megatron_gdn_names.h)
    return Unimplemented(where, ": a Gated DeltaNet-2 model (args 'experimental_attention_variant' \"gdn2\"): "
                         "conversion to or from Hugging Face's format is not supported yet (no Hugging Face "
                         "architecture holds it; Megatron's torch format does)");
  // Gated DeltaNet converts (Hugging Face's Qwen3-Next, Megatron's torch format), and so does DSA
  // (Hugging Face's DeepseekV32ForCausalLM, train/hf_deepseek_v32.h; Megatron's formats,
  // train/megatron_mla_names.h, the indexer under core_attention).
  return Status::Ok();
}

namespace {

// As Megatron prints a Python value: strings bare, booleans True/False.
std::string printed(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  return v.dump();
}

// One of Megatron's _set_arg: the checkpoint's value of `key` (when recorded) into *dest, unless
// `flag` was given and the argument is not forced.
template <class T>
Status take(const nlohmann::json& saved, const std::string& where, const char* key, T* dest, const ArgParser& p,
            const char* flag, bool force, std::vector<std::string>* lines) {
  if (!force && p.was_set(flag)) return Status::Ok();
  auto it = saved.find(key);
  if (it == saved.end() || it->is_null()) {
    lines->push_back(str_cat("Checkpoint did not provide arguments ", key));
    return Status::Ok();
  }
  GALE_RETURN_IF_ERROR(get(saved, key, where, dest));
  lines->push_back(str_cat("Setting ", key, " to ", printed(*it), " from checkpoint"));
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<std::string>> apply_checkpoint_args(Arguments& a, const ArgParser& p) {
  std::vector<std::string> lines;
  CheckpointArgs& ca = a.checkpoint;
  if (!ca.use_checkpoint_args) {
    for (const char* flag : {"--use-mp-args-from-checkpoint-args", "--no-use-tokenizer-model-from-checkpoint-args"})
      if (p.was_set(flag)) lines.push_back(str_cat(flag, " has no effect without --use-checkpoint-args"));
    return lines;
  }
  if (ca.load.empty()) return InvalidArgument("--use-checkpoint-args requires --load argument");
  const std::string tracker = ca.load + "/latest_checkpointed_iteration.txt";
  if (ca.ckpt_step == kUnset && !std::filesystem::exists(tracker)) {
    lines.push_back("Checkpoint not found to provide arguments, using provided arguments.");
    return lines;
  }
  nlohmann::json saved_json;
  std::string where;
  GALE_ASSIGN_OR_RETURN(CheckpointFormat format, detect_checkpoint_format(ca.load, ca.ckpt_step));
  if (format == CheckpointFormat::kMegatronTorch || format == CheckpointFormat::kMegatronTorchDist ||
      format == CheckpointFormat::kMegatronTorchDcp) {  // Megatron's own checkpoint: its args Namespace
    GALE_ASSIGN_OR_RETURN(saved_json, read_megatron_args(ca.load, ca.ckpt_step, &where));
  } else {
    StatusOr<CheckpointReader> opened = ca.ckpt_step == kUnset ? CheckpointReader::open(ca.load)
                                                                : CheckpointReader::open_iteration(ca.load, ca.ckpt_step);
    if (!opened.ok())
      return Status(opened.status().code(), str_cat("--use-checkpoint-args: ", opened.status().message()));
    where = opened.value().directory() + "/metadata.json";
    StatusOr<nlohmann::json> section = opened.value().section("args");
    if (!section.ok()) {
      lines.push_back("Checkpoint provided does not have arguments saved, using provided arguments.");
      return lines;
    }
    saved_json = std::move(section).value();
  }
  const nlohmann::json& saved = saved_json;
  if (!saved.is_object()) return InvalidArgument(where, ": args is not a JSON object");
  ModelArgs& m = a.model;
  MoeArgs& moe = a.moe;
  const auto set = [&](const char* key, auto* dest, const char* flag, bool force) {
    return take(saved, where, key, dest, p, flag, force, &lines);
  };
  // Model args, in Megatron's order (the first seven yield to the command line).
  GALE_RETURN_IF_ERROR(set("num_layers", &m.num_layers, "--num-layers", false));
  GALE_RETURN_IF_ERROR(set("hidden_size", &m.hidden_size, "--hidden-size", false));
  GALE_RETURN_IF_ERROR(set("ffn_hidden_size", &m.ffn_hidden_size, "--ffn-hidden-size", false));
  GALE_RETURN_IF_ERROR(set("seq_length", &m.seq_length, "--seq-length", false));
  GALE_RETURN_IF_ERROR(set("num_attention_heads", &m.num_attention_heads, "--num-attention-heads", false));
  GALE_RETURN_IF_ERROR(set("num_query_groups", &m.num_query_groups, "--num-query-groups", true));
  GALE_RETURN_IF_ERROR(set("group_query_attention", &m.group_query_attention, "--group-query-attention", true));
  GALE_RETURN_IF_ERROR(set("kv_channels", &m.kv_channels, "--kv-channels", false));
  GALE_RETURN_IF_ERROR(set("max_position_embeddings", &m.max_position_embeddings, "--max-position-embeddings", false));
  GALE_RETURN_IF_ERROR(set("position_embedding_type", &m.position_embedding_type, "--position-embedding-type", true));
  if (m.position_embedding_type == "rope") m.use_rotary_position_embeddings = false;  // the type says it
  GALE_RETURN_IF_ERROR(set("rotary_base", &m.rotary_base, "--rotary-base", true));
  GALE_RETURN_IF_ERROR(set("rotary_percent", &m.rotary_percent, "--rotary-percent", true));
  // MindSpeed's --sliding-window (recorded only when set; absent keeps the command line's).
  GALE_RETURN_IF_ERROR(set("sliding_window", &m.sliding_window, "--sliding-window", true));
  GALE_RETURN_IF_ERROR(set("query_pre_attn_scalar", &m.query_pre_attn_scalar, "--query-pre-attn-scalar", true));
  // Recorded only when true (checkpoint_model_section / model_flags_json): absent is false.
  for (auto [key, dest] : {std::pair{"rotary_interleaved", &m.rotary_interleaved},
                           std::pair{"attention_output_gate", &m.attention_output_gate},
                           std::pair{"qk_l2_norm", &m.qk_l2_norm},
                           std::pair{"post_norm", &m.post_norm},
                           std::pair{"squared_relu", &m.squared_relu},
                           std::pair{"quick_geglu", &m.quick_geglu},
                           std::pair{"geglu", &m.geglu},
                           std::pair{"gelu_tanh", &m.gelu_tanh},
                           std::pair{"add_rmsnorm_offset", &m.add_rmsnorm_offset},
                           std::pair{"input_embeds_norm", &m.input_embeds_norm},
                           std::pair{"apply_layernorm_1p", &m.apply_layernorm_1p}}) {
    *dest = saved.contains(key) && saved[key].is_boolean() && saved[key].get<bool>();
    lines.push_back(str_cat("Setting ", key, " to ", *dest ? "True" : "False", " from checkpoint"));
  }
  // --enable-mhc-connections: recorded only when on (absent: off), with Megatron's mhc_* fields.
  m.enable_mhc_connections = saved.contains("enable_mhc_connections") && saved["enable_mhc_connections"].is_boolean() &&
                             saved["enable_mhc_connections"].get<bool>();
  if (m.enable_mhc_connections) {
    lines.push_back("Setting enable_mhc_connections to True from checkpoint");
    GALE_RETURN_IF_ERROR(set("mhc_num_residual_streams", &m.mhc_num_residual_streams, "--mhc-num-residual-streams", true));
    GALE_RETURN_IF_ERROR(set("mhc_sinkhorn_iterations", &m.mhc_sinkhorn_iterations, "--mhc-sinkhorn-iterations", true));
    GALE_RETURN_IF_ERROR(set("mhc_init_gating_factor", &m.mhc_init_gating_factor, "--mhc-init-gating-factor", true));
  }
  // --glu-linear-offset (absent: 0.0), --activation-func-clamp-value and Gemma-2's soft-capping (absent or None: unset).
  for (auto [key, dest, none] : {std::tuple{"glu_linear_offset", &m.glu_linear_offset, 0.0},
                                 std::tuple{"output_logit_softcapping", &m.output_logit_softcapping, kUnsetF},
                                 std::tuple{"attn_logit_softcapping", &m.attn_logit_softcapping, kUnsetF},
                                 std::tuple{"activation_func_clamp_value", &m.activation_func_clamp_value,
                                            std::numeric_limits<double>::quiet_NaN()}}) {
    const bool given = saved.contains(key) && saved[key].is_number();
    *dest = given ? saved[key].get<double>() : none;
    lines.push_back(str_cat("Setting ", key, " to ", given ? printed(saved[key]) : std::string(none == 0.0 ? "0.0" : "None"),
                            " from checkpoint"));
  }
  // --softmax-type: recorded when not vanilla (absent or None: vanilla).
  m.softmax_type = saved.contains("softmax_type") && saved["softmax_type"].is_string()
                       ? saved["softmax_type"].get<std::string>()
                       : "vanilla";
  if (m.softmax_type != "vanilla" && m.softmax_type != "off-by-one" && m.softmax_type != "learnable")
    return InvalidArgument(where, ": args 'softmax_type' is '", m.softmax_type,
                           "', expected 'vanilla', 'off-by-one' or 'learnable'");
  lines.push_back(str_cat("Setting softmax_type to ", m.softmax_type, " from checkpoint"));
  GALE_RETURN_IF_ERROR(set("add_bias_linear", &m.add_bias_linear, "--disable-bias-linear", true));
  GALE_RETURN_IF_ERROR(set("add_qkv_bias", &m.add_qkv_bias, "--add-qkv-bias", true));
  GALE_RETURN_IF_ERROR(set("swiglu", &m.swiglu, "--swiglu", true));
  GALE_RETURN_IF_ERROR(set("untie_embeddings_and_output_weights", &m.untie_embeddings_and_output_weights,
                           "--untie-embeddings-and-output-weights", true));
  GALE_RETURN_IF_ERROR(set("normalization", &m.normalization, "--normalization", true));
  GALE_RETURN_IF_ERROR(set("attention_dropout", &m.attention_dropout, "--attention-dropout", true));
  GALE_RETURN_IF_ERROR(set("hidden_dropout", &m.hidden_dropout, "--hidden-dropout", true));
  // The MoE shape (absent in a dense model's args: the command line's, as Megatron's None).
  GALE_RETURN_IF_ERROR(set("num_experts", &moe.num_experts, "--num-experts", true));
  GALE_RETURN_IF_ERROR(set("moe_layer_freq", &moe.moe_layer_freq, "--moe-layer-freq", true));
  GALE_RETURN_IF_ERROR(set("moe_ffn_hidden_size", &moe.moe_ffn_hidden_size, "--moe-ffn-hidden-size", true));
  GALE_RETURN_IF_ERROR(set("moe_router_topk", &moe.moe_router_topk, "--moe-router-topk", true));
  GALE_RETURN_IF_ERROR(set("moe_router_pre_softmax", &moe.moe_router_pre_softmax, "--moe-router-pre-softmax", true));
  GALE_RETURN_IF_ERROR(set("moe_shared_expert_intermediate_size", &moe.moe_shared_expert_intermediate_size,
                           "--moe-shared-expert-intermediate-size", true));
  // Tokenizer.
  GALE_RETURN_IF_ERROR(set("tokenizer_type", &a.tokenizer.tokenizer_type, "--tokenizer-type", true));
  if (ca.use_tokenizer_model_from_checkpoint_args)
    GALE_RETURN_IF_ERROR(set("tokenizer_model", &a.tokenizer.tokenizer_model, "--tokenizer-model", true));
  // Model parallelism.
  if (ca.use_mp_args_from_checkpoint_args) {
    ParallelArgs& par = a.parallel;
    GALE_RETURN_IF_ERROR(set("tensor_model_parallel_size", &par.tensor_model_parallel_size,
                             "--tensor-model-parallel-size", true));
    GALE_RETURN_IF_ERROR(set("pipeline_model_parallel_size", &par.pipeline_model_parallel_size,
                             "--pipeline-model-parallel-size", true));
    GALE_RETURN_IF_ERROR(set("expert_model_parallel_size", &par.expert_model_parallel_size,
                             "--expert-model-parallel-size", true));
  }
  return lines;
}

}  // namespace gale
