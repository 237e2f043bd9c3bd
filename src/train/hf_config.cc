// Parsing and writing Hugging Face config.json for GPT-2, Bloom, LLaMA, Qwen2, Qwen3, Mistral, Mixtral, Qwen2-MoE,
// Qwen3-MoE and DeepSeek-V3.
#include "train/hf_config.h"
#include "train/longrope_factors.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "train/hf_deepseek_v32.h"
#include "train/hf_gemma2.h"

namespace gale {

const char* hf_architecture_name(HfArchitecture a) {
  switch (a) {
    case HfArchitecture::kGpt2: return "GPT2LMHeadModel";
    case HfArchitecture::kLlama: return "LlamaForCausalLM";
    case HfArchitecture::kQwen2: return "Qwen2ForCausalLM";
    case HfArchitecture::kMistral: return "MistralForCausalLM";
    case HfArchitecture::kMixtral: return "MixtralForCausalLM";
    case HfArchitecture::kQwen2Moe: return "Qwen2MoeForCausalLM";
    case HfArchitecture::kDeepseekV3: return "DeepseekV3ForCausalLM";
    case HfArchitecture::kQwen3: return "Qwen3ForCausalLM";
    case HfArchitecture::kQwen3Moe: return "Qwen3MoeForCausalLM";
    case HfArchitecture::kQwen3Next: return "Qwen3NextForCausalLM";
    case HfArchitecture::kBloom: return "BloomForCausalLM";
    case HfArchitecture::kGptOss: return "GptOssForCausalLM";
    case HfArchitecture::kInternLM2: return "InternLM2ForCausalLM";
    case HfArchitecture::kPhi3: return "Phi3ForCausalLM";
    case HfArchitecture::kBaichuan: return "BaichuanForCausalLM";
    case HfArchitecture::kChatGLM: return "ChatGLMModel";
    case HfArchitecture::kGemma: return "GemmaForCausalLM";
    case HfArchitecture::kGemma2: return "Gemma2ForCausalLM";
    case HfArchitecture::kGemma3: return "Gemma3ForCausalLM";
  }
  return "?";
}

namespace {

// Typed config.json lookups: a missing key takes `fallback` when given, else is an error.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& j, const std::string& path) : j_(j), path_(path) {}

  StatusOr<int64_t> positive(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return missing(key);
    }
    if (!v->is_number_integer() || v->get<int64_t>() <= 0)
      return InvalidArgument(path_, ": '", key, "' must be a positive integer, found ", v->dump());
    return v->get<int64_t>();
  }
  StatusOr<int64_t> non_negative(const char* key, int64_t fallback) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number_integer() || v->get<int64_t>() < 0)
      return InvalidArgument(path_, ": '", key, "' must be a non-negative integer, found ", v->dump());
    return v->get<int64_t>();
  }
  StatusOr<double> number(const char* key, std::optional<double> fallback = std::nullopt) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return missing(key);
    }
    if (!v->is_number()) return InvalidArgument(path_, ": '", key, "' must be a number, found ", v->dump());
    return v->get<double>();
  }
  StatusOr<bool> boolean(const char* key, bool fallback) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return InvalidArgument(path_, ": '", key, "' must be true or false, found ", v->dump());
    return v->get<bool>();
  }
  StatusOr<std::string> string(const char* key, const std::string& fallback) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) return InvalidArgument(path_, ": '", key, "' must be a string, found ", v->dump());
    return v->get<std::string>();
  }
  // Present and not null.
  bool set(const char* key) const { return find(key) != nullptr; }
  std::string dump(const char* key) const { return j_.at(key).dump(); }
  const nlohmann::json& json() const { return j_; }
  const std::string& path() const { return path_; }

 private:
  const nlohmann::json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  Status missing(const char* key) const { return InvalidArgument(path_, ": missing key '", key, "'"); }
  const nlohmann::json& j_;
  const std::string& path_;
};

Status refuse(const ConfigReader& c, const char* key, const std::string& why);

// rope_scaling {"rope_type": "yarn", ...} of a LLaMA-family model (Qwen2.5 / Qwen3 long context) as
// Megatron's --position-embedding-type yarn, read as transformers 5.x computes it
// (_compute_yarn_parameters): `factor` as given, original_max_position_embeddings from rope_scaling,
// else the config's top-level one, else max_position_embeddings; beta_fast / beta_slow (0 or unset:
// 32 / 1); truncate (default true) is the correction range's rounding; mscale and mscale_all_dim
// count only both non-zero (else cos/sin get m(factor, 1): Megatron's defaults 1 and 0). An explicit
// attention_factor is refused unless it equals the one those give (Megatron has no flag for it).
Status read_llama_yarn(const ConfigReader& c, ModelArgs* m) {
  const nlohmann::json& j = c.json().at("rope_scaling");
  auto num = [&](const nlohmann::json& o, const char* k, double fallback) {
    auto it = o.find(k);
    if (it == o.end() || it->is_null()) return fallback;
    return it->is_number() ? it->get<double>() : std::nan("");
  };
  const std::string why = "Megatron's --position-embedding-type yarn takes a factor >= 1, a positive integer "
                          "original_max_position_embeddings, positive betas, a boolean truncate, and no "
                          "attention_factor other than the one factor, mscale and mscale_all_dim give";
  const double factor = num(j, "factor", std::nan(""));
  const double original = num(j, "original_max_position_embeddings",
                              num(c.json(), "original_max_position_embeddings",
                                  static_cast<double>(m->max_position_embeddings)));
  const double beta_fast = num(j, "beta_fast", 0.0), beta_slow = num(j, "beta_slow", 0.0);
  const double mscale = num(j, "mscale", 0.0), mscale_all_dim = num(j, "mscale_all_dim", 0.0);
  auto truncate = j.find("truncate");
  if (!(factor >= 1.0) || !(original >= 1.0) || original != std::floor(original) || !(beta_fast >= 0.0) ||
      !(beta_slow >= 0.0) || std::isnan(mscale) || std::isnan(mscale_all_dim) ||
      (truncate != j.end() && !truncate->is_null() && !truncate->is_boolean()))
    return refuse(c, "rope_scaling", why);
  const bool both = mscale != 0.0 && mscale_all_dim != 0.0;
  m->position_embedding_type = "yarn";
  m->rotary_scaling_factor = factor;
  m->mscale = both ? mscale : 1.0;
  m->mscale_all_dim = both ? mscale_all_dim : 0.0;
  m->yarn_original_max_position_embeddings = static_cast<int64_t>(original);
  if (beta_fast > 0.0) m->yarn_beta_fast = beta_fast;
  if (beta_slow > 0.0) m->yarn_beta_slow = beta_slow;
  m->yarn_correction_range_round_to_int = truncate == j.end() || truncate->is_null() || truncate->get<bool>();
  if (j.contains("attention_factor") && !j["attention_factor"].is_null()) {
    auto mscale_of = [&](double x) { return factor <= 1.0 ? 1.0 : 0.1 * x * std::log(factor) + 1.0; };
    const double derived = mscale_of(m->mscale) / mscale_of(m->mscale_all_dim);
    const double given = num(j, "attention_factor", std::nan(""));
    if (!(std::abs(given - derived) <= 1e-12 * derived)) return refuse(c, "rope_scaling", why);
  }
  return Status::Ok();
}

// rope_scaling {"rope_type": "llama3", "factor": F, "low_freq_factor": 1, "high_freq_factor": 4,
// "original_max_position_embeddings": 8192} is Megatron's --use-rope-scaling --rope-scaling-factor F
// (its other constants are fixed); {"rope_type": "linear", "factor": F} (position interpolation) is
// --rotary-seq-len-interpolation-factor F; anything else is refused.
Status read_llama_rope_scaling(const ConfigReader& c, ModelArgs* m) {
  const nlohmann::json& j = c.json().at("rope_scaling");
  const std::string why = "Megatron's --use-rope-scaling is Llama 3's scaling with low_freq_factor 1, high_freq_factor 4 "
                          "and original_max_position_embeddings 8192; --rotary-seq-len-interpolation-factor is "
                          "rope_type linear with a positive factor";
  if (!j.is_object()) return refuse(c, "rope_scaling", why);
  const std::string type = j.value("rope_type", j.value("type", std::string()));
  auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : -1.0; };
  if (type == "linear" && num("factor") > 0.0) {
    m->rotary_seq_len_interpolation_factor = num("factor");
    return Status::Ok();
  }
  if (type == "yarn") return read_llama_yarn(c, m);
  if (type != "llama3" || num("factor") < 1.0 || num("low_freq_factor") != 1.0 || num("high_freq_factor") != 4.0 ||
      num("original_max_position_embeddings") != 8192.0)
    return refuse(c, "rope_scaling", why);
  m->use_rope_scaling = true;
  m->rope_scaling_factor = num("factor");
  return Status::Ok();
}

Status refuse(const ConfigReader& c, const char* key, const std::string& why) {
  return Unimplemented(c.path(), ": '", key, "' = ", c.dump(key), " is not supported yet (", why, ")");
}

// DeepSeek-V3's rope_scaling {"rope_type": "yarn", ...} as MLA's YaRN flags. Gale's YaRN has
// MLATransformerConfig's fixed constants (model/yarn_rope.h): 4096 original positions, betas 32 and 1.
// transformers scales the frequencies by max_position_embeddings / original_max_position_embeddings
// and the attention by `factor`: both must be the one --rotary-scaling-factor. mscale and
// mscale_all_dim are taken together (HF ignores mscale without mscale_all_dim).
Status read_deepseek_yarn(const ConfigReader& c, int64_t max_positions, ModelArgs* m) {
  const nlohmann::json& j = c.json().at("rope_scaling");
  const std::string why = "Gale's MLA YaRN has 4096 original positions, beta_fast 32, beta_slow 1, factor = "
                          "max_position_embeddings / 4096, and mscale with mscale_all_dim both set or both unset";
  if (!j.is_object()) return refuse(c, "rope_scaling", why);
  auto num = [&](const char* k, double fallback) {
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) return fallback;
    return it->is_number() ? it->get<double>() : -1.0;
  };
  const std::string type = j.value("rope_type", j.value("type", std::string()));
  const double factor = num("factor", -1.0);
  const double original = num("original_max_position_embeddings", static_cast<double>(max_positions));
  const double mscale = num("mscale", 0.0), mscale_all_dim = num("mscale_all_dim", 0.0);
  if (type != "yarn" || !(factor >= 1.0) || original != 4096.0 ||
      static_cast<double>(max_positions) != factor * original || num("beta_fast", 32.0) != 32.0 ||
      num("beta_slow", 1.0) != 1.0 || j.contains("attention_factor") || mscale < 0 || mscale_all_dim < 0 ||
      (mscale == 0.0) != (mscale_all_dim == 0.0))
    return refuse(c, "rope_scaling", why);
  m->rotary_scaling_factor = factor;
  m->mscale = mscale == 0.0 ? 1.0 : mscale;  // neither set: HF's m(s, 1) on cos/sin, Megatron's defaults 1 and 0
  m->mscale_all_dim = mscale_all_dim;
  return Status::Ok();
}

// DeepseekV3ForCausalLM: multi-latent attention with YaRN, first_k_dense_replace dense layers, then
// sigmoid-scored experts with a correction bias, group-limited routing and n_shared_experts
// ungated shared experts.
Status read_deepseek_v3(const ConfigReader& c, HfModel& out) {
  ModelArgs& m = out.model;
  MoeArgs& moe = out.moe;
  GALE_ASSIGN_OR_RETURN(m.hidden_size, c.positive("hidden_size"));
  GALE_ASSIGN_OR_RETURN(m.num_layers, c.positive("num_hidden_layers"));
  GALE_ASSIGN_OR_RETURN(m.num_attention_heads, c.positive("num_attention_heads"));
  GALE_ASSIGN_OR_RETURN(m.ffn_hidden_size, c.positive("intermediate_size"));
  GALE_ASSIGN_OR_RETURN(m.max_position_embeddings, c.positive("max_position_embeddings"));
  GALE_ASSIGN_OR_RETURN(m.norm_epsilon, c.number("rms_norm_eps", 1e-6));
  m.multi_latent_attention = true;
  m.qk_layernorm = true;  // q_a_layernorm and kv_a_layernorm always exist
  // q_lora_rank null (DeepSeek-V2-Lite's direct q_proj) is refused: transformers norms the key/value
  // latent (kv_a_layernorm) but not q_proj's input. Megatron-Core main cannot hold that: its MLA with
  // --qk-layernorm and no --q-lora-rank fuses a norm of x into linear_q_proj (QKNormConfigResolver,
  // linear_q_proj.layer_norm_weight, as Gale does), and without --qk-layernorm the latent has no norm.
  if (!c.set("q_lora_rank"))
    return Unimplemented(c.path(), ": 'q_lora_rank' is null (a direct query projection), which is not supported yet "
                         "(transformers norms only the key/value latent there; Megatron's --multi-latent-attention "
                         "with --qk-layernorm and no --q-lora-rank also norms linear_q_proj's input, and without "
                         "--qk-layernorm norms neither)");
  GALE_ASSIGN_OR_RETURN(m.q_lora_rank, c.positive("q_lora_rank"));
  GALE_ASSIGN_OR_RETURN(m.kv_lora_rank, c.positive("kv_lora_rank"));
  GALE_ASSIGN_OR_RETURN(m.qk_head_dim, c.positive("qk_nope_head_dim"));
  GALE_ASSIGN_OR_RETURN(m.qk_pos_emb_head_dim, c.positive("qk_rope_head_dim"));
  GALE_ASSIGN_OR_RETURN(m.v_head_dim, c.positive("v_head_dim"));
  if (m.qk_pos_emb_head_dim % 2 != 0)
    return InvalidArgument(c.path(), ": qk_rope_head_dim ", m.qk_pos_emb_head_dim, " must be even (RoPE rotates pairs)");
  // MLA has no query groups: num_key_value_heads is not used by DeepseekV3Attention.
  m.num_kv_heads = m.num_attention_heads;
  m.kv_channels = m.hidden_size % m.num_attention_heads == 0 ? m.hidden_size / m.num_attention_heads : m.v_head_dim;
  GALE_ASSIGN_OR_RETURN(std::string act, c.string("hidden_act", "silu"));
  if (act != "silu") return refuse(c, "hidden_act", "the MLP is SwiGLU: silu(gate) * up");
  GALE_ASSIGN_OR_RETURN(double theta, c.number("rope_theta", 10000.0));
  if (theta <= 0 || theta != std::floor(theta) || theta > 9.0e15)
    return refuse(c, "rope_theta", "Megatron's --rotary-base is a positive integer");
  m.rotary_base = static_cast<int64_t>(theta);
  if (c.set("rope_scaling")) GALE_RETURN_IF_ERROR(read_deepseek_yarn(c, m.max_position_embeddings, &m));
  GALE_ASSIGN_OR_RETURN(bool interleave, c.boolean("rope_interleave", true));
  if (!interleave)
    return refuse(c, "rope_interleave", "Gale's MLA rotates q_pe/k_pe in DeepSeek's interleaved layout");
  GALE_ASSIGN_OR_RETURN(bool attention_bias, c.boolean("attention_bias", false));
  if (attention_bias) return refuse(c, "attention_bias", "MLA's projections have no biases");
  if (c.set("quantization_config"))
    return refuse(c, "quantization_config", "quantized (fp8) weights; dequantize them to bf16 first");
  // Multi-token prediction: DeepSeek's files hold MTP layer k as model.layers.{num_hidden_layers + k}
  // (transformers ignores them); they become Megatron-Core's mtp.layers.{k} (--mtp-num-layers).
  GALE_ASSIGN_OR_RETURN(int64_t mtp, c.non_negative("num_nextn_predict_layers", 0));
  out.mtp_layers = out.mtp_layers_in_files = mtp;
  m.mtp_num_layers = mtp > 0 ? mtp : kUnset;
  GALE_ASSIGN_OR_RETURN(bool tie, c.boolean("tie_word_embeddings", false));
  // Layers 0 .. first_k_dense_replace - 1 have the dense MLP (DeepseekV3Config's default: 3).
  GALE_ASSIGN_OR_RETURN(int64_t dense, c.non_negative("first_k_dense_replace", 3));
  m.group_query_attention = false;
  m.num_query_groups = 1;
  m.normalization = "RMSNorm";
  m.position_embedding_type = "rope";
  m.swiglu = true;
  m.add_bias_linear = false;
  m.add_qkv_bias = false;
  m.untie_embeddings_and_output_weights = !tie;

  const int64_t L = m.num_layers;
  if (dense >= L) {
    // A dense DeepSeek-V3: every layer has the dense MLP (intermediate_size); transformers reads none of
    // the expert keys, so neither does Gale. Its MTP layers would be dense too, which Gale's
    // multi-token-prediction mapping (MoE layers, as in DeepSeek's files) does not hold.
    if (mtp > 0)
      return Unimplemented(c.path(), ": 'num_nextn_predict_layers' = ", mtp, " with 'first_k_dense_replace' = ",
                           dense, " >= num_hidden_layers ", L, ": multi-token-prediction layers of a dense DeepSeek-V3 "
                           "are not supported (Gale reads DeepSeek's MTP layers as MoE layers)");
    return Status::Ok();
  }
  GALE_ASSIGN_OR_RETURN(std::string scoring, c.string("scoring_func", "sigmoid"));
  if (scoring != "sigmoid") return refuse(c, "scoring_func", "DeepseekV3ForCausalLM's router scores are sigmoids");
  GALE_ASSIGN_OR_RETURN(std::string topk_method, c.string("topk_method", "noaux_tc"));
  if (topk_method != "noaux_tc")
    return refuse(c, "topk_method", "DeepseekV3ForCausalLM chooses experts by noaux_tc (scores + correction bias)");
  GALE_ASSIGN_OR_RETURN(int64_t layer_freq, c.positive("moe_layer_freq", 1));
  if (layer_freq != 1) return refuse(c, "moe_layer_freq", "transformers' DeepseekV3 has experts in every layer from first_k_dense_replace");
  GALE_ASSIGN_OR_RETURN(moe.num_experts, c.positive("n_routed_experts"));
  GALE_ASSIGN_OR_RETURN(moe.moe_router_topk, c.positive("num_experts_per_tok"));
  if (moe.moe_router_topk > moe.num_experts)
    return InvalidArgument(c.path(), ": num_experts_per_tok ", moe.moe_router_topk, " exceeds n_routed_experts ",
                           moe.num_experts);
  GALE_ASSIGN_OR_RETURN(moe.moe_ffn_hidden_size, c.positive("moe_intermediate_size"));
  GALE_ASSIGN_OR_RETURN(int64_t shared, c.positive("n_shared_experts"));
  moe.moe_shared_expert_intermediate_size = shared * moe.moe_ffn_hidden_size;
  moe.moe_shared_expert_gate = false;
  moe.moe_router_score_function = "sigmoid";
  moe.moe_router_enable_expert_bias = true;
  GALE_ASSIGN_OR_RETURN(moe.moe_router_topk_scaling_factor, c.number("routed_scaling_factor", 1.0));
  // Gale's sigmoid routing divides the k chosen scores by their sum (Megatron's); HF does so only
  // with norm_topk_prob.
  // With k = 1 Gale keeps σ (HF: σ / σ = 1 with norm_topk_prob).
  GALE_ASSIGN_OR_RETURN(bool norm_topk, c.boolean("norm_topk_prob", true));
  if (norm_topk != (moe.moe_router_topk > 1))
    return refuse(c, "norm_topk_prob", "Gale's sigmoid routing divides the chosen scores by their sum when "
                  "num_experts_per_tok > 1 and keeps the score when it is 1");
  GALE_ASSIGN_OR_RETURN(int64_t groups, c.positive("n_group", 1));
  GALE_ASSIGN_OR_RETURN(int64_t topk_group, c.positive("topk_group", 1));
  if (moe.num_experts % groups != 0 || topk_group > groups)
    return InvalidArgument(c.path(), ": n_group ", groups, " must divide n_routed_experts ", moe.num_experts,
                           " and be at least topk_group ", topk_group);
  if (topk_group < groups) {
    // HF scores a group by the sum of its 2 best (score + bias) values; Megatron by its k / topk_group best.
    if (moe.moe_router_topk % topk_group != 0 || moe.moe_router_topk / topk_group != 2)
      return refuse(c, "topk_group", "Gale scores a group by its num_experts_per_tok / topk_group best experts; "
                    "transformers by its 2 best, so num_experts_per_tok must be 2 x topk_group");
    moe.moe_router_num_groups = groups;
    moe.moe_router_group_topk = topk_group;
  }
  GALE_ASSIGN_OR_RETURN(moe.moe_aux_loss_coeff, c.number("aux_loss_alpha", 0.0));
  moe.layer_pattern.assign(static_cast<size_t>(L), 1);
  for (int64_t i = 0; i < dense; ++i) moe.layer_pattern[static_cast<size_t>(i)] = 0;
  moe.moe_layer_freq = "[";
  for (int64_t i = 0; i < L; ++i) moe.moe_layer_freq += (i ? "," : "") + std::to_string(moe.layer_pattern[i]);
  moe.moe_layer_freq += "]";
  return Status::Ok();
}

