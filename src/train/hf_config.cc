// Parsing and writing Hugging Face config.json for GPT-2, LLaMA, Qwen2, Qwen3, Mistral, Mixtral and Qwen2-MoE.
#include "train/hf_config.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace gale {

const char* hf_architecture_name(HfArchitecture a) {
  switch (a) {
    case HfArchitecture::kGpt2: return "GPT2LMHeadModel";
    case HfArchitecture::kLlama: return "LlamaForCausalLM";
    case HfArchitecture::kQwen2: return "Qwen2ForCausalLM";
    case HfArchitecture::kMistral: return "MistralForCausalLM";
    case HfArchitecture::kMixtral: return "MixtralForCausalLM";
    case HfArchitecture::kQwen2Moe: return "Qwen2MoeForCausalLM";
    case HfArchitecture::kQwen3: return "Qwen3ForCausalLM";
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

// rope_scaling {"rope_type": "llama3", "factor": F, "low_freq_factor": 1, "high_freq_factor": 4,
// "original_max_position_embeddings": 8192} is Megatron's --use-rope-scaling --rope-scaling-factor F
// (its other constants are fixed); anything else is refused.
Status read_llama3_rope_scaling(const ConfigReader& c, ModelArgs* m) {
  const nlohmann::json& j = c.json().at("rope_scaling");
  const std::string why = "Megatron's --use-rope-scaling is Llama 3's scaling with low_freq_factor 1, high_freq_factor 4 "
                          "and original_max_position_embeddings 8192";
  if (!j.is_object()) return refuse(c, "rope_scaling", why);
  const std::string type = j.value("rope_type", j.value("type", std::string()));
  auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : -1.0; };
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

// Qwen2-MoE's experts and shared expert as Megatron's MoE flags.
Status read_qwen2_moe_experts(const ConfigReader& c, const nlohmann::json& j, HfModel& out) {
  MoeArgs& moe = out.moe;
  const int64_t L = out.model.num_layers;
  GALE_ASSIGN_OR_RETURN(moe.num_experts, c.positive("num_experts"));
  GALE_ASSIGN_OR_RETURN(moe.moe_router_topk, c.positive("num_experts_per_tok"));
  if (moe.moe_router_topk > moe.num_experts)
    return InvalidArgument(c.path(), ": num_experts_per_tok ", moe.moe_router_topk, " exceeds num_experts ",
                           moe.num_experts);
  GALE_ASSIGN_OR_RETURN(moe.moe_ffn_hidden_size, c.positive("moe_intermediate_size"));
  GALE_ASSIGN_OR_RETURN(moe.moe_shared_expert_intermediate_size, c.positive("shared_expert_intermediate_size"));
  moe.moe_shared_expert_gate = true;  // Qwen2-MoE always gates its shared expert
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
  if (std::none_of(pattern.begin(), pattern.end(), [](int f) { return f == 1; }))
    return Unimplemented(c.path(), ": 'decoder_sparse_step' / 'mlp_only_layers' leave no sparse layer; convert it as "
                         "a dense model (Qwen2ForCausalLM) instead");
  moe.layer_pattern = pattern;
  moe.moe_layer_freq = "[";
  for (int64_t i = 0; i < L; ++i) moe.moe_layer_freq += (i ? "," : "") + std::to_string(pattern[i]);
  moe.moe_layer_freq += "]";
  return Status::Ok();
}

Status read_llama_family(const ConfigReader& c, const nlohmann::json& j, HfModel& out) {
  ModelArgs& m = out.model;
  GALE_ASSIGN_OR_RETURN(m.hidden_size, c.positive("hidden_size"));
  GALE_ASSIGN_OR_RETURN(m.num_layers, c.positive("num_hidden_layers"));
  GALE_ASSIGN_OR_RETURN(m.num_attention_heads, c.positive("num_attention_heads"));
  GALE_ASSIGN_OR_RETURN(m.num_kv_heads, c.positive("num_key_value_heads", m.num_attention_heads));
  GALE_ASSIGN_OR_RETURN(m.ffn_hidden_size, c.positive("intermediate_size"));
  GALE_ASSIGN_OR_RETURN(m.max_position_embeddings, c.positive("max_position_embeddings"));
  GALE_ASSIGN_OR_RETURN(m.norm_epsilon, c.number("rms_norm_eps", 1e-6));
  const int64_t default_head_dim = m.hidden_size / m.num_attention_heads;
  GALE_ASSIGN_OR_RETURN(m.kv_channels, c.positive("head_dim", default_head_dim));
  if (!c.set("head_dim") && m.hidden_size % m.num_attention_heads != 0)
    return InvalidArgument(c.path(), ": hidden_size ", m.hidden_size, " is not a multiple of num_attention_heads ",
                           m.num_attention_heads, " and there is no head_dim");
  if (m.num_attention_heads % m.num_kv_heads != 0)
    return InvalidArgument(c.path(), ": num_attention_heads ", m.num_attention_heads,
                           " is not a multiple of num_key_value_heads ", m.num_kv_heads);
  GALE_ASSIGN_OR_RETURN(std::string act, c.string("hidden_act", "silu"));
  if (act != "silu") return refuse(c, "hidden_act", "the MLP is SwiGLU: silu(gate) * up");
  GALE_ASSIGN_OR_RETURN(double theta, c.number("rope_theta", 10000.0));
  if (theta <= 0 || theta != std::floor(theta) || theta > 9.0e15)
    return refuse(c, "rope_theta", "Megatron's --rotary-base is a positive integer");
  m.rotary_base = static_cast<int64_t>(theta);
  if (c.set("rope_scaling")) GALE_RETURN_IF_ERROR(read_llama3_rope_scaling(c, &m));
  GALE_ASSIGN_OR_RETURN(bool attention_bias, c.boolean("attention_bias", false));
  if (attention_bias) return refuse(c, "attention_bias", "biases on q/k/v/o; Qwen2's q/k/v-only bias is supported");
  GALE_ASSIGN_OR_RETURN(bool mlp_bias, c.boolean("mlp_bias", false));
  if (mlp_bias) return refuse(c, "mlp_bias", "MLP biases");
  GALE_ASSIGN_OR_RETURN(bool tie, c.boolean("tie_word_embeddings", false));
  const bool mistral_like = out.arch == HfArchitecture::kMistral || out.arch == HfArchitecture::kMixtral;
  const bool qwen2 = out.arch == HfArchitecture::kQwen2 || out.arch == HfArchitecture::kQwen2Moe;
  const bool qwen3 = out.arch == HfArchitecture::kQwen3;
  if (mistral_like || qwen2 || qwen3) {
    GALE_ASSIGN_OR_RETURN(bool use_window, c.boolean("use_sliding_window", mistral_like));
    if (use_window && c.set("sliding_window")) {
      GALE_ASSIGN_OR_RETURN(int64_t window, c.positive("sliding_window"));
      if (window < m.max_position_embeddings)
        return Unimplemented(c.path(), ": 'sliding_window' = ", window, " is shorter than max_position_embeddings ",
                             m.max_position_embeddings, ": sliding-window attention is not supported yet");
    }
  }
  m.group_query_attention = m.num_kv_heads != m.num_attention_heads;
  m.num_query_groups = m.group_query_attention ? m.num_kv_heads : 1;
  m.normalization = "RMSNorm";
  m.position_embedding_type = "rope";
  m.swiglu = true;
  m.add_bias_linear = false;
  m.add_qkv_bias = qwen2;
  m.qk_layernorm = qwen3;  // Qwen3's q_norm / k_norm (RMSNorm over head_dim, eps rms_norm_eps)
  m.untie_embeddings_and_output_weights = !tie;
  if (out.arch == HfArchitecture::kMixtral) GALE_RETURN_IF_ERROR(read_mixtral_experts(c, out));
  if (out.arch == HfArchitecture::kQwen2Moe) GALE_RETURN_IF_ERROR(read_qwen2_moe_experts(c, j, out));
  return Status::Ok();
}

// Qwen2-MoE's expert keys. The sparse layers as decoder_sparse_step when one step gives them, else
// as mlp_only_layers (with step 1; transformers releases before mlp_only_layers ignore it).
void add_qwen2_moe_config(const MoeArgs& moe, int64_t L, nlohmann::json* j) {
  (*j)["num_experts"] = moe.num_experts;
  (*j)["num_experts_per_tok"] = moe.moe_router_topk;
  (*j)["moe_intermediate_size"] = moe.moe_ffn_hidden_size;
  (*j)["shared_expert_intermediate_size"] = moe.moe_shared_expert_intermediate_size;
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

}  // namespace

StatusOr<HfModel> hf_model_from_config(const nlohmann::json& config, const std::string& path, int64_t divisible_by,
                                       int64_t tensor_parallel) {
  if (!config.is_object()) return InvalidArgument(path, ": expected a JSON object");
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
  else if (name == "Qwen3ForCausalLM") out.arch = HfArchitecture::kQwen3;
  else
    return Unimplemented(path, ": architecture '", name,
                         "' is not supported yet (supported: GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, "
                         "MistralForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM)");
  GALE_RETURN_IF_ERROR(out.arch == HfArchitecture::kGpt2 ? read_gpt2(c, out) : read_llama_family(c, config, out));
  GALE_ASSIGN_OR_RETURN(out.vocab_size, c.positive("vocab_size"));
  GALE_ASSIGN_OR_RETURN(out.torch_dtype, c.string("torch_dtype", ""));
  out.target_tensor_parallel = tensor_parallel;
  ModelArgs& m = out.model;
  if (m.num_attention_heads % tensor_parallel != 0 || m.num_kv_heads % tensor_parallel != 0)
    return InvalidArgument("--target-tensor-parallel-size ", tensor_parallel, ": does not divide the ",
                           m.num_attention_heads, " attention heads and ", m.num_kv_heads, " key/value heads of ",
                           path);
  m.seq_length = m.max_position_embeddings;
  m.rotary_percent = 1.0;
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
  const bool gpt2 = m.normalization == "LayerNorm" && !m.swiglu && m.position_embedding_type == "learned_absolute" &&
                    m.add_bias_linear && !m.add_qkv_bias && !m.untie_embeddings_and_output_weights &&
                    m.num_kv_heads == m.num_attention_heads && m.kv_channels * m.num_attention_heads == m.hidden_size;
  const bool llama = m.normalization == "RMSNorm" && m.swiglu && m.position_embedding_type == "rope" &&
                     !m.add_bias_linear && m.rotary_percent == 1.0;
  if (m.multi_latent_attention)
    return Unimplemented(where, ": the model has --multi-latent-attention; writing it as a Hugging Face "
                         "DeepSeek model is not supported yet");
  if (!m.noop_layers.empty())
    return Unimplemented(where, ": the model has --noop-layers ", m.noop_layers_flag,
                         " (identity layers), which no Hugging Face architecture Gale writes can hold");
  if (m.qk_layernorm && (moe.enabled() || !llama || m.add_qkv_bias))
    return Unimplemented(where, ": the model has --qk-layernorm, which is written as Qwen3ForCausalLM only when it is "
                         "LLaMA-shaped (RMSNorm, SwiGLU, rope with --rotary-percent 1, --disable-bias-linear, no "
                         "--add-qkv-bias) without experts");
  if (moe.enabled()) {
    const bool every_layer = std::all_of(moe.layer_pattern.begin(), moe.layer_pattern.end(), [](int f) { return f == 1; });
    // Mixtral's and Qwen2-MoE's gates are the softmax top-k: no sigmoid scores, expert bias, scaling or groups.
    if (moe.moe_router_score_function != "softmax" || moe.moe_router_enable_expert_bias ||
        !unset(moe.moe_router_topk_scaling_factor) || moe.moe_router_group_topk != kUnset)
      return Unimplemented(where, ": a mixture-of-experts model is written as MixtralForCausalLM or Qwen2MoeForCausalLM "
                           "only with softmax routing (found --moe-router-score-function ", moe.moe_router_score_function,
                           ", expert bias ", moe.moe_router_enable_expert_bias ? "on" : "off",
                           ", top-k scaling factor ", unset(moe.moe_router_topk_scaling_factor) ? "unset" : "set",
                           ", group-limited routing ", moe.moe_router_group_topk != kUnset ? "on" : "off", ")");
    const bool shared = moe.moe_shared_expert_intermediate_size != kUnset;
    if (shared) {  // Qwen2-MoE: q/k/v biases, a gated shared expert, any layer pattern, either routing
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
  } else if (gpt2) out.arch = HfArchitecture::kGpt2;
  else if (llama) out.arch = m.qk_layernorm   ? HfArchitecture::kQwen3
                             : m.add_qkv_bias ? HfArchitecture::kQwen2
                                              : HfArchitecture::kLlama;
  else
    return Unimplemented(where, ": no Hugging Face architecture Gale writes matches this model (normalization ",
                         m.normalization, ", swiglu ", m.swiglu ? "on" : "off", ", position embedding ",
                         m.position_embedding_type, ", linear biases ", m.add_bias_linear ? "on" : "off",
                         "); supported: GPT2LMHeadModel (LayerNorm, GeLU, learned_absolute, biases, tied, MHA) and "
                         "LlamaForCausalLM / Qwen2ForCausalLM (RMSNorm, SwiGLU, rope with --rotary-percent 1, "
                         "--disable-bias-linear)");
  if (vocab_size <= 0 || vocab_size > m.padded_vocab_size)
    return InvalidArgument("--vocab-size ", vocab_size, ": expected 1 to the checkpoint's padded vocabulary ",
                           m.padded_vocab_size);
  return out;
}

nlohmann::json hf_config_json(const HfModel& hf, const std::string& torch_dtype) {
  const ModelArgs& m = hf.model;
  nlohmann::json j;
  j["architectures"] = {hf_architecture_name(hf.arch)};
  if (hf.arch == HfArchitecture::kGpt2) {
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
  } else {
    j["model_type"] = hf.arch == HfArchitecture::kQwen2      ? "qwen2"
                      : hf.arch == HfArchitecture::kMixtral  ? "mixtral"
                      : hf.arch == HfArchitecture::kQwen2Moe ? "qwen2_moe"
                      : hf.arch == HfArchitecture::kQwen3    ? "qwen3"
                                                             : "llama";
    j["hidden_size"] = m.hidden_size;
    j["num_hidden_layers"] = m.num_layers;
    j["num_attention_heads"] = m.num_attention_heads;
    j["num_key_value_heads"] = m.num_kv_heads;
    j["head_dim"] = m.kv_channels;
    j["intermediate_size"] = m.ffn_hidden_size;
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = m.max_position_embeddings;
    j["rms_norm_eps"] = m.norm_epsilon;
    j["rope_theta"] = static_cast<double>(m.rotary_base);
    if (m.use_rope_scaling)
      j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", m.rope_scaling_factor}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    else
      j["rope_scaling"] = nullptr;
    j["attention_dropout"] = 0.0;
    j["tie_word_embeddings"] = !m.untie_embeddings_and_output_weights;
    if (hf.arch == HfArchitecture::kMixtral) {
      j["sliding_window"] = nullptr;
      j["num_local_experts"] = hf.moe.num_experts;
      j["num_experts_per_tok"] = hf.moe.moe_router_topk;
      j["router_jitter_noise"] = 0.0;
      j["output_router_logits"] = false;
    } else if (hf.arch == HfArchitecture::kQwen2 || hf.arch == HfArchitecture::kQwen2Moe ||
               hf.arch == HfArchitecture::kQwen3) {
      if (hf.arch == HfArchitecture::kQwen3) j["attention_bias"] = false;
      j["use_sliding_window"] = false;
      j["sliding_window"] = m.max_position_embeddings;
      j["max_window_layers"] = m.num_layers;
      if (hf.arch == HfArchitecture::kQwen2Moe) add_qwen2_moe_config(hf.moe, m.num_layers, &j);
    } else {
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
    }
  }
  j["vocab_size"] = hf.vocab_size;
  j["torch_dtype"] = torch_dtype;
  return j;
}

}  // namespace gale