Status read_gpt2(const ConfigReader& c, HfModel& out) {
  ModelArgs& m = out.model;
  GALE_ASSIGN_OR_RETURN(m.hidden_size, c.positive("n_embd"));
  GALE_ASSIGN_OR_RETURN(m.num_layers, c.positive("n_layer"));
  GALE_ASSIGN_OR_RETURN(m.num_attention_heads, c.positive("n_head"));
  GALE_ASSIGN_OR_RETURN(m.ffn_hidden_size, c.positive("n_inner", 4 * m.hidden_size));
  GALE_ASSIGN_OR_RETURN(m.max_position_embeddings, c.positive("n_positions"));
  GALE_ASSIGN_OR_RETURN(m.norm_epsilon, c.number("layer_norm_epsilon", 1e-5));
  GALE_ASSIGN_OR_RETURN(std::string act, c.string("activation_function", "gelu_new"));
  // gelu_new, gelu_pytorch_tanh and gelu_fast are the same tanh formula: Megatron's --openai-gelu.
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast")
    m.openai_gelu = true;
  else if (act != "gelu")
    return refuse(c, "activation_function", "Gale's GPT-2 MLP uses GeLU (exact, or the tanh approximation)");
  GALE_ASSIGN_OR_RETURN(bool scale, c.boolean("scale_attn_weights", true));
  if (!scale) return refuse(c, "scale_attn_weights", "Gale scales attention scores by 1/sqrt(head dim)");
  GALE_ASSIGN_OR_RETURN(bool by_layer, c.boolean("scale_attn_by_inverse_layer_idx", false));
  if (by_layer) return refuse(c, "scale_attn_by_inverse_layer_idx", "per-layer attention scaling");
  GALE_ASSIGN_OR_RETURN(bool tie, c.boolean("tie_word_embeddings", true));
  if (!tie) return refuse(c, "tie_word_embeddings", "GPT2LMHeadModel's output layer is the word embedding");
  if (m.hidden_size % m.num_attention_heads != 0)
    return InvalidArgument(c.path(), ": n_embd ", m.hidden_size, " is not a multiple of n_head ", m.num_attention_heads);
  m.num_kv_heads = m.num_attention_heads;
  m.kv_channels = m.hidden_size / m.num_attention_heads;
  m.normalization = "LayerNorm";
  m.position_embedding_type = "learned_absolute";
  m.add_bias_linear = true;
  m.swiglu = false;
  m.untie_embeddings_and_output_weights = false;
  return Status::Ok();
}

// The sequence length a Bloom model is recorded with when its config.json names none: Bloom's
// training length (ALiBi has no position table, so HF keeps no max_position_embeddings).
constexpr int64_t kBloomDefaultSeqLength = 2048;

// BloomForCausalLM: ALiBi, LayerNorm after the word embedding (--embed-layernorm), LayerNorm blocks
// with biases everywhere, fused per-head query_key_value, a 4H MLP with Bloom's tanh GeLU
// (--openai-gelu), the output layer tied to the embedding.
Status read_bloom(const ConfigReader& c, HfModel& out) {
  ModelArgs& m = out.model;
  // Older configs (bigscience/bloom-*) spell the sizes n_embed / num_attention_heads; BloomConfig
  // writes hidden_size / n_layer / n_head, and leaves out those equal to its defaults (64, 2, 8),
  // which transformers fills back in, as here.
  GALE_ASSIGN_OR_RETURN(m.hidden_size, c.set("n_embed") ? c.positive("n_embed") : c.positive("hidden_size", 64));
  GALE_ASSIGN_OR_RETURN(m.num_layers,
                        c.set("num_hidden_layers") ? c.positive("num_hidden_layers") : c.positive("n_layer", 2));
  GALE_ASSIGN_OR_RETURN(m.num_attention_heads,
                        c.set("num_attention_heads") ? c.positive("num_attention_heads") : c.positive("n_head", 8));
  GALE_ASSIGN_OR_RETURN(m.norm_epsilon, c.number("layer_norm_epsilon", 1e-5));
  GALE_ASSIGN_OR_RETURN(m.max_position_embeddings, c.positive("seq_length", kBloomDefaultSeqLength));
  GALE_ASSIGN_OR_RETURN(bool post_ln, c.boolean("apply_residual_connection_post_layernorm", false));
  if (post_ln)
    return refuse(c, "apply_residual_connection_post_layernorm", "Gale's residual is the block's input (pre-norm)");
  GALE_ASSIGN_OR_RETURN(bool slow_exact, c.boolean("slow_but_exact", false));
  if (slow_exact)
    return refuse(c, "slow_but_exact", "Gale computes each linear layer in one GEMM (pretraining_tp slices off)");
  GALE_ASSIGN_OR_RETURN(bool tie, c.boolean("tie_word_embeddings", true));
  if (!tie) return refuse(c, "tie_word_embeddings", "BloomForCausalLM's output layer is the word embedding");
  if (m.hidden_size % m.num_attention_heads != 0)
    return InvalidArgument(c.path(), ": hidden_size ", m.hidden_size, " is not a multiple of the ",
                           m.num_attention_heads, " heads");
  m.num_kv_heads = m.num_attention_heads;
  m.kv_channels = m.hidden_size / m.num_attention_heads;
  m.ffn_hidden_size = 4 * m.hidden_size;
  m.normalization = "LayerNorm";
  m.position_embedding_type = "alibi";
  m.embed_layernorm = true;
  m.openai_gelu = true;  // bloom_gelu_forward: the tanh approximation
  m.add_bias_linear = true;
  m.swiglu = false;
  m.untie_embeddings_and_output_weights = false;
  return Status::Ok();
}

// Mixtral's experts as Megatron's MoE flags: every layer is a MoE layer of SwiGLU experts.
Status read_mixtral_experts(const ConfigReader& c, HfModel& out) {
  MoeArgs& moe = out.moe;
  GALE_ASSIGN_OR_RETURN(moe.num_experts, c.positive("num_local_experts"));
  GALE_ASSIGN_OR_RETURN(moe.moe_router_topk, c.positive("num_experts_per_tok"));
  if (moe.moe_router_topk > moe.num_experts)
    return InvalidArgument(c.path(), ": num_experts_per_tok ", moe.moe_router_topk, " exceeds num_local_experts ",
                           moe.num_experts);
  GALE_ASSIGN_OR_RETURN(double jitter, c.number("router_jitter_noise", 0.0));
  if (jitter != 0.0) return refuse(c, "router_jitter_noise", "router input jitter");
  GALE_ASSIGN_OR_RETURN(moe.moe_aux_loss_coeff, c.number("router_aux_loss_coef", 0.001));
  moe.moe_ffn_hidden_size = out.model.ffn_hidden_size;
  moe.moe_layer_freq = "1";
  moe.layer_pattern.assign(static_cast<size_t>(out.model.num_layers), 1);
  return Status::Ok();
}

// Qwen2-MoE's and Qwen3-MoE's experts (and Qwen2-MoE's shared expert) as Megatron's MoE flags. The
// expert count is num_experts (the Hub's configs, transformers 4.x) or num_local_experts (what
// transformers 5.x writes: its configs map num_experts to it); both given, they must agree.
Status read_qwen_moe_experts(const ConfigReader& c, const nlohmann::json& j, HfModel& out) {
  MoeArgs& moe = out.moe;
  const int64_t L = out.model.num_layers;
  const bool qwen2 = out.arch == HfArchitecture::kQwen2Moe;
  const bool shared_expert = qwen2 || out.arch == HfArchitecture::kQwen3Next;
  const char* experts_key = c.set("num_experts") || !c.set("num_local_experts") ? "num_experts" : "num_local_experts";
  if (out.arch == HfArchitecture::kQwen3Next && c.set(experts_key)) {  // 0 experts: every MLP dense
    GALE_ASSIGN_OR_RETURN(int64_t n, c.non_negative(experts_key, 0));
    if (n == 0) return Status::Ok();
  }
  GALE_ASSIGN_OR_RETURN(moe.num_experts, c.positive(experts_key));
  if (c.set("num_experts") && c.set("num_local_experts")) {
    GALE_ASSIGN_OR_RETURN(int64_t local, c.positive("num_local_experts"));
    if (local != moe.num_experts)
      return InvalidArgument(c.path(), ": 'num_experts' ", moe.num_experts, " and 'num_local_experts' ", local,
                             " disagree (expected one expert count)");
  }
  GALE_ASSIGN_OR_RETURN(moe.moe_router_topk, c.positive("num_experts_per_tok"));
  if (moe.moe_router_topk > moe.num_experts)
    return InvalidArgument(c.path(), ": num_experts_per_tok ", moe.moe_router_topk, " exceeds ", experts_key, " ",
                           moe.num_experts);
  GALE_ASSIGN_OR_RETURN(moe.moe_ffn_hidden_size, c.positive("moe_intermediate_size"));
  if (shared_expert) {
    GALE_ASSIGN_OR_RETURN(moe.moe_shared_expert_intermediate_size, c.positive("shared_expert_intermediate_size"));
    moe.moe_shared_expert_gate = true;  // Qwen2-MoE and Qwen3-Next always gate their shared expert
  }
  // Both route by softmax over all experts, then the top k; norm_topk_prob true renormalises over
  // the k (Megatron's default: top-k of the logits, softmax over the k), false keeps the
  // probabilities (--moe-router-pre-softmax).
  GALE_ASSIGN_OR_RETURN(bool norm_topk, c.boolean("norm_topk_prob", false));
  moe.moe_router_pre_softmax = !norm_topk;
  GALE_ASSIGN_OR_RETURN(moe.moe_aux_loss_coeff, c.number("router_aux_loss_coef", 0.001));
  GALE_ASSIGN_OR_RETURN(int64_t step, c.positive("decoder_sparse_step", 1));
  std::vector<int> pattern(static_cast<size_t>(L), 0);
  for (int64_t i = 0; i < L; ++i) pattern[i] = (i + 1) % step == 0 ? 1 : 0;
  auto only = j.find("mlp_only_layers");
  if (only != j.end() && !only->is_null()) {
    if (!only->is_array()) return InvalidArgument(c.path(), ": 'mlp_only_layers' must be a list of layer indices, found ", only->dump());
    for (const nlohmann::json& v : *only) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= L)
        return InvalidArgument(c.path(), ": 'mlp_only_layers' must hold layer indices 0 to ", L - 1, ", found ",
                               only->dump());
      pattern[v.get<int64_t>()] = 0;
    }
  }
  if (std::none_of(pattern.begin(), pattern.end(), [](int f) { return f == 1; })) {
    if (out.arch == HfArchitecture::kQwen3Next) {  // every MLP dense (Qwen3NextMLP of intermediate_size)
      moe = MoeArgs{};
      return Status::Ok();
    }
    return Unimplemented(c.path(), ": 'decoder_sparse_step' / 'mlp_only_layers' leave no sparse layer; convert it as "
                         "a dense model (", qwen2 ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM", ") instead");
  }
  moe.layer_pattern = pattern;
  moe.moe_layer_freq = "[";
  for (int64_t i = 0; i < L; ++i) moe.moe_layer_freq += (i ? "," : "") + std::to_string(pattern[i]);
  moe.moe_layer_freq += "]";
  return Status::Ok();
}

// sliding_window W -> --sliding-window W when it is active in some layer and shorter than
// max_position_embeddings (a longer window hides nothing). Mistral / Mixtral: every layer, unless
// sliding_window is null (absent: transformers' default, 4096 for Mistral, none for Mixtral). Qwen2 /
// Qwen2-MoE / Qwen3: only with use_sliding_window, and then in the layers i >= max_window_layers
// (default 28), or those layer_types names "sliding_attention" (transformers >= 4.53's Qwen2Config and
// Qwen3Config, which derive layer_types from max_window_layers when it is absent). A window in only some
// layers of a Qwen2 / Qwen3 (`per_layer`) is --window-attn-skip-freq as the per-layer list (1: windowed,
// Megatron's is_layer_window_attention); Qwen2-MoE's is refused (transformers' Qwen2MoeConfig has no
// layer_types and its attention implementations window different layers).
Status read_sliding_window(const ConfigReader& c, int64_t num_layers, bool mistral_like, bool mistral, bool per_layer,
                           ModelArgs* m) {
  GALE_ASSIGN_OR_RETURN(bool use_window, c.boolean("use_sliding_window", mistral_like));
  const bool absent = !c.json().contains("sliding_window");
  if (!use_window || (!c.set("sliding_window") && !(absent && mistral))) return Status::Ok();
  GALE_ASSIGN_OR_RETURN(int64_t window, c.positive("sliding_window", 4096));  // MistralConfig's default
  std::vector<int> windowed(static_cast<size_t>(num_layers), 1);  // 1: the layer has the window
  if (!mistral_like) {
    GALE_ASSIGN_OR_RETURN(int64_t max_window_layers, c.non_negative("max_window_layers", 28));
    for (int64_t i = 0; i < num_layers; ++i) windowed[static_cast<size_t>(i)] = i >= max_window_layers ? 1 : 0;
    if (c.set("layer_types")) {
      const nlohmann::json& types = c.json().at("layer_types");
      if (!types.is_array() || static_cast<int64_t>(types.size()) != num_layers)
        return InvalidArgument(c.path(), ": 'layer_types' must list ", num_layers, " layer types, found ", types.dump());
      for (int64_t i = 0; i < num_layers; ++i) {
        if (types[i] != "sliding_attention" && types[i] != "full_attention")
          return InvalidArgument(c.path(), ": 'layer_types' must hold \"sliding_attention\" or \"full_attention\", "
                                 "found ", types.dump());
        windowed[static_cast<size_t>(i)] = types[i] == "sliding_attention" ? 1 : 0;
      }
    }
    const int64_t count = std::count(windowed.begin(), windowed.end(), 1);
    if (count > 0 && count < num_layers && !per_layer)
      return Unimplemented(c.path(), ": 'sliding_window' = ", window, " is used by ", count, " of ", num_layers,
                           " layers (max_window_layers ", max_window_layers, "); per-layer windows are read for "
                           "Qwen2ForCausalLM and Qwen3ForCausalLM only (transformers' Qwen2-MoE windows different "
                           "layers in different attention implementations)");
  }
  const int64_t count = std::count(windowed.begin(), windowed.end(), 1);
  if (count == 0 || window >= m->max_position_embeddings) return Status::Ok();
  m->sliding_window = window;
  if (count < num_layers) {
    m->window_attn_pattern = windowed;
    m->window_attn_skip_freq = nlohmann::json(windowed).dump();
  }
  return Status::Ok();
}

// Qwen3-Next's attention and norms (its MoE blocks: read_qwen_moe_experts): layer_types (or, as the
// Hub's configs say, full_attention_interval N: layer i full attention when (i + 1) % N == 0) ->
// --experimental-attention-variant gdn --linear-attention-freq as a list (1: linear_attention);
// linear_conv_kernel_dim, linear_{key,value}_head_dim, linear_num_{key,value}_heads -> Megatron's
// --linear-* sizes; the full-attention layers' q_proj [query | gate] per head -> --attention-output-gate,
// q_norm / k_norm -> --qk-layernorm; zero-centred RMSNorms (1 + w) -> --apply-layernorm-1p;
// partial_rotary_factor (top level, or in transformers 5.x's rope_parameters; default 0.25) ->
// --rotary-percent.
Status read_qwen3_next(const ConfigReader& c, HfModel& out) {
  ModelArgs& m = out.model;
  const int64_t L = m.num_layers;
  std::vector<int> pattern(static_cast<size_t>(L), 1);
  if (c.set("layer_types")) {
    const nlohmann::json& types = c.json().at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != L)
      return InvalidArgument(c.path(), ": 'layer_types' must list ", L, " layer types, found ", types.dump());
    for (int64_t i = 0; i < L; ++i) {
      if (types[i] == "full_attention") pattern[i] = 0;
      else if (types[i] != "linear_attention")
        return InvalidArgument(c.path(), ": 'layer_types' must hold \"linear_attention\" or \"full_attention\", found ",
                               types.dump());
    }
  } else {
    GALE_ASSIGN_OR_RETURN(int64_t interval, c.positive("full_attention_interval", 4));
    for (int64_t i = 0; i < L; ++i) pattern[i] = (i + 1) % interval == 0 ? 0 : 1;
  }
  // No linear_attention layer: every layer is gated full attention, --attention-output-gate without
  // --experimental-attention-variant (transformers 4.57.1 then needs use_cache false: its
  // Qwen3NextDynamicCache looks for the last linear_attention layer).
  if (std::any_of(pattern.begin(), pattern.end(), [](int f) { return f == 1; })) {
    m.experimental_attention_variant = "gdn";
    m.linear_attention_pattern = pattern;
    m.linear_attention_freq = "[";
    for (int64_t i = 0; i < L; ++i) m.linear_attention_freq += (i ? "," : "") + std::to_string(pattern[i]);
    m.linear_attention_freq += "]";
  }
  GALE_ASSIGN_OR_RETURN(m.linear_conv_kernel_dim, c.positive("linear_conv_kernel_dim", 4));
  GALE_ASSIGN_OR_RETURN(m.linear_key_head_dim, c.positive("linear_key_head_dim", 128));
  GALE_ASSIGN_OR_RETURN(m.linear_value_head_dim, c.positive("linear_value_head_dim", 128));
  GALE_ASSIGN_OR_RETURN(m.linear_num_key_heads, c.positive("linear_num_key_heads", 16));
  GALE_ASSIGN_OR_RETURN(m.linear_num_value_heads, c.positive("linear_num_value_heads", 32));
  if (m.linear_num_value_heads % m.linear_num_key_heads != 0)
    return InvalidArgument(c.path(), ": linear_num_value_heads ", m.linear_num_value_heads,
                           " is not a multiple of linear_num_key_heads ", m.linear_num_key_heads);
  double factor = 0.25;  // Qwen3NextConfig's default
  const nlohmann::json& j = c.json();
  auto rope = j.find("rope_parameters");
  const nlohmann::json* f = j.contains("partial_rotary_factor") ? &j.at("partial_rotary_factor")
                            : rope != j.end() && rope->is_object() && rope->contains("partial_rotary_factor")
                                ? &rope->at("partial_rotary_factor")
                                : nullptr;
  if (f != nullptr && !f->is_null()) {
    const double rot = f->is_number() ? f->get<double>() * static_cast<double>(m.kv_channels) : -1.0;
    if (!f->is_number() || !(f->get<double>() > 0.0 && f->get<double>() <= 1.0) || rot != std::floor(rot) ||
        static_cast<int64_t>(rot) % 2 != 0)
      return InvalidArgument(c.path(), ": 'partial_rotary_factor' must be in (0, 1] and give an even number of rotary "
                             "channels of head_dim ", m.kv_channels, ", found ", f->dump());
    factor = f->get<double>();
  }
  m.rotary_percent = factor;
  // transformers 5.x saves rope_theta inside rope_parameters (Gale writes it there too); only the
  // default (unscaled) rotary type is read.
  if (rope != j.end() && rope->is_object()) {
    if (rope->contains("rope_type") && rope->at("rope_type") != "default")
      return Unimplemented(c.path(), ": 'rope_parameters' rope_type ", rope->at("rope_type").dump(),
                           " is not supported yet for Qwen3NextForCausalLM (expected \"default\")");
    if (!c.set("rope_theta") && rope->contains("rope_theta")) {
      const nlohmann::json& t = rope->at("rope_theta");
      if (!t.is_number() || t.get<double>() <= 0 || t.get<double>() != std::floor(t.get<double>()) ||
          t.get<double>() > 9.0e15)
        return InvalidArgument(c.path(), ": 'rope_parameters' rope_theta must be a positive integer (Megatron's "
                               "--rotary-base), found ", t.dump());
      m.rotary_base = static_cast<int64_t>(t.get<double>());
    }
  }
  m.attention_output_gate = true;
  m.qk_layernorm = true;
  m.apply_layernorm_1p = true;
  return Status::Ok();
}

// transformers' GptOssExperts clamps the gate at this limit and up at +-it (hard-coded in 4.55 to 4.57;
// config.json's swiglu_limit is the original model's value).
constexpr double kGptOssSwigluLimit = 7.0;

// GptOssForCausalLM: LLaMA-shaped attention with q/k/v/o biases and a learned sink logit per head
// (--add-bias-linear, --softmax-type learnable), layer_types sliding_attention / full_attention ->
// --sliding-window W with --window-attn-skip-freq as a list (1: sliding) when they mix, rope_scaling
// (yarn, as gpt-oss ships it) as the LLaMA family's, and in every layer num_local_experts experts
// with a biased router (Megatron's routing: the top k of the logits, softmax over the k) and
// gpt-oss's activation (--quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7).
Status read_gpt_oss(const ConfigReader& c, HfModel& out) {
  ModelArgs& m = out.model;
  MoeArgs& moe = out.moe;
  GALE_ASSIGN_OR_RETURN(m.hidden_size, c.positive("hidden_size"));
  GALE_ASSIGN_OR_RETURN(m.num_layers, c.positive("num_hidden_layers"));
  GALE_ASSIGN_OR_RETURN(m.num_attention_heads, c.positive("num_attention_heads"));
  GALE_ASSIGN_OR_RETURN(m.num_kv_heads, c.positive("num_key_value_heads", m.num_attention_heads));
  GALE_ASSIGN_OR_RETURN(m.kv_channels, c.positive("head_dim", 64));  // GptOssConfig's default
  GALE_ASSIGN_OR_RETURN(m.ffn_hidden_size, c.positive("intermediate_size"));
  GALE_ASSIGN_OR_RETURN(m.max_position_embeddings, c.positive("max_position_embeddings"));
  GALE_ASSIGN_OR_RETURN(m.norm_epsilon, c.number("rms_norm_eps", 1e-5));
  if (m.num_attention_heads % m.num_kv_heads != 0)
    return InvalidArgument(c.path(), ": num_attention_heads ", m.num_attention_heads,
                           " is not a multiple of num_key_value_heads ", m.num_kv_heads);
  if (c.set("quantization_config"))
    return refuse(c, "quantization_config", "quantized (MXFP4) expert weights; Gale reads bf16 or f32 safetensors "
                  "only: dequantize the checkpoint to bf16 first");
  GALE_ASSIGN_OR_RETURN(double theta, c.number("rope_theta", 150000.0));
  if (theta <= 0 || theta != std::floor(theta) || theta > 9.0e15)
    return refuse(c, "rope_theta", "Megatron's --rotary-base is a positive integer");
  m.rotary_base = static_cast<int64_t>(theta);
  m.position_embedding_type = "rope";
  if (c.set("rope_scaling")) GALE_RETURN_IF_ERROR(read_llama_rope_scaling(c, &m));
  GALE_ASSIGN_OR_RETURN(bool attention_bias, c.boolean("attention_bias", true));
  if (!attention_bias)
    return refuse(c, "attention_bias", "gpt-oss's experts and router have biases; Gale's --add-bias-linear also "
                  "gives q/k/v/o theirs");
  GALE_ASSIGN_OR_RETURN(double limit, c.number("swiglu_limit", kGptOssSwigluLimit));
  if (limit != kGptOssSwigluLimit)
    return refuse(c, "swiglu_limit", "transformers' GptOssExperts clamps at 7.0 whatever the config says");
  GALE_ASSIGN_OR_RETURN(bool tie, c.boolean("tie_word_embeddings", false));
  // layer_types (absent: transformers' default, sliding_attention in the even layers 0, 2, ...).
  std::vector<int> windowed(static_cast<size_t>(m.num_layers));
  for (int64_t i = 0; i < m.num_layers; ++i) windowed[static_cast<size_t>(i)] = (i + 1) % 2 != 0;
  if (c.set("layer_types")) {
    const nlohmann::json& types = c.json().at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != m.num_layers)
      return InvalidArgument(c.path(), ": 'layer_types' must list ", m.num_layers, " layer types, found ", types.dump());
    for (int64_t i = 0; i < m.num_layers; ++i) {
      if (types[i] != "sliding_attention" && types[i] != "full_attention")
        return InvalidArgument(c.path(), ": 'layer_types' must hold \"sliding_attention\" or \"full_attention\", found ",
                               types.dump());
      windowed[static_cast<size_t>(i)] = types[i] == "sliding_attention";
    }
  }
  const int64_t sliding = std::count(windowed.begin(), windowed.end(), 1);
  if (sliding > 0) {
    GALE_ASSIGN_OR_RETURN(m.sliding_window, c.positive("sliding_window", 128));  // GptOssConfig's default
    if (sliding < m.num_layers) {
      m.window_attn_pattern = windowed;
      m.window_attn_skip_freq = nlohmann::json(windowed).dump();
    }
  }
  GALE_ASSIGN_OR_RETURN(moe.num_experts, c.positive("num_local_experts"));
  GALE_ASSIGN_OR_RETURN(moe.moe_router_topk, c.positive("num_experts_per_tok"));
  if (moe.moe_router_topk > moe.num_experts)
    return InvalidArgument(c.path(), ": num_experts_per_tok ", moe.moe_router_topk, " exceeds num_local_experts ",
                           moe.num_experts);
  GALE_ASSIGN_OR_RETURN(moe.moe_aux_loss_coeff, c.number("router_aux_loss_coef", 0.9));
  moe.moe_ffn_hidden_size = m.ffn_hidden_size;
  moe.moe_layer_freq = "1";
  moe.layer_pattern.assign(static_cast<size_t>(m.num_layers), 1);
  m.group_query_attention = m.num_kv_heads != m.num_attention_heads;
  m.num_query_groups = m.group_query_attention ? m.num_kv_heads : 1;
  m.normalization = "RMSNorm";
  m.swiglu = false;
  m.quick_geglu = true;
  m.glu_linear_offset = 1.0;
  m.activation_func_clamp_value = kGptOssSwigluLimit;
  m.softmax_type = "learnable";
  m.add_bias_linear = true;
  m.add_qkv_bias = false;
  m.untie_embeddings_and_output_weights = !tie;
  return Status::Ok();
}

// InternLM2's own keys: "bias" (InternLM2Config's default true: wqkv and wo biases, which Megatron's
// --add-bias-linear would extend to the MLP) must be false; rope_scaling {"type", "factor"} is linear
// (-> --rotary-seq-len-interpolation-factor) or dynamic NTK, which InternLM2DynamicNTKScalingRotaryEmbedding
// applies only past max_position_embeddings: plain RoPE up to there (kept for the way back).
Status read_internlm2(const ConfigReader& c, HfModel& out) {
  GALE_ASSIGN_OR_RETURN(bool bias, c.boolean("bias", true));
  if (bias)
    return Unimplemented(c.path(), ": 'bias' = ", c.set("bias") ? c.dump("bias") : std::string("absent (InternLM2Config's "
                         "default true)"), " is not supported yet (biases on attention.wqkv and attention.wo only; "
                         "Megatron's --add-bias-linear also puts them on the MLP)");
  if (!c.set("rope_scaling")) return Status::Ok();
  const nlohmann::json& j = c.json().at("rope_scaling");
  const std::string why = "InternLM2's rope_scaling is {\"type\": \"linear\" or \"dynamic\", \"factor\": >= 1}; Gale "
                          "reads linear as --rotary-seq-len-interpolation-factor and dynamic as plain RoPE up to "
                          "max_position_embeddings";
  if (!j.is_object() || !j.contains("factor") || !j["factor"].is_number() || j["factor"].get<double>() < 1.0)
    return refuse(c, "rope_scaling", why);
  const std::string type = j.value("type", j.value("rope_type", std::string()));
  const double factor = j["factor"].get<double>();
  if (type == "linear") {
    out.model.rotary_seq_len_interpolation_factor = factor;
  } else if (type == "dynamic") {
    out.internlm2_dynamic_rope = j;
    out.warnings.push_back(str_cat(c.path(), ": rope_scaling dynamic (factor ", factor, ") is read as plain RoPE: "
                                   "InternLM2 rescales RoPE only for sequences longer than max_position_embeddings ",
                                   out.model.max_position_embeddings, ", which Gale does not do (exact up to --seq-length ",
                                   out.model.max_position_embeddings, ")"));
  } else {
    return refuse(c, "rope_scaling", why);
  }
  return Status::Ok();
}

// Gemma's MLP activation: hidden_activation when set, else hidden_act (transformers' GemmaConfig
// default gelu_pytorch_tanh): the tanh GeLU is --gelu-tanh, the exact one --geglu. Gemma v1's
// original config.json says hidden_act "gelu" without hidden_activation, which transformers 4.40 to
// 4.45 ran as gelu_pytorch_tanh: a warning says which one Gale takes.
// Gemma-2's MLP reads hidden_activation alone (absent: gelu_pytorch_tanh).
Status read_gemma_activation(const ConfigReader& c, HfModel& out) {
  const bool explicit_activation =
      c.set("hidden_activation") || out.arch == HfArchitecture::kGemma2 || out.arch == HfArchitecture::kGemma3;
  GALE_ASSIGN_OR_RETURN(std::string act, explicit_activation ? c.string("hidden_activation", "gelu_pytorch_tanh")
                                                             : c.string("hidden_act", "gelu_pytorch_tanh"));
  const char* key = explicit_activation ? "hidden_activation" : "hidden_act";
  if (act == "gelu_pytorch_tanh" || act == "gelu_new") {
    out.model.gelu_tanh = true;
  } else if (act == "gelu") {
    out.model.geglu = true;
    if (!explicit_activation)
      out.warnings.push_back(str_cat(c.path(), ": hidden_act \"gelu\" without hidden_activation: converted as the "
                                     "exact GeLU (--geglu); transformers 4.40 to 4.45 ran such Gemma configs with "
                                     "gelu_pytorch_tanh (--gelu-tanh)"));
  } else {
    return refuse(c, key, "Gemma's MLP is GeGLU with gelu_pytorch_tanh / gelu_new (--gelu-tanh) or gelu (--geglu)");
  }
  return Status::Ok();
}

// Phi-3's rope_scaling longrope / su (Phi-3-mini-128k, Phi-3.5) as MindSpeed-LLM's --rope-scaling-type longrope,
// read as transformers' _compute_longrope_parameters: short_factor / long_factor (head_dim / 2 numbers each),
// the original context from rope_scaling or else the config's top level, attention_factor (optional) as both
// --short-mscale and --long-mscale; unset, both use sqrt(1 + ln(max / original) / ln(original)) (Gale's default).
Status read_phi3_longrope(const ConfigReader& c, ModelArgs* m) {
  const nlohmann::json& rs = c.json().at("rope_scaling");
  const std::string why = "Phi-3's rope_scaling is null or {\"type\" (or \"rope_type\"): \"longrope\" or \"su\", "
                          "\"short_factor\" and \"long_factor\": head_dim / 2 positive numbers each, optional "
                          "\"attention_factor\" > 0 and \"original_max_position_embeddings\"}";
  if (!rs.is_object()) return refuse(c, "rope_scaling", why);
  const std::string type = rs.value("type", rs.value("rope_type", std::string()));
  if (type != "longrope" && type != "su") return refuse(c, "rope_scaling", why);
  for (const auto& [key, value] : rs.items())
    if (key != "type" && key != "rope_type" && key != "short_factor" && key != "long_factor" &&
        key != "attention_factor" && key != "original_max_position_embeddings")
      return refuse(c, "rope_scaling", why + "; transformers' Phi-3 ignores '" + key + "'");
  const int64_t half = m->kv_channels / 2;
  for (const char* key : {"short_factor", "long_factor"}) {
    auto f = rs.find(key);
    if (f == rs.end() || !f->is_array() || static_cast<int64_t>(f->size()) != half ||
        !std::all_of(f->begin(), f->end(), [](const nlohmann::json& v) { return v.is_number() && v.get<double>() > 0; }))
      return refuse(c, "rope_scaling", why + "; expected " + std::to_string(half) + " '" + key + "' entries");
    const bool is_short = key == std::string("short_factor");
    std::vector<double>& values = is_short ? m->short_factors : m->long_factors;
    values = f->get<std::vector<double>>();
    (is_short ? m->short_factor : m->long_factor) = longrope_factor_text(values);
  }
  int64_t original = kUnset;
  if (auto o = rs.find("original_max_position_embeddings"); o != rs.end() && !o->is_null()) {
    if (!o->is_number_integer() || o->get<int64_t>() <= 1) return refuse(c, "rope_scaling", why);
    original = o->get<int64_t>();
  }
  if (c.set("original_max_position_embeddings")) {
    GALE_ASSIGN_OR_RETURN(int64_t top, c.positive("original_max_position_embeddings"));
    if (original != kUnset && original != top)
      return InvalidArgument(c.path(), ": original_max_position_embeddings ", top, " and rope_scaling's ", original,
                             " differ (expected one original context)");
    original = top;
  }
  if (original == kUnset || original <= 1)
    return InvalidArgument(c.path(), ": rope_scaling longrope needs original_max_position_embeddings > 1 (the context "
                           "the short factors hold up to), found ",
                           original == kUnset ? std::string("none") : std::to_string(original));
  if (auto a = rs.find("attention_factor"); a != rs.end() && !a->is_null()) {
    if (!a->is_number() || !(a->get<double>() > 0)) return refuse(c, "rope_scaling", why);
    m->short_mscale = m->long_mscale = a->get<double>();
  }
  m->rope_scaling_type = "longrope";
  m->rope_scaling_original_max_position_embeddings = original;
  return Status::Ok();
}

// Phi-3's own keys: partial_rotary_factor 1 only, rope_scaling null or longrope / su (read_phi3_longrope),
// sliding_window as Mistral's (read_sliding_window).
Status read_phi3(const ConfigReader& c, ModelArgs* m) {
  GALE_ASSIGN_OR_RETURN(double partial, c.number("partial_rotary_factor", 1.0));
  if (partial != 1.0)
    return refuse(c, "partial_rotary_factor", "Phi3ForCausalLM is read with RoPE over the whole head only");
  if (c.set("rope_scaling")) GALE_RETURN_IF_ERROR(read_phi3_longrope(c, m));
  return read_sliding_window(c, m->num_layers, /*mistral_like=*/true, /*mistral=*/false, /*per_layer=*/false, m);
}

// Baichuan2-7B's own keys: multi-head attention only (W_pack is [q; k; v] of equal parts), RoPE with the base
// 10000 that its RotaryEmbedding fixes (a rope_theta other than that is refused: modeling_baichuan.py ignores it),
// no rope_scaling, z_loss_weight 0 (a training-loss term Gale does not have).
Status read_baichuan(const ConfigReader& c, const ModelArgs& m) {
  if (m.num_kv_heads != m.num_attention_heads)
    return refuse(c, "num_key_value_heads", "Baichuan's W_pack is multi-head: [q; k; v] of hidden_size rows each");
  if (c.set("rope_theta") && m.rotary_base != 10000)
    return refuse(c, "rope_theta", "Baichuan2-7B's RotaryEmbedding has the base 10000 and reads no rope_theta");
  if (c.set("rope_scaling")) return refuse(c, "rope_scaling", "Baichuan2-7B's RoPE is unscaled");
  GALE_ASSIGN_OR_RETURN(double z_loss, c.number("z_loss_weight", 0.0));
  if (z_loss != 0.0)
    return refuse(c, "z_loss_weight", "Baichuan's z-loss (z_loss_weight x logsumexp(logits)^2 added to the training "
                  "loss) is not in Gale's loss; 0 (the released models) only");
  return Status::Ok();
}

// ChatGLM3 / GLM-4 (THUDM's modeling_chatglm.py): its own key names for a pre-norm RMSNorm, SwiGLU,
// GQA model with q/k/v biases; RoPE over the first kv_channels / 2 dimensions of each head in
// interleaved pairs (--rotary-percent 0.5 --rotary-interleaved), base 10000 x rope_ratio.
Status read_chatglm(const ConfigReader& c, HfModel& out) {
  ModelArgs& m = out.model;
  GALE_ASSIGN_OR_RETURN(m.hidden_size, c.positive("hidden_size"));
  GALE_ASSIGN_OR_RETURN(m.num_layers, c.positive("num_layers"));
  GALE_ASSIGN_OR_RETURN(m.num_attention_heads, c.positive("num_attention_heads"));
  if (!c.set("kv_channels") && m.hidden_size % m.num_attention_heads != 0)
    return InvalidArgument(c.path(), ": hidden_size ", m.hidden_size, " is not a multiple of num_attention_heads ",
                           m.num_attention_heads, " and there is no kv_channels");
  GALE_ASSIGN_OR_RETURN(m.kv_channels, c.positive("kv_channels", m.hidden_size / m.num_attention_heads));
  if (m.kv_channels % 4 != 0)
    return InvalidArgument(c.path(), ": kv_channels ", m.kv_channels, " must be a multiple of 4 (ChatGLM rotates "
                           "kv_channels / 2 dimensions of each head in pairs)");
  GALE_ASSIGN_OR_RETURN(bool mqa, c.boolean("multi_query_attention", false));
  GALE_ASSIGN_OR_RETURN(int64_t groups, c.positive("multi_query_group_num", 1));
  m.num_kv_heads = mqa ? groups : m.num_attention_heads;
  if (m.num_attention_heads % m.num_kv_heads != 0)
    return InvalidArgument(c.path(), ": num_attention_heads ", m.num_attention_heads,
                           " is not a multiple of multi_query_group_num ", m.num_kv_heads);
  GALE_ASSIGN_OR_RETURN(m.ffn_hidden_size, c.positive("ffn_hidden_size"));
  GALE_ASSIGN_OR_RETURN(m.max_position_embeddings, c.positive("seq_length"));
  GALE_ASSIGN_OR_RETURN(m.norm_epsilon, c.number("layernorm_epsilon", 1e-5));
  auto need = [&](const char* key, bool fallback, bool wanted, const char* why) -> Status {
    GALE_ASSIGN_OR_RETURN(bool v, c.boolean(key, fallback));
    if (v != wanted)
      return Unimplemented(c.path(), ": '", key, "' = ", c.set(key) ? c.dump(key) : str_cat("absent (", fallback ? "true" : "false", ")"),
                           " is not supported yet (", why, ")");
    return Status::Ok();
  };
  GALE_RETURN_IF_ERROR(need("rmsnorm", true, true, "ChatGLM with LayerNorm and RoPE: Gale reads RMSNorm only"));
  GALE_RETURN_IF_ERROR(need("add_bias_linear", false, false, "biases on dense and the MLP; the q/k/v bias "
                            "(add_qkv_bias) is supported"));
  GALE_RETURN_IF_ERROR(need("post_layer_norm", true, true, "no final_layernorm"));
  GALE_RETURN_IF_ERROR(need("apply_residual_connection_post_layernorm", false, false,
                            "residuals taken after the norms"));
  GALE_RETURN_IF_ERROR(need("original_rope", true, true, "ChatGLM's RotaryEmbedding implements original_impl only"));
  if (c.set("pre_seq_len"))
    return refuse(c, "pre_seq_len", "P-tuning v2 prefix encoders (transformer.prefix_encoder) are not converted");
  if (c.set("rope_scaling")) return refuse(c, "rope_scaling", "ChatGLM's RoPE is scaled by rope_ratio only");
  GALE_ASSIGN_OR_RETURN(double ratio, c.number("rope_ratio", 1.0));
  const double base = 10000.0 * ratio;
  if (ratio <= 0 || base != std::floor(base) || base > 9.0e15)
    return refuse(c, "rope_ratio", "Megatron's --rotary-base 10000 x rope_ratio is a positive integer");
  m.rotary_base = static_cast<int64_t>(base);
  GALE_ASSIGN_OR_RETURN(m.add_qkv_bias, c.boolean("add_qkv_bias", false));
  m.group_query_attention = m.num_kv_heads != m.num_attention_heads;
  m.num_query_groups = m.group_query_attention ? m.num_kv_heads : 1;
  m.normalization = "RMSNorm";
  m.position_embedding_type = "rope";
  m.rotary_interleaved = true;
  m.swiglu = true;
  m.add_bias_linear = false;
  m.untie_embeddings_and_output_weights = true;  // output_layer is its own tensor (never tied)
  return Status::Ok();
}

Status read_llama_family(const ConfigReader& c, const nlohmann::json& j, HfModel& out) {
  ModelArgs& m = out.model;
  if (out.arch == HfArchitecture::kBaichuan && !c.set("max_position_embeddings"))
    return Unimplemented(c.path(), ": BaichuanForCausalLM without max_position_embeddings is Baichuan2-13B's form "
                         "(ALiBi, model_max_length), which is not supported yet: Gale reads Baichuan2-7B's (RoPE)");
  GALE_ASSIGN_OR_RETURN(m.hidden_size, c.positive("hidden_size"));
  GALE_ASSIGN_OR_RETURN(m.num_layers, c.positive("num_hidden_layers"));
  GALE_ASSIGN_OR_RETURN(m.num_attention_heads, c.positive("num_attention_heads"));
  GALE_ASSIGN_OR_RETURN(m.num_kv_heads, c.positive("num_key_value_heads", m.num_attention_heads));
  GALE_ASSIGN_OR_RETURN(m.ffn_hidden_size, c.positive("intermediate_size"));
  GALE_ASSIGN_OR_RETURN(m.max_position_embeddings, c.positive("max_position_embeddings"));
  GALE_ASSIGN_OR_RETURN(m.norm_epsilon, c.number("rms_norm_eps", 1e-6));
  const int64_t default_head_dim = m.hidden_size / m.num_attention_heads;
  const bool gemma2 = out.arch == HfArchitecture::kGemma2 || out.arch == HfArchitecture::kGemma3;  // and Gemma-3
  GALE_ASSIGN_OR_RETURN(m.kv_channels, c.positive("head_dim", gemma2 ? 256 : default_head_dim));  // Gemma2Config's
  if (!c.set("head_dim") && !gemma2 && m.hidden_size % m.num_attention_heads != 0)
    return InvalidArgument(c.path(), ": hidden_size ", m.hidden_size, " is not a multiple of num_attention_heads ",
                           m.num_attention_heads, " and there is no head_dim");
  if (m.num_attention_heads % m.num_kv_heads != 0)
    return InvalidArgument(c.path(), ": num_attention_heads ", m.num_attention_heads,
                           " is not a multiple of num_key_value_heads ", m.num_kv_heads);
  if ((out.arch == HfArchitecture::kInternLM2 || out.arch == HfArchitecture::kPhi3 ||
       out.arch == HfArchitecture::kBaichuan) &&
      (m.hidden_size % m.num_attention_heads != 0 || m.kv_channels != default_head_dim))
    return InvalidArgument(c.path(), ": ", hf_architecture_name(out.arch), " has heads of hidden_size / "
                           "num_attention_heads: expected hidden_size ", m.hidden_size, " to be a multiple of ",
                           m.num_attention_heads, " and no other head_dim, found head_dim ", m.kv_channels);
  const bool gemma = out.arch == HfArchitecture::kGemma || gemma2;
  if (gemma) {
    GALE_RETURN_IF_ERROR(read_gemma_activation(c, out));
  } else {
    GALE_ASSIGN_OR_RETURN(std::string act, c.string("hidden_act", "silu"));
    if (act != "silu") return refuse(c, "hidden_act", "the MLP is SwiGLU: silu(gate) * up");
  }
  GALE_ASSIGN_OR_RETURN(double theta, c.number("rope_theta", 10000.0));
  if (theta <= 0 || theta != std::floor(theta) || theta > 9.0e15)
    return refuse(c, "rope_theta", "Megatron's --rotary-base is a positive integer");
  m.rotary_base = static_cast<int64_t>(theta);
  if (out.arch == HfArchitecture::kInternLM2) {
    GALE_RETURN_IF_ERROR(read_internlm2(c, out));
  } else if (out.arch == HfArchitecture::kPhi3) {
    GALE_RETURN_IF_ERROR(read_phi3(c, &m));
  } else if (out.arch == HfArchitecture::kBaichuan) {
    GALE_RETURN_IF_ERROR(read_baichuan(c, m));
  } else if (c.set("rope_scaling") && !gemma2) {  // Gemma-2's: refused by read_gemma2_keys
    GALE_RETURN_IF_ERROR(read_llama_rope_scaling(c, &m));
  }
  GALE_ASSIGN_OR_RETURN(bool attention_bias, c.boolean("attention_bias", false));
  if (attention_bias) return refuse(c, "attention_bias", "biases on q/k/v/o; Qwen2's q/k/v-only bias is supported");
  GALE_ASSIGN_OR_RETURN(bool mlp_bias, c.boolean("mlp_bias", false));
  if (mlp_bias) return refuse(c, "mlp_bias", "MLP biases");
  GALE_ASSIGN_OR_RETURN(bool tie, c.boolean("tie_word_embeddings", gemma));  // GemmaConfig's default: tied
  const bool mistral_like = out.arch == HfArchitecture::kMistral || out.arch == HfArchitecture::kMixtral;
  const bool qwen2 = out.arch == HfArchitecture::kQwen2 || out.arch == HfArchitecture::kQwen2Moe;
  const bool qwen3 = out.arch == HfArchitecture::kQwen3 || out.arch == HfArchitecture::kQwen3Moe;
  if (out.arch == HfArchitecture::kQwen3Moe) {
    // transformers 4.x windows Qwen3-MoE's layers from max_window_layers on, 5.x every layer.
    GALE_ASSIGN_OR_RETURN(bool use_window, c.boolean("use_sliding_window", false));
    if (use_window)
      return refuse(c, "use_sliding_window", "Qwen3MoeForCausalLM's sliding window: transformers 4.x and 5.x "
                    "apply it to different layers");
  } else if (mistral_like || qwen2 || qwen3) {
    GALE_RETURN_IF_ERROR(read_sliding_window(c, m.num_layers, mistral_like, out.arch == HfArchitecture::kMistral,
                                             out.arch == HfArchitecture::kQwen2 || out.arch == HfArchitecture::kQwen3,
                                             &m));
  }
  m.group_query_attention = m.num_kv_heads != m.num_attention_heads;
  m.num_query_groups = m.group_query_attention ? m.num_kv_heads : 1;
  m.normalization = "RMSNorm";
  if (m.position_embedding_type != "yarn") m.position_embedding_type = "rope";  // yarn: read_llama_yarn
  m.swiglu = !gemma;  // Gemma: --geglu / --gelu-tanh (read_gemma_activation)
  m.add_rmsnorm_offset = m.input_embeds_norm = gemma;  // GemmaRMSNorm's 1 + w, the √hidden_size normalizer
  m.add_bias_linear = false;
  m.add_qkv_bias = qwen2;
  m.qk_layernorm = qwen3;  // Qwen3's and Qwen3-MoE's q_norm / k_norm (RMSNorm over head_dim, eps rms_norm_eps)
  m.untie_embeddings_and_output_weights = !tie;
  if (gemma2) GALE_RETURN_IF_ERROR(read_gemma2_keys(j, c.path(), out));
  if (out.arch == HfArchitecture::kMixtral) GALE_RETURN_IF_ERROR(read_mixtral_experts(c, out));
  if (out.arch == HfArchitecture::kQwen3Next) GALE_RETURN_IF_ERROR(read_qwen3_next(c, out));
  if (out.arch == HfArchitecture::kQwen2Moe || out.arch == HfArchitecture::kQwen3Moe ||
      out.arch == HfArchitecture::kQwen3Next)
    GALE_RETURN_IF_ERROR(read_qwen_moe_experts(c, j, out));
  return Status::Ok();
}

// Qwen2-MoE's and Qwen3-MoE's expert keys (the shared expert's only for Qwen2-MoE). The sparse layers
// as decoder_sparse_step when one step gives them, else as mlp_only_layers (with step 1; transformers
// releases before mlp_only_layers ignore it).
void add_qwen_moe_config(const MoeArgs& moe, int64_t L, bool shared_expert, nlohmann::json* j) {
  (*j)["num_experts"] = moe.num_experts;
  (*j)["num_experts_per_tok"] = moe.moe_router_topk;
  (*j)["moe_intermediate_size"] = moe.moe_ffn_hidden_size;
  if (shared_expert) (*j)["shared_expert_intermediate_size"] = moe.moe_shared_expert_intermediate_size;
  (*j)["norm_topk_prob"] = !moe.moe_router_pre_softmax;
  (*j)["output_router_logits"] = false;
  auto sparse = [&](int64_t i) { return moe.layer_pattern.empty() || moe.layer_pattern[i] != 0; };
  for (int64_t step = 1; step <= L; ++step) {
    bool fits = true;
    for (int64_t i = 0; i < L; ++i) fits = fits && sparse(i) == ((i + 1) % step == 0);
    if (fits) {
      (*j)["decoder_sparse_step"] = step;
      (*j)["mlp_only_layers"] = nlohmann::json::array();
      return;
    }
  }
  (*j)["decoder_sparse_step"] = 1;
  nlohmann::json only = nlohmann::json::array();
  for (int64_t i = 0; i < L; ++i)
    if (!sparse(i)) only.push_back(i);
  (*j)["mlp_only_layers"] = only;
}

// --position-embedding-type yarn as the rope_scaling read_llama_yarn reads (the Megatron defaults
// written out; mscale and mscale_all_dim only when not 1 and 0, checked by hf_model_from_args).
void add_llama_yarn(const ModelArgs& m, nlohmann::json* out) {
  nlohmann::json& r = (*out)["rope_scaling"];
  r = {{"rope_type", "yarn"},
       {"factor", m.rotary_scaling_factor},
       {"original_max_position_embeddings",
        m.yarn_original_max_position_embeddings == kUnset ? 4096 : m.yarn_original_max_position_embeddings},
       {"beta_fast", unset(m.yarn_beta_fast) ? 32.0 : m.yarn_beta_fast},
       {"beta_slow", unset(m.yarn_beta_slow) ? 1.0 : m.yarn_beta_slow},
       {"truncate", m.yarn_correction_range_round_to_int}};
  if (m.mscale != 1.0 || m.mscale_all_dim != 0.0) {
    r["mscale"] = m.mscale;
    r["mscale_all_dim"] = m.mscale_all_dim;
  }
}

// Whether a Gale MLA model is a DeepseekV3ForCausalLM: its rules, as read_deepseek_v3 sets them.
Status deepseek_v3_from_args(const ModelArgs& m, const MoeArgs& moe, const std::string& where) {
  std::string why;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok && why.empty()) why = what;
  };
  need(m.normalization == "RMSNorm" && m.swiglu && !m.add_bias_linear && !m.add_qkv_bias,
       "RMSNorm, --swiglu and --disable-bias-linear");
  need(m.position_embedding_type == "rope" && m.rotary_percent == 1.0, "--position-embedding-type rope");
  need(m.qk_layernorm && m.q_lora_rank != kUnset, "--qk-layernorm and --q-lora-rank (q_a_layernorm, kv_a_layernorm)");
  need(m.rope_type != "rope" || m.rotary_scaling_factor == 1.0, "YaRN tables (not --rope-type rope) when scaled");
  need(m.rotary_scaling_factor == 1.0 ||
           (static_cast<double>(m.max_position_embeddings) == m.rotary_scaling_factor * 4096.0 &&
            (m.mscale_all_dim != 0.0 || m.mscale == 1.0) && m.mscale > 0.0),
       "--max-position-embeddings = --rotary-scaling-factor x 4096 with YaRN, and --mscale 1 when "
       "--mscale-all-dim is 0");
  // Without --num-experts: a dense DeepSeek-V3 (first_k_dense_replace = num_hidden_layers); its MTP
  // layers would be dense, which Gale's DeepSeek MTP mapping (MoE layers) does not write.
  need(moe.enabled() || m.mtp_num_layers == kUnset || m.mtp_num_layers == 0,
       "--num-experts when it has --mtp-num-layers (DeepSeek's MTP layers are MoE layers)");
  if (moe.enabled()) {
    bool dense_prefix = true;
    bool seen_moe = false;
    for (int f : moe.layer_pattern) {
      if (f) seen_moe = true;
      else if (seen_moe) dense_prefix = false;
    }
    need(dense_prefix && seen_moe, "--moe-layer-freq: dense layers first, then only MoE layers (first_k_dense_replace)");
    need(moe.moe_router_score_function == "sigmoid" && moe.moe_router_enable_expert_bias,
         "--moe-router-score-function sigmoid with --moe-router-enable-expert-bias");
    need(!moe.moe_router_pre_softmax || moe.moe_router_score_function == "sigmoid", "no --moe-router-pre-softmax");
    need(moe.moe_shared_expert_intermediate_size != kUnset && !moe.moe_shared_expert_gate &&
             moe.moe_shared_expert_intermediate_size % moe.moe_ffn_hidden_size == 0,
         "an ungated shared expert of a multiple of --moe-ffn-hidden-size (n_shared_experts)");
    need(moe.moe_router_group_topk == kUnset || moe.moe_router_topk == 2 * moe.moe_router_group_topk,
         "--moe-router-topk = 2 x --moe-router-group-topk (transformers scores a group by its 2 best experts)");
  }
  if (!why.empty())
    return Unimplemented(where, ": a --multi-latent-attention model is written as DeepseekV3ForCausalLM only with ", why);
  return Status::Ok();
}

// Whether a Gale Gated DeltaNet model is a Qwen3NextForCausalLM: what read_qwen3_next and
// read_qwen_moe_experts set. transformers' class always gates its full attention (q_proj [query |
// gate]), normalises q and k, uses 1 + w RMSNorms, and builds its sparse layers with a gated shared
// expert; a model without one of these has no Qwen3-Next config.
Status qwen3_next_from_args(const ModelArgs& m, const MoeArgs& moe, const std::string& where) {
  std::string why;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok && why.empty()) why = what;
  };
  need(m.normalization == "RMSNorm" && m.apply_layernorm_1p, "zero-centred RMSNorm (--apply-layernorm-1p)");
  need(m.swiglu && !m.add_bias_linear && !m.add_qkv_bias && !m.squared_relu,
       "--swiglu and --disable-bias-linear (no --add-qkv-bias)");
  need(m.position_embedding_type == "rope" && !m.rotary_interleaved && !m.use_rope_scaling &&
           unset(m.rotary_seq_len_interpolation_factor) && m.no_rope_pattern.empty(),
       "--position-embedding-type rope in every layer, rotate-half, unscaled");
  need(m.attention_output_gate && m.qk_layernorm, "--attention-output-gate and --qk-layernorm (the full-attention "
       "layers' gated q_proj, q_norm and k_norm)");
  need(m.sliding_window == kUnset && m.noop_layers.empty() && !m.embed_layernorm,
       "no --sliding-window, --noop-layers or --embed-layernorm");
  need(!m.multi_latent_attention && (m.experimental_attention_variant.empty() ||
                                     m.experimental_attention_variant == "gdn"),
       "standard attention (no --multi-latent-attention, no attention variant but gdn)");
  need(!moe.enabled() || (moe.moe_shared_expert_intermediate_size != kUnset && moe.moe_shared_expert_gate),
       "--moe-shared-expert-intermediate-size and --moe-shared-expert-gate with --num-experts (its sparse layers' "
       "gated shared expert)");
  need(!moe.enabled() || (moe.moe_router_score_function == "softmax" && !moe.moe_router_enable_expert_bias &&
                          unset(moe.moe_router_topk_scaling_factor) && moe.moe_router_group_topk == kUnset),
       "softmax routing (no --moe-router-score-function sigmoid, expert bias, top-k scaling or groups)");
  if (!why.empty())
    return Unimplemented(where,
                         m.experimental_attention_variant == "gdn"
                             ? ": a Gated DeltaNet model (--experimental-attention-variant gdn) is written as "
                             : ": a model with --attention-output-gate (gated attention) is written as ",
                         "Qwen3NextForCausalLM only with ", why);
  return Status::Ok();
}

// Whether a Gale model with gpt-oss's sinks or activation is a GptOssForCausalLM: what read_gpt_oss sets.
// A model with MindSpeed-LLM's Gemma flags is written only as GemmaForCausalLM, which holds exactly
// Gemma v1's shape.
// Gemma's shape, both versions (the window aside: Gemma-2's, checked by gemma2_from_args).
bool gemma_shape(const ModelArgs& m, const MoeArgs& moe) {
  return (m.geglu || m.gelu_tanh) && m.add_rmsnorm_offset && m.input_embeds_norm &&
                     m.normalization == "RMSNorm" && m.position_embedding_type == "rope" && m.rotary_percent == 1.0 &&
                     !m.rotary_interleaved && !m.use_rope_scaling && unset(m.rotary_seq_len_interpolation_factor) &&
                     !m.add_bias_linear && !m.add_qkv_bias && !moe.enabled() && !m.qk_l2_norm &&
                     !m.multi_latent_attention &&
                     (m.mtp_num_layers == kUnset || m.mtp_num_layers == 0) && m.noop_layers.empty() &&
                     m.experimental_attention_variant.empty() && !m.attention_output_gate && !m.embed_layernorm &&
                     m.softmax_type == "vanilla" && m.no_rope_pattern.empty() && !m.apply_layernorm_1p;
}

Status gemma_from_args(const ModelArgs& m, const MoeArgs& moe, const std::string& where) {
  if (!gemma_shape(m, moe) || m.sliding_window != kUnset || m.qk_layernorm)
    return Unimplemented(where, ": a model with MindSpeed-LLM's Gemma flags is written only as GemmaForCausalLM: "
                         "--geglu or --gelu-tanh with --add-rmsnorm-offset, --input-embeds-norm, --normalization "
                         "RMSNorm, --position-embedding-type rope (--rotary-percent 1, no RoPE scaling or interleaving) "
                         "and --disable-bias-linear, without experts, q/k norms, --sliding-window, MLA, MTP or noop "
                         "layers (found --geglu ", m.geglu ? "on" : "off", ", --gelu-tanh ", m.gelu_tanh ? "on" : "off",
                         ", --add-rmsnorm-offset ", m.add_rmsnorm_offset ? "on" : "off", ", --input-embeds-norm ",
                         m.input_embeds_norm ? "on" : "off", ", --normalization ", m.normalization,
                         ", position embedding ", m.position_embedding_type, ", linear biases ",
                         m.add_bias_linear ? "on" : "off", ")");
  return Status::Ok();
}

// A model with Gemma-2's flags (--post-norm, soft-capping, --query-pre-attn-scalar) is written only as
// Gemma2ForCausalLM (or Gemma3ForCausalLM with --qk-layernorm): Gemma's shape with --post-norm, any
// sliding window and windowed layers.
Status gemma2_from_args(const ModelArgs& m, const MoeArgs& moe, const std::string& where) {
  if (!gemma_shape(m, moe) || !m.post_norm)
    return Unimplemented(where, ": a model with MindSpeed-LLM's Gemma-2 flags (--post-norm, --attn-logit-softcapping, "
                         "--output-logit-softcapping, --query-pre-attn-scalar) is written only as Gemma2ForCausalLM "
                         "(Gemma3ForCausalLM with --qk-layernorm): --post-norm with --geglu or --gelu-tanh, --add-rmsnorm-offset, --input-embeds-norm, "
                         "--normalization RMSNorm, --position-embedding-type rope (--rotary-percent 1, no RoPE scaling "
                         "or interleaving) and --disable-bias-linear, without experts, MLA, MTP or noop "
                         "layers (found --post-norm ", m.post_norm ? "on" : "off", ", --geglu ", m.geglu ? "on" : "off",
                         ", --gelu-tanh ", m.gelu_tanh ? "on" : "off", ", --add-rmsnorm-offset ",
                         m.add_rmsnorm_offset ? "on" : "off", ", --input-embeds-norm ",
                         m.input_embeds_norm ? "on" : "off", ", --normalization ", m.normalization,
                         ", position embedding ", m.position_embedding_type, ", linear biases ",
                         m.add_bias_linear ? "on" : "off", ")");
  return Status::Ok();
}

// A Gale model with --rotary-interleaved --rotary-percent 0.5 is ChatGLM-shaped only with the rest of ChatGLM's
// block: RMSNorm, SwiGLU, rope (unscaled), no linear biases but the optional q/k/v one, an untied output layer.
Status chatglm_from_args(const ModelArgs& m, const MoeArgs& moe, const std::string& where) {
  const bool shape = m.normalization == "RMSNorm" && !m.apply_layernorm_1p && m.swiglu && !m.add_bias_linear &&
                     m.untie_embeddings_and_output_weights && m.position_embedding_type == "rope" &&
                     !m.use_rope_scaling && unset(m.rotary_seq_len_interpolation_factor) && m.kv_channels % 4 == 0 &&
                     !moe.enabled() && !m.qk_layernorm && !m.qk_l2_norm && m.sliding_window == kUnset &&
                     !m.multi_latent_attention && (m.mtp_num_layers == kUnset || m.mtp_num_layers == 0) &&
                     m.noop_layers.empty() && m.experimental_attention_variant.empty() && !m.attention_output_gate &&
                     !m.embed_layernorm && m.softmax_type == "vanilla" && m.no_rope_pattern.empty() &&
                     !m.add_rmsnorm_offset && !m.input_embeds_norm && !m.geglu && !m.gelu_tanh && !m.squared_relu;
  if (!shape)
    return Unimplemented(where, ": a model with --rotary-interleaved --rotary-percent 0.5 is written only as "
                         "ChatGLMModel: --normalization RMSNorm, --swiglu, --disable-bias-linear (--add-qkv-bias "
                         "allowed), --untie-embeddings-and-output-weights, --position-embedding-type rope without "
                         "scaling, --kv-channels a multiple of 4, without experts, q/k norms, --sliding-window, MLA, "
                         "MTP or noop layers (found --normalization ", m.normalization, ", swiglu ",
                         m.swiglu ? "on" : "off", ", linear biases ", m.add_bias_linear ? "on" : "off",
                         ", untied output ", m.untie_embeddings_and_output_weights ? "on" : "off",
                         ", position embedding ", m.position_embedding_type, ", --kv-channels ", m.kv_channels, ")");
  return Status::Ok();
}

Status gpt_oss_from_args(const ModelArgs& m, const MoeArgs& moe, const std::string& where) {
  std::string why;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok && why.empty()) why = what;
  };
  need(m.normalization == "RMSNorm" && !m.apply_layernorm_1p, "RMSNorm (not --apply-layernorm-1p)");
  need(m.quick_geglu && !m.swiglu && !m.squared_relu && m.glu_linear_offset == 1.0 &&
           m.activation_func_clamp_value == kGptOssSwigluLimit,
       "--quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7 (transformers' GptOssExperts)");
  need(m.softmax_type == "learnable", "--softmax-type learnable (self_attn.sinks)");
  need(m.add_bias_linear, "--add-bias-linear (biases on q/k/v/o, the router and the experts)");
  need((m.position_embedding_type == "rope" || m.position_embedding_type == "yarn") && m.rotary_percent == 1.0 &&
           !m.rotary_interleaved && m.no_rope_pattern.empty() &&
           !(m.use_rope_scaling && !unset(m.rotary_seq_len_interpolation_factor)),
       "--position-embedding-type rope or yarn in every layer, rotate-half, --rotary-percent 1");
  need(m.position_embedding_type != "yarn" || (m.mscale == 1.0 && m.mscale_all_dim == 0.0) ||
           (m.mscale != 0.0 && m.mscale_all_dim != 0.0),
       "--mscale 1 with --mscale-all-dim 0, or both non-zero (rope_scaling yarn)");
  need(!m.qk_layernorm && !m.qk_l2_norm && !m.attention_output_gate && !m.multi_latent_attention &&
           m.experimental_attention_variant.empty() && !m.embed_layernorm && m.noop_layers.empty() &&
           (m.mtp_num_layers == kUnset || m.mtp_num_layers == 0),
       "plain attention (no --qk-layernorm, --qk-l2-norm, --attention-output-gate, MLA, attention variant, "
       "--embed-layernorm, --noop-layers or --mtp-num-layers)");
  need(m.window_attn_pattern.empty() || m.sliding_window != kUnset, "--window-attn-skip-freq only with a window");
  const bool every_layer = std::all_of(moe.layer_pattern.begin(), moe.layer_pattern.end(), [](int f) { return f == 1; });
  need(moe.enabled() && every_layer, "--num-experts in every layer (--moe-layer-freq 1)");
  need(!moe.enabled() || (moe.moe_router_score_function == "softmax" && !moe.moe_router_pre_softmax &&
                          !moe.moe_router_enable_expert_bias && unset(moe.moe_router_topk_scaling_factor) &&
                          moe.moe_router_group_topk == kUnset && moe.moe_shared_expert_intermediate_size == kUnset),
       "Megatron's default routing (softmax over the top k logits: no --moe-router-pre-softmax, sigmoid scores, "
       "expert bias, top-k scaling or groups) and no shared expert");
  if (!why.empty())
    return Unimplemented(where, ": a model with gpt-oss's attention sinks or MLP activation is written as "
                         "GptOssForCausalLM only with ", why);
  return Status::Ok();
}

// GptOssForCausalLM's config.json keys, as transformers' GptOssConfig saves them.
void add_gpt_oss_config(const HfModel& hf, nlohmann::json* out) {
  const ModelArgs& m = hf.model;
  nlohmann::json& j = *out;
  j["model_type"] = "gpt_oss";
  j["intermediate_size"] = hf.moe.moe_ffn_hidden_size;
  j["attention_bias"] = true;
  j["swiglu_limit"] = m.activation_func_clamp_value;
  j["num_local_experts"] = hf.moe.num_experts;
  j["num_experts_per_tok"] = hf.moe.moe_router_topk;
  j["router_aux_loss_coef"] = hf.moe.moe_aux_loss_coeff;
  j["output_router_logits"] = false;
  nlohmann::json types = nlohmann::json::array();
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const bool sliding = m.sliding_window != kUnset &&
                         (m.window_attn_pattern.empty() || m.window_attn_pattern[static_cast<size_t>(i)] != 0);
    types.push_back(sliding ? "sliding_attention" : "full_attention");
  }
  j["layer_types"] = types;
  // With no sliding layer transformers reads no window; it still wants the key.
  j["sliding_window"] = m.sliding_window != kUnset ? m.sliding_window : m.max_position_embeddings;
}

// Qwen3NextForCausalLM's config.json keys beyond the LLaMA family's, as transformers 5.x saves them:
// layer_types, the linear_* sizes, rope_parameters with partial_rotary_factor, the experts.
void add_qwen3_next_config(const HfModel& hf, nlohmann::json* out) {
  const ModelArgs& m = hf.model;
  nlohmann::json& j = *out;
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", static_cast<double>(m.rotary_base)},
                          {"partial_rotary_factor", m.rotary_percent}};
  nlohmann::json types = nlohmann::json::array();
  for (int64_t i = 0; i < m.num_layers; ++i)  // no pattern: gated attention in every layer
    types.push_back(!m.linear_attention_pattern.empty() && m.linear_attention_pattern[static_cast<size_t>(i)] != 0
                        ? "linear_attention"
                        : "full_attention");
  j["layer_types"] = types;
  // Without a linear_attention layer transformers 4.57's Qwen3NextDynamicCache fails (it looks for the
  // last one); use_cache false lets that release run the model (the forward needs no cache).
  if (m.linear_attention_pattern.empty()) j["use_cache"] = false;
  j["linear_conv_kernel_dim"] = m.linear_conv_kernel_dim;
  j["linear_key_head_dim"] = m.linear_key_head_dim;
  j["linear_value_head_dim"] = m.linear_value_head_dim;
  j["linear_num_key_heads"] = m.linear_num_key_heads;
  j["linear_num_value_heads"] = m.linear_num_value_heads;
  j["attention_bias"] = false;
  if (!hf.moe.enabled()) {  // every MLP dense: no experts (transformers then builds Qwen3NextMLP everywhere)
    j["num_experts"] = 0;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::json::array();
    for (int64_t i = 0; i < m.num_layers; ++i) j["mlp_only_layers"].push_back(i);
    return;
  }
  add_qwen_moe_config(hf.moe, m.num_layers, true, &j);
}

// DeepseekV3ForCausalLM's config.json keys for an MLA model that passed deepseek_v3_from_args.
void add_deepseek_v3_config(const HfModel& hf, nlohmann::json* out) {
  const ModelArgs& m = hf.model;
  const MoeArgs& moe = hf.moe;
  nlohmann::json& j = *out;
  j["model_type"] = "deepseek_v3";
  j["hidden_size"] = m.hidden_size;
  j["num_hidden_layers"] = m.num_layers;
  j["num_attention_heads"] = m.num_attention_heads;
  j["num_key_value_heads"] = m.num_attention_heads;
  j["intermediate_size"] = m.ffn_hidden_size;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = m.max_position_embeddings;
  j["rms_norm_eps"] = m.norm_epsilon;
  j["rope_theta"] = static_cast<double>(m.rotary_base);
  j["q_lora_rank"] = m.q_lora_rank == kUnset ? nlohmann::json() : nlohmann::json(m.q_lora_rank);
  j["kv_lora_rank"] = m.kv_lora_rank;
  j["qk_nope_head_dim"] = m.qk_head_dim;
  j["qk_rope_head_dim"] = m.qk_pos_emb_head_dim;
  j["v_head_dim"] = m.v_head_dim;
  j["rope_interleave"] = true;
  if (m.rotary_scaling_factor > 1.0) {
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", m.rotary_scaling_factor},
                         {"original_max_position_embeddings", 4096}, {"beta_fast", 32.0}, {"beta_slow", 1.0}};
    if (m.mscale_all_dim != 0.0) {
      j["rope_scaling"]["mscale"] = m.mscale;
      j["rope_scaling"]["mscale_all_dim"] = m.mscale_all_dim;
    }
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["tie_word_embeddings"] = !m.untie_embeddings_and_output_weights;
  j["num_nextn_predict_layers"] = hf.mtp_layers;
  if (!moe.enabled()) {  // dense: every layer below first_k_dense_replace; transformers reads no expert key
    j["first_k_dense_replace"] = m.num_layers;
    return;
  }
  j["n_routed_experts"] = moe.num_experts;
  j["num_experts_per_tok"] = moe.moe_router_topk;
  j["moe_intermediate_size"] = moe.moe_ffn_hidden_size;
  j["n_shared_experts"] = moe.moe_shared_expert_intermediate_size / moe.moe_ffn_hidden_size;
  j["routed_scaling_factor"] = unset(moe.moe_router_topk_scaling_factor) ? 1.0 : moe.moe_router_topk_scaling_factor;
  j["norm_topk_prob"] = moe.moe_router_topk > 1;
  j["scoring_func"] = "sigmoid";
  j["topk_method"] = "noaux_tc";
  const bool groups = moe.moe_router_group_topk != kUnset;
  j["n_group"] = groups ? moe.moe_router_num_groups : 1;
  j["topk_group"] = groups ? moe.moe_router_group_topk : 1;
  int64_t dense = 0;
  while (dense < m.num_layers && moe.layer_pattern[static_cast<size_t>(dense)] == 0) ++dense;
  j["first_k_dense_replace"] = dense;
}

// InternLM2's keys (modeling_internlm2.py, loaded with trust_remote_code): no head_dim, "bias" false,
// rope_scaling {"type", "factor"} (linear, or the dynamic one the import kept).
void add_internlm2_config(const HfModel& hf, nlohmann::json* j) {
  j->erase("head_dim");
  (*j)["bias"] = false;
  (*j)["attn_implementation"] = "eager";
  (*j)["pretraining_tp"] = 1;
  (*j)["auto_map"] = {{"AutoConfig", "configuration_internlm2.InternLM2Config"},
                      {"AutoModel", "modeling_internlm2.InternLM2ForCausalLM"},
                      {"AutoModelForCausalLM", "modeling_internlm2.InternLM2ForCausalLM"}};
  if (!unset(hf.model.rotary_seq_len_interpolation_factor))
    (*j)["rope_scaling"] = {{"type", "linear"}, {"factor", hf.model.rotary_seq_len_interpolation_factor}};
  else if (!hf.internlm2_dynamic_rope.is_null())
    (*j)["rope_scaling"] = hf.internlm2_dynamic_rope;
}

// Phi-3's keys: no head_dim, RoPE over the whole head, rope_scaling null or longrope, Mistral's sliding_window.
void add_phi3_config(const HfModel& hf, nlohmann::json* j) {
  const ModelArgs& m = hf.model;
  j->erase("head_dim");
  const bool longrope = m.rope_scaling_type == "longrope";
  (*j)["original_max_position_embeddings"] =
      longrope ? m.rope_scaling_original_max_position_embeddings : m.max_position_embeddings;
  (*j)["partial_rotary_factor"] = 1.0;
  if (longrope) {  // Phi-3.5's spelling; one --short-mscale = --long-mscale is transformers' attention_factor
    (*j)["rope_scaling"] = {{"type", "longrope"}, {"short_factor", m.short_factors}, {"long_factor", m.long_factors}};
    if (!unset(m.short_mscale)) (*j)["rope_scaling"]["attention_factor"] = m.short_mscale;
  }
  (*j)["sliding_window"] = m.sliding_window != kUnset ? nlohmann::json(m.sliding_window) : nlohmann::json();
  (*j)["attention_bias"] = false;
  (*j)["resid_pdrop"] = (*j)["embd_pdrop"] = 0.0;
}

// Baichuan2-7B's keys (configuration_baichuan.py, trust_remote_code): multi-head, RoPE base 10000 (no rope_theta),
// model_max_length beside max_position_embeddings, z_loss_weight 0.
void add_baichuan_config(nlohmann::json* j) {
  for (const char* key : {"head_dim", "num_key_value_heads", "rope_theta", "rope_scaling", "attention_dropout"})
    j->erase(key);
  (*j)["model_max_length"] = (*j)["max_position_embeddings"];
  (*j)["z_loss_weight"] = 0;
  (*j)["tokenizer_class"] = "BaichuanTokenizer";
  (*j)["auto_map"] = {{"AutoConfig", "configuration_baichuan.BaichuanConfig"},
                      {"AutoModelForCausalLM", "modeling_baichuan.BaichuanForCausalLM"}};
}

// ChatGLM3 / GLM-4's config.json (configuration_chatglm.py, trust_remote_code).
nlohmann::json chatglm_config(const HfModel& hf) {
  const ModelArgs& m = hf.model;
  nlohmann::json j;
  j["architectures"] = {hf_architecture_name(hf.arch)};
  j["model_type"] = "chatglm";
  j["auto_map"] = {{"AutoConfig", "configuration_chatglm.ChatGLMConfig"},
                   {"AutoModel", "modeling_chatglm.ChatGLMForConditionalGeneration"},
                   {"AutoModelForCausalLM", "modeling_chatglm.ChatGLMForConditionalGeneration"}};
  j["num_layers"] = m.num_layers;
  j["hidden_size"] = m.hidden_size;
  j["ffn_hidden_size"] = m.ffn_hidden_size;
  j["num_attention_heads"] = m.num_attention_heads;
  j["kv_channels"] = m.kv_channels;
  j["multi_query_attention"] = m.num_kv_heads != m.num_attention_heads;
  j["multi_query_group_num"] = m.num_kv_heads;
  j["padded_vocab_size"] = hf.vocab_size;
  j["seq_length"] = m.max_position_embeddings;
  j["layernorm_epsilon"] = m.norm_epsilon;
  j["rmsnorm"] = true;
  j["add_bias_linear"] = false;
  j["add_qkv_bias"] = m.add_qkv_bias;
  j["post_layer_norm"] = true;
  j["apply_residual_connection_post_layernorm"] = false;
  j["apply_query_key_layer_scaling"] = true;
  j["attention_softmax_in_fp32"] = true;
  j["bias_dropout_fusion"] = true;
  j["fp32_residual_connection"] = false;
  j["original_rope"] = true;
  j["rope_ratio"] = static_cast<double>(m.rotary_base) / 10000.0;
  j["attention_dropout"] = j["hidden_dropout"] = 0.0;
  j["tie_word_embeddings"] = false;
  j["use_cache"] = true;
  return j;
}

// transformers 5.x saves RoPE as "rope_parameters" {"rope_type", "rope_theta", scaling keys...} and the
// precision as "dtype": the 4.x keys (rope_theta, rope_scaling, torch_dtype) the readers take.
StatusOr<nlohmann::json> with_transformers4_keys(const nlohmann::json& config, const std::string& path) {
  nlohmann::json out = config;
  if (!out.contains("torch_dtype") && out.contains("dtype")) out["torch_dtype"] = out["dtype"];
  auto rope = config.find("rope_parameters");
  if (rope == config.end() || rope->is_null()) return out;
  const bool nested = rope->is_object() && std::any_of(rope->begin(), rope->end(),
                                                       [](const nlohmann::json& v) { return v.is_object(); });
  if (!rope->is_object() || nested || (rope->contains("rope_theta") && !(*rope)["rope_theta"].is_number()))
    return Unimplemented(path, ": 'rope_parameters' = ", rope->dump(),
                         " is not supported yet (expected one object with a numeric rope_theta; per-layer-type RoPE "
                         "parameters are not supported)");
  if (rope->contains("rope_theta") && !config.contains("rope_theta")) out["rope_theta"] = (*rope)["rope_theta"];
  if (!config.contains("rope_scaling")) {
    nlohmann::json scaling = *rope;
    scaling.erase("rope_theta");
    const std::string type = scaling.value("rope_type", scaling.value("type", std::string("default")));
    out["rope_scaling"] = type == "default" ? nlohmann::json() : scaling;
  }
  return out;
}

}  // namespace

StatusOr<HfModel> hf_model_from_config(const nlohmann::json& raw_config, const std::string& path, int64_t divisible_by,
                                       int64_t tensor_parallel) {
  if (!raw_config.is_object()) return InvalidArgument(path, ": expected a JSON object");
  GALE_ASSIGN_OR_RETURN(const nlohmann::json config, with_transformers4_keys(raw_config, path));
  ConfigReader c(config, path);
  auto arch_it = config.find("architectures");
  if (arch_it == config.end() || !arch_it->is_array() || arch_it->size() != 1 || !(*arch_it)[0].is_string())
    return InvalidArgument(path, ": 'architectures' must list one architecture, found ",
                           arch_it == config.end() ? "nothing" : arch_it->dump());
  const std::string name = (*arch_it)[0].get<std::string>();
  HfModel out;
  if (name == "GPT2LMHeadModel") out.arch = HfArchitecture::kGpt2;
  else if (name == "LlamaForCausalLM") out.arch = HfArchitecture::kLlama;
  else if (name == "Qwen2ForCausalLM") out.arch = HfArchitecture::kQwen2;
  else if (name == "MistralForCausalLM") out.arch = HfArchitecture::kMistral;
  else if (name == "MixtralForCausalLM") out.arch = HfArchitecture::kMixtral;
  else if (name == "Qwen2MoeForCausalLM") out.arch = HfArchitecture::kQwen2Moe;
  else if (name == "DeepseekV3ForCausalLM" || name == kDeepseekV32Name) out.arch = HfArchitecture::kDeepseekV3;
  else if (name == "Qwen3ForCausalLM") out.arch = HfArchitecture::kQwen3;
  else if (name == "Qwen3MoeForCausalLM") out.arch = HfArchitecture::kQwen3Moe;
  else if (name == "Qwen3NextForCausalLM") out.arch = HfArchitecture::kQwen3Next;
  else if (name == "BloomForCausalLM") out.arch = HfArchitecture::kBloom;
  else if (name == "GptOssForCausalLM") out.arch = HfArchitecture::kGptOss;
  else if (name == "InternLM2ForCausalLM") out.arch = HfArchitecture::kInternLM2;
  else if (name == "Phi3ForCausalLM") out.arch = HfArchitecture::kPhi3;
  else if (name == "GemmaForCausalLM") out.arch = HfArchitecture::kGemma;
  else if (name == "Gemma2ForCausalLM") out.arch = HfArchitecture::kGemma2;
  else if (name == "Gemma3ForCausalLM") out.arch = HfArchitecture::kGemma3;
  else if (name == "BaichuanForCausalLM") out.arch = HfArchitecture::kBaichuan;
  else if (name == "ChatGLMModel" || name == "ChatGLMForConditionalGeneration") out.arch = HfArchitecture::kChatGLM;
  else
    return Unimplemented(path, ": architecture '", name,
                         "' is not supported yet (supported: GPT2LMHeadModel, BloomForCausalLM, LlamaForCausalLM, "
                         "Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, MixtralForCausalLM, "
                         "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, Qwen3NextForCausalLM, DeepseekV3ForCausalLM, DeepseekV32ForCausalLM, "
                         "GptOssForCausalLM, InternLM2ForCausalLM, Phi3ForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM, "
                         "Gemma3ForCausalLM, BaichuanForCausalLM, ChatGLMModel, ChatGLMForConditionalGeneration)");
  GALE_RETURN_IF_ERROR(out.arch == HfArchitecture::kGpt2         ? read_gpt2(c, out)
                       : out.arch == HfArchitecture::kBloom      ? read_bloom(c, out)
                       : out.arch == HfArchitecture::kDeepseekV3 ? read_deepseek_v3(c, out)
                       : out.arch == HfArchitecture::kGptOss     ? read_gpt_oss(c, out)
                       : out.arch == HfArchitecture::kChatGLM    ? read_chatglm(c, out)
                                                                 : read_llama_family(c, config, out));
  if (name == kDeepseekV32Name) GALE_RETURN_IF_ERROR(read_deepseek_v32_indexer(config, path, out));
  // ChatGLM's embedding and output_layer have padded_vocab_size rows (its vocab_size, if any, is the tokenizer's).
  GALE_ASSIGN_OR_RETURN(out.vocab_size,
                        c.positive(out.arch == HfArchitecture::kChatGLM ? "padded_vocab_size" : "vocab_size"));
  GALE_ASSIGN_OR_RETURN(out.torch_dtype, c.string("torch_dtype", ""));
  out.target_tensor_parallel = tensor_parallel;
  ModelArgs& m = out.model;
  if (m.num_attention_heads % tensor_parallel != 0 || m.num_kv_heads % tensor_parallel != 0)
    return InvalidArgument("--target-tensor-parallel-size ", tensor_parallel, ": does not divide the ",
                           m.num_attention_heads, " attention heads and ", m.num_kv_heads, " key/value heads of ",
                           path);
  m.seq_length = m.max_position_embeddings;
  // Qwen3-Next: partial_rotary_factor; ChatGLM: half of each head.
  m.rotary_percent = out.arch == HfArchitecture::kQwen3Next ? m.rotary_percent
                     : out.arch == HfArchitecture::kChatGLM ? 0.5
                                                            : 1.0;
  m.make_vocab_size_divisible_by = divisible_by;
  m.padded_vocab_size = pad_vocab_size(out.vocab_size, divisible_by, tensor_parallel);
  return out;
}

StatusOr<HfModel> hf_model_from_args(const ModelArgs& m, const MoeArgs& moe, int64_t vocab_size,
                                     const std::string& where) {
  HfModel out;
  out.model = m;
  out.moe = moe;
  out.vocab_size = vocab_size;
  // Gemma-2's features (train/arguments_gemma2.cc): only Gemma2ForCausalLM holds them.
  if (m.post_norm || !unset(m.output_logit_softcapping) || !unset(m.attn_logit_softcapping) ||
      m.query_pre_attn_scalar != kUnset) {
    GALE_RETURN_IF_ERROR(gemma2_from_args(m, moe, where));
    out.arch = m.qk_layernorm ? HfArchitecture::kGemma3 : HfArchitecture::kGemma2;
    if (vocab_size <= 0 || vocab_size > m.padded_vocab_size)
      return InvalidArgument("--vocab-size ", vocab_size, ": expected 1 to the checkpoint's padded vocabulary ",
                             m.padded_vocab_size);
    return out;
  }
  if (m.softmax_type == "learnable" || m.quick_geglu || m.glu_linear_offset != 0.0 ||
      !unset(m.activation_func_clamp_value)) {  // gpt-oss's sinks or activation: nothing else holds them
    GALE_RETURN_IF_ERROR(gpt_oss_from_args(m, moe, where));
    out.arch = HfArchitecture::kGptOss;
    out.model.ffn_hidden_size = moe.moe_ffn_hidden_size;
    if (vocab_size <= 0 || vocab_size > m.padded_vocab_size)
      return InvalidArgument("--vocab-size ", vocab_size, ": expected 1 to the checkpoint's padded vocabulary ",
                             m.padded_vocab_size);
    return out;
  }
  if (m.geglu || m.gelu_tanh || m.add_rmsnorm_offset || m.input_embeds_norm) {  // MindSpeed-LLM's Gemma flags
    GALE_RETURN_IF_ERROR(gemma_from_args(m, moe, where));
    out.arch = HfArchitecture::kGemma;
    if (vocab_size <= 0 || vocab_size > m.padded_vocab_size)
      return InvalidArgument("--vocab-size ", vocab_size, ": expected 1 to the checkpoint's padded vocabulary ",
                             m.padded_vocab_size);
    return out;
  }
  if (m.rotary_interleaved && m.rotary_percent == 0.5 && m.position_embedding_type == "rope") {  // GLM's RoPE
    GALE_RETURN_IF_ERROR(chatglm_from_args(m, moe, where));
    out.arch = HfArchitecture::kChatGLM;
    if (vocab_size <= 0 || vocab_size > m.padded_vocab_size)
      return InvalidArgument("--vocab-size ", vocab_size, ": expected 1 to the checkpoint's padded vocabulary ",
                             m.padded_vocab_size);
    return out;
  }
  const bool gpt2 = m.normalization == "LayerNorm" && !m.swiglu && m.position_embedding_type == "learned_absolute" &&
                    m.add_bias_linear && !m.add_qkv_bias && !m.untie_embeddings_and_output_weights &&
                    m.num_kv_heads == m.num_attention_heads && m.kv_channels * m.num_attention_heads == m.hidden_size;
  const bool yarn = m.position_embedding_type == "yarn";  // written as rope_scaling yarn (add_llama_yarn)
  const bool llama = m.normalization == "RMSNorm" && m.swiglu && (m.position_embedding_type == "rope" || yarn) &&
                     !m.add_bias_linear && m.rotary_percent == 1.0;
  if (yarn && !llama)
    return Unimplemented(where, ": the model has --position-embedding-type yarn, which Gale writes only in "
                         "LLaMA-family configs (RMSNorm, SwiGLU, --disable-bias-linear)");
  if (yarn && !((m.mscale == 1.0 && m.mscale_all_dim == 0.0) || (m.mscale != 0.0 && m.mscale_all_dim != 0.0)))
    return Unimplemented(where, ": --mscale ", m.mscale, " with --mscale-all-dim ", m.mscale_all_dim,
                         ": a Hugging Face rope_scaling yarn holds mscale 1 with mscale_all_dim 0 (unset), or both "
                         "non-zero");
  const bool bloom = m.position_embedding_type == "alibi" && m.embed_layernorm && m.normalization == "LayerNorm" &&
                     !m.swiglu && m.openai_gelu && m.add_bias_linear && !m.untie_embeddings_and_output_weights &&
                     m.num_kv_heads == m.num_attention_heads &&
                     m.kv_channels * m.num_attention_heads == m.hidden_size && m.ffn_hidden_size == 4 * m.hidden_size &&
                     !moe.enabled() && !m.qk_layernorm && m.sliding_window == kUnset;
  if (m.position_embedding_type == "alibi" && !bloom)
    return Unimplemented(where, ": the model has --position-embedding-type alibi, which Gale writes only as "
                         "BloomForCausalLM: with --embed-layernorm, LayerNorm, --openai-gelu, linear biases, tied "
                         "embeddings, multi-head attention (no GQA) and --ffn-hidden-size 4 x hidden, without experts, "
                         "--qk-layernorm or --sliding-window");
  if (m.embed_layernorm && !bloom)
    return Unimplemented(where, ": the model has --embed-layernorm, which Gale writes only as BloomForCausalLM "
                         "(with --position-embedding-type alibi)");
  if (m.multi_latent_attention) GALE_RETURN_IF_ERROR(deepseek_v3_from_args(m, moe, where));
  if (hf_is_deepseek_v32(m)) GALE_RETURN_IF_ERROR(deepseek_v32_from_args(m, where));
  out.mtp_layers = m.mtp_num_layers == kUnset ? 0 : m.mtp_num_layers;
  if (out.mtp_layers > 0 && !m.multi_latent_attention)
    return Unimplemented(where, ": the model has --mtp-num-layers ", out.mtp_layers,
                         " (multi-token prediction), which Gale writes only as DeepseekV3ForCausalLM's "
                         "num_nextn_predict_layers (pass --mtp-num-layers 0 to leave the MTP layers out)");
  if (!m.noop_layers.empty())
    return Unimplemented(where, ": the model has --noop-layers ", m.noop_layers_flag,
                         " (identity layers), which no Hugging Face architecture Gale writes can hold");
  // Qwen3-Next, which nothing else writes: Gated DeltaNet layers, or gated attention alone.
  if (m.experimental_attention_variant == "gdn" || m.attention_output_gate) {
    GALE_RETURN_IF_ERROR(qwen3_next_from_args(m, moe, where));
    out.arch = HfArchitecture::kQwen3Next;
    if (vocab_size <= 0 || vocab_size > m.padded_vocab_size)
      return InvalidArgument("--vocab-size ", vocab_size, ": expected 1 to the checkpoint's padded vocabulary ",
                             m.padded_vocab_size);
    return out;
  }
  if (m.squared_relu || m.apply_layernorm_1p || m.rotary_interleaved)
    return Unimplemented(where, ": the model has ",
                         m.squared_relu         ? "--squared-relu"
                         : m.apply_layernorm_1p ? "--apply-layernorm-1p"
                                                : "--rotary-interleaved",
                         ", which no Hugging Face architecture Gale writes can hold",
                         m.rotary_interleaved ? " (ChatGLMModel holds it with --rotary-percent 0.5)" : "");
  if (m.softmax_type != "vanilla")  // off-by-one (learnable: GptOssForCausalLM above)
    return Unimplemented(where, ": the model has --softmax-type ", m.softmax_type,
                         " (attention sinks), which no Hugging Face architecture Gale writes can hold "
                         "(GptOssForCausalLM's sinks are --softmax-type learnable)");
  if (m.qk_l2_norm)
    return Unimplemented(where, ": the model has --qk-l2-norm, which Gale does not write to Hugging Face yet "
                         "(Llama4ForCausalLM's use_qk_norm: not supported yet)");
  if (!m.no_rope_pattern.empty())
    return Unimplemented(where, ": the model has --no-rope-freq ", m.no_rope_freq,
                         " (layers without RoPE), which no Hugging Face architecture Gale writes can hold");
  if (m.use_rope_scaling && !unset(m.rotary_seq_len_interpolation_factor))
    return Unimplemented(where, ": the model has both --use-rope-scaling and --rotary-seq-len-interpolation-factor; "
                         "a Hugging Face rope_scaling holds one of them (llama3 or linear)");
  const bool shared_expert = moe.enabled() && moe.moe_shared_expert_intermediate_size != kUnset;
  if (!m.multi_latent_attention && m.qk_layernorm && (shared_expert || !llama || m.add_qkv_bias))
    return Unimplemented(where, ": the model has --qk-layernorm, which is written as Qwen3ForCausalLM or "
                         "Qwen3MoeForCausalLM only when it is LLaMA-shaped (RMSNorm, SwiGLU, rope with --rotary-percent "
                         "1, --disable-bias-linear, no --add-qkv-bias) without a shared expert");
  if (m.multi_latent_attention) {
    out.arch = HfArchitecture::kDeepseekV3;
  } else if (moe.enabled()) {
    const bool every_layer = std::all_of(moe.layer_pattern.begin(), moe.layer_pattern.end(), [](int f) { return f == 1; });
    // Mixtral's, Qwen2-MoE's and Qwen3-MoE's gates are the softmax top-k: no sigmoid scores, expert bias, scaling
    // or groups.
    if (moe.moe_router_score_function != "softmax" || moe.moe_router_enable_expert_bias ||
        !unset(moe.moe_router_topk_scaling_factor) || moe.moe_router_group_topk != kUnset)
      return Unimplemented(where, ": a mixture-of-experts model is written as MixtralForCausalLM, Qwen2MoeForCausalLM "
                           "or Qwen3MoeForCausalLM only with softmax routing (found --moe-router-score-function ", moe.moe_router_score_function,
                           ", expert bias ", moe.moe_router_enable_expert_bias ? "on" : "off",
                           ", top-k scaling factor ", unset(moe.moe_router_topk_scaling_factor) ? "unset" : "set",
                           ", group-limited routing ", moe.moe_router_group_topk != kUnset ? "on" : "off", ")");
    const bool shared = moe.moe_shared_expert_intermediate_size != kUnset;
    if (m.qk_layernorm) {  // Qwen3-MoE: LLaMA-shaped, no shared expert (checked above), any pattern and routing
      out.arch = HfArchitecture::kQwen3Moe;
    } else if (shared) {  // Qwen2-MoE: q/k/v biases, a gated shared expert, any layer pattern, either routing
      if (!llama || !m.add_qkv_bias || !moe.moe_shared_expert_gate)
        return Unimplemented(where, ": a mixture-of-experts model with a shared expert is written as "
                             "Qwen2MoeForCausalLM only when it is Qwen2-shaped (RMSNorm, SwiGLU, rope, "
                             "--disable-bias-linear with --add-qkv-bias, found --add-qkv-bias ",
                             m.add_qkv_bias ? "on" : "off", ") with --moe-shared-expert-gate (found it ",
                             moe.moe_shared_expert_gate ? "on" : "off", ")");
      out.arch = HfArchitecture::kQwen2Moe;
    } else {
      if (!llama || m.add_qkv_bias || !every_layer || moe.moe_router_pre_softmax)
        return Unimplemented(where, ": a mixture-of-experts model (", moe.num_experts,
                             " experts) is written as MixtralForCausalLM only when it is LLaMA-shaped (RMSNorm, SwiGLU, "
                             "rope, no biases) with experts in every layer (--moe-layer-freq 1, found ",
                             moe.moe_layer_freq, ") and Megatron's default routing (found --moe-router-pre-softmax ",
                             moe.moe_router_pre_softmax ? "on" : "off", ")");
      out.arch = HfArchitecture::kMixtral;
      out.model.ffn_hidden_size = moe.moe_ffn_hidden_size;
    }
  } else if (bloom) out.arch = HfArchitecture::kBloom;
  else if (gpt2) out.arch = HfArchitecture::kGpt2;
  else if (llama) out.arch = m.qk_layernorm                   ? HfArchitecture::kQwen3
                             : m.add_qkv_bias                 ? HfArchitecture::kQwen2
                             : m.sliding_window != kUnset     ? HfArchitecture::kMistral
                                                              : HfArchitecture::kLlama;
  else
    return Unimplemented(where, ": no Hugging Face architecture Gale writes matches this model (normalization ",
                         m.normalization, ", swiglu ", m.swiglu ? "on" : "off", ", position embedding ",
                         m.position_embedding_type, ", linear biases ", m.add_bias_linear ? "on" : "off",
                         "); supported: GPT2LMHeadModel (LayerNorm, GeLU, learned_absolute, biases, tied, MHA) and "
                         "LlamaForCausalLM / Qwen2ForCausalLM (RMSNorm, SwiGLU, rope with --rotary-percent 1, "
                         "--disable-bias-linear)");
  // --window-attn-skip-freq (full-attention layers among windowed ones): Qwen2's and Qwen3's layer_types.
  if (!m.window_attn_pattern.empty() && m.sliding_window != kUnset && out.arch != HfArchitecture::kQwen2 &&
      out.arch != HfArchitecture::kQwen3)
    return Unimplemented(where, ": the model has --window-attn-skip-freq ", m.window_attn_skip_freq,
                         " (full-attention layers among windowed ones), which ", hf_architecture_name(out.arch),
                         " cannot hold (written as Qwen2ForCausalLM with --add-qkv-bias or Qwen3ForCausalLM with "
                         "--qk-layernorm: layer_types, or GptOssForCausalLM)");
  if (m.sliding_window != kUnset && (out.arch == HfArchitecture::kGpt2 || out.arch == HfArchitecture::kDeepseekV3 ||
                                     out.arch == HfArchitecture::kQwen3Moe))
    return Unimplemented(where, ": the model has --sliding-window ", m.sliding_window, ", which ",
                         hf_architecture_name(out.arch), " cannot hold (written as MistralForCausalLM, "
                         "MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM or Qwen3ForCausalLM)");
  if (m.rope_scaling_type == "longrope") {  // only Phi-3's config holds LongRoPE
    if (out.arch != HfArchitecture::kLlama && out.arch != HfArchitecture::kMistral)
      return Unimplemented(where, ": the model has --rope-scaling-type longrope, which Gale writes only as "
                           "Phi3ForCausalLM (LLaMA's block: RMSNorm, SwiGLU, no biases, no experts), found a ",
                           hf_architecture_name(out.arch));
    if (m.kv_channels * m.num_attention_heads != m.hidden_size || m.rotary_percent != 1.0 || m.rotary_interleaved)
      return Unimplemented(where, ": the model has --rope-scaling-type longrope, which Gale writes only as "
                           "Phi3ForCausalLM: expected --kv-channels = hidden / heads and RoPE over whole heads in "
                           "halves, found --kv-channels ", m.kv_channels, ", --rotary-percent ", m.rotary_percent,
                           m.rotary_interleaved ? ", --rotary-interleaved" : "");
    if (!unset(m.short_mscale) && m.short_mscale != m.long_mscale)
      return Unimplemented(where, ": --short-mscale ", m.short_mscale, " and --long-mscale ", m.long_mscale,
                           ": Phi-3's config holds one attention_factor for both");
    out.arch = HfArchitecture::kPhi3;
  }
  if (vocab_size <= 0 || vocab_size > m.padded_vocab_size)
    return InvalidArgument("--vocab-size ", vocab_size, ": expected 1 to the checkpoint's padded vocabulary ",
                           m.padded_vocab_size);
  return out;
}

nlohmann::json hf_config_json(const HfModel& hf, const std::string& torch_dtype) {
  const ModelArgs& m = hf.model;
  nlohmann::json j;
  j["architectures"] = {hf_architecture_name(hf.arch)};
  if (hf.arch == HfArchitecture::kChatGLM) {
    j = chatglm_config(hf);
  } else if (hf.arch == HfArchitecture::kGpt2) {
    j["model_type"] = "gpt2";
    j["n_embd"] = m.hidden_size;
    j["n_layer"] = m.num_layers;
    j["n_head"] = m.num_attention_heads;
    j["n_inner"] = m.ffn_hidden_size;
    j["n_positions"] = m.max_position_embeddings;
    j["n_ctx"] = m.max_position_embeddings;
    j["layer_norm_epsilon"] = m.norm_epsilon;
    j["activation_function"] = m.openai_gelu ? "gelu_new" : "gelu";  // tanh approximation, or exact erf GeLU
    j["attn_pdrop"] = j["embd_pdrop"] = j["resid_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
    j["tie_word_embeddings"] = true;
  } else if (hf.arch == HfArchitecture::kBloom) {
    j["model_type"] = "bloom";
    j["hidden_size"] = m.hidden_size;
    j["n_layer"] = m.num_layers;
    j["n_head"] = m.num_attention_heads;
    j["layer_norm_epsilon"] = m.norm_epsilon;
    j["seq_length"] = m.max_position_embeddings;  // not read by transformers; Gale reads it back
    j["apply_residual_connection_post_layernorm"] = false;
    j["hidden_dropout"] = j["attention_dropout"] = 0.0;
    j["pretraining_tp"] = 1;
    j["slow_but_exact"] = false;
    j["tie_word_embeddings"] = true;
  } else if (hf.arch == HfArchitecture::kDeepseekV3) {
    add_deepseek_v3_config(hf, &j);
    if (hf_is_deepseek_v32(m)) add_deepseek_v32_config(m, &j);
  } else {
    j["model_type"] = hf.arch == HfArchitecture::kQwen2      ? "qwen2"
                      : hf.arch == HfArchitecture::kMistral  ? "mistral"
                      : hf.arch == HfArchitecture::kMixtral  ? "mixtral"
                      : hf.arch == HfArchitecture::kQwen2Moe ? "qwen2_moe"
                      : hf.arch == HfArchitecture::kQwen3    ? "qwen3"
                      : hf.arch == HfArchitecture::kQwen3Moe ? "qwen3_moe"
                      : hf.arch == HfArchitecture::kQwen3Next ? "qwen3_next"
                      : hf.arch == HfArchitecture::kInternLM2 ? "internlm2"
                      : hf.arch == HfArchitecture::kPhi3     ? "phi3"
                      : hf.arch == HfArchitecture::kGemma    ? "gemma"
                      : hf.arch == HfArchitecture::kGemma2   ? "gemma2"
                      : hf.arch == HfArchitecture::kGemma3   ? "gemma3_text"
                      : hf.arch == HfArchitecture::kBaichuan ? "baichuan"
                                                             : "llama";
    j["hidden_size"] = m.hidden_size;
    j["num_hidden_layers"] = m.num_layers;
    j["num_attention_heads"] = m.num_attention_heads;
    j["num_key_value_heads"] = m.num_kv_heads;
    j["head_dim"] = m.kv_channels;
    j["intermediate_size"] = m.ffn_hidden_size;
    j["hidden_act"] = "silu";
    if (hf.arch == HfArchitecture::kGemma)  // both keys, so that every transformers release runs the same GeLU
      j["hidden_act"] = j["hidden_activation"] = m.gelu_tanh ? "gelu_pytorch_tanh" : "gelu";
    j["max_position_embeddings"] = m.max_position_embeddings;
    j["rms_norm_eps"] = m.norm_epsilon;
    j["rope_theta"] = static_cast<double>(m.rotary_base);
    if (m.use_rope_scaling)
      j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", m.rope_scaling_factor}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    else if (!unset(m.rotary_seq_len_interpolation_factor))
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", m.rotary_seq_len_interpolation_factor}};
    else if (m.position_embedding_type == "yarn")
      add_llama_yarn(m, &j);
    else
      j["rope_scaling"] = nullptr;
    j["attention_dropout"] = 0.0;
    j["tie_word_embeddings"] = !m.untie_embeddings_and_output_weights;
    const bool window = m.sliding_window != kUnset;
    if (hf.arch == HfArchitecture::kGptOss) {
      add_gpt_oss_config(hf, &j);
    } else if (hf.arch == HfArchitecture::kMixtral) {
      j["sliding_window"] = window ? nlohmann::json(m.sliding_window) : nlohmann::json();
      j["num_local_experts"] = hf.moe.num_experts;
      j["num_experts_per_tok"] = hf.moe.moe_router_topk;
      j["router_jitter_noise"] = 0.0;
      j["output_router_logits"] = false;
    } else if (hf.arch == HfArchitecture::kQwen2 || hf.arch == HfArchitecture::kQwen2Moe ||
               hf.arch == HfArchitecture::kQwen3) {
      if (hf.arch == HfArchitecture::kQwen3) j["attention_bias"] = false;
      // With --sliding-window every layer has it: max_window_layers 0 (layers i >= 0 are windowed). With
      // --window-attn-skip-freq (Qwen2 and Qwen3 only) layer_types lists the layers (transformers >= 4.53
      // reads it) and max_window_layers counts the leading full-attention layers (the same layers when
      // the windowed ones are a suffix).
      j["use_sliding_window"] = window;
      j["sliding_window"] = window ? m.sliding_window : m.max_position_embeddings;
      j["max_window_layers"] = window ? 0 : m.num_layers;
      if (window && !m.window_attn_pattern.empty()) {
        nlohmann::json types = nlohmann::json::array();
        for (int f : m.window_attn_pattern) types.push_back(f != 0 ? "sliding_attention" : "full_attention");
        j["layer_types"] = types;
        j["max_window_layers"] = std::find(m.window_attn_pattern.begin(), m.window_attn_pattern.end(), 1) -
                                 m.window_attn_pattern.begin();
      }
      if (hf.arch == HfArchitecture::kQwen2Moe) add_qwen_moe_config(hf.moe, m.num_layers, true, &j);
    } else if (hf.arch == HfArchitecture::kQwen3Moe) {
      j["attention_bias"] = false;
      j["use_sliding_window"] = false;  // hf_model_from_args refuses --sliding-window for Qwen3-MoE
      j["sliding_window"] = nullptr;
      j["max_window_layers"] = m.num_layers;
      add_qwen_moe_config(hf.moe, m.num_layers, false, &j);
    } else if (hf.arch == HfArchitecture::kQwen3Next) {
      add_qwen3_next_config(hf, &j);
    } else if (hf.arch == HfArchitecture::kMistral) {
      j["sliding_window"] = m.sliding_window;
    } else if (hf.arch == HfArchitecture::kInternLM2) {
      add_internlm2_config(hf, &j);
    } else if (hf.arch == HfArchitecture::kPhi3) {
      add_phi3_config(hf, &j);
    } else if (hf.arch == HfArchitecture::kGemma) {
      j["attention_bias"] = false;
    } else if (hf.arch == HfArchitecture::kGemma2 || hf.arch == HfArchitecture::kGemma3) {
      add_gemma2_config(hf, &j);
    } else if (hf.arch == HfArchitecture::kBaichuan) {
      add_baichuan_config(&j);
    } else {
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
    }
  }
  j["vocab_size"] = hf.vocab_size;
  j["torch_dtype"] = torch_dtype;
  return j;
}

namespace {

// Baichuan2-7B holds an untied multi-head LLaMA with RoPE base 10000 and nothing else.
std::string keep_baichuan(HfModel* m, const std::string& source) {
  const ModelArgs& a = m->model;
  std::string why;
  if (m->arch != HfArchitecture::kLlama)
    why = str_cat("it is a ", hf_architecture_name(m->arch), " (biases, norms, a window or experts Baichuan lacks)");
  else if (a.kv_channels * a.num_attention_heads != a.hidden_size)
    why = str_cat("--kv-channels ", a.kv_channels, " is not hidden / heads");
  else if (a.num_kv_heads != a.num_attention_heads)
    why = str_cat("--num-query-groups ", a.num_kv_heads, ": W_pack is multi-head");
  else if (a.position_embedding_type != "rope" || a.use_rope_scaling || !unset(a.rotary_seq_len_interpolation_factor))
    why = "its RoPE is unscaled";
  else if (a.rotary_base != 10000)
    why = str_cat("--rotary-base ", a.rotary_base, ": its RoPE base is 10000");
  else if (!a.untie_embeddings_and_output_weights)
    why = "its lm_head is not tied to the embedding";
  if (!why.empty())
    return str_cat("the checkpoint was converted from ", source, ", which cannot hold it (", why, "): writing it as ",
                   hf_architecture_name(m->arch));
  m->arch = HfArchitecture::kBaichuan;
  return "";
}

}  // namespace

std::string hf_keep_source_architecture(HfModel* m, const nlohmann::json& hf_source) {
  if (!hf_source.is_object() || !hf_source.contains("architecture") || !hf_source["architecture"].is_string())
    return "";
  const std::string source = hf_source["architecture"].get<std::string>();
  if (source == hf_architecture_name(HfArchitecture::kBaichuan)) return keep_baichuan(m, source);
  const bool internlm2 = source == hf_architecture_name(HfArchitecture::kInternLM2);
  if (!internlm2 && source != hf_architecture_name(HfArchitecture::kPhi3)) return "";
  const ModelArgs& a = m->model;
  std::string why;
  if (a.kv_channels * a.num_attention_heads != a.hidden_size)
    why = str_cat("--kv-channels ", a.kv_channels, " is not hidden / heads");
  else if (a.position_embedding_type != "rope" || a.use_rope_scaling)
    why = "its RoPE scaling (yarn or llama3) has no place in its config";
  else if (internlm2 && a.rope_scaling_type == "longrope")
    why = "InternLM2 has no LongRoPE (--rope-scaling-type longrope)";
  else if (internlm2 && m->arch != HfArchitecture::kLlama)
    why = str_cat("it is a ", hf_architecture_name(m->arch), " (biases, norms, a window or experts InternLM2 lacks)");
  else if (!internlm2 && m->arch != HfArchitecture::kLlama && m->arch != HfArchitecture::kMistral &&
           m->arch != HfArchitecture::kPhi3)  // kPhi3: a LongRoPE model (hf_model_from_args)
    why = str_cat("it is a ", hf_architecture_name(m->arch), " (biases, norms or experts Phi-3 lacks)");
  else if (!internlm2 && !unset(a.rotary_seq_len_interpolation_factor))
    why = "Phi-3 has no linear RoPE interpolation (--rotary-seq-len-interpolation-factor)";
  if (!why.empty())
    return str_cat("the checkpoint was converted from ", source, ", which cannot hold it (", why, "): writing it as ",
                   hf_architecture_name(m->arch));
  m->arch = internlm2 ? HfArchitecture::kInternLM2 : HfArchitecture::kPhi3;
  if (internlm2 && unset(a.rotary_seq_len_interpolation_factor) && hf_source.contains("rope_scaling"))
    m->internlm2_dynamic_rope = hf_source["rope_scaling"];
  return "";
}

}  // namespace gale
