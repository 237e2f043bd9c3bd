// Parsing and writing Hugging Face config.json for GPT-2, LLaMA, Qwen2, Mistral and Mixtral.
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
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast")
    out.warnings.push_back(c.path() + ": activation_function '" + act +
                           "' is the tanh approximation of GeLU; Gale computes the exact erf GeLU (Megatron's default; "
                           "--openai-gelu is not supported yet), so logits differ slightly from transformers'");
  else if (act != "gelu")
    return refuse(c, "activation_function", "Gale's GPT-2 MLP uses GeLU");
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

Status read_llama_family(const ConfigReader& c, HfModel& out) {
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
  if (c.set("rope_scaling")) return refuse(c, "rope_scaling", "RoPE scaling");
  GALE_ASSIGN_OR_RETURN(bool attention_bias, c.boolean("attention_bias", false));
  if (attention_bias) return refuse(c, "attention_bias", "biases on q/k/v/o; Qwen2's q/k/v-only bias is supported");
  GALE_ASSIGN_OR_RETURN(bool mlp_bias, c.boolean("mlp_bias", false));
  if (mlp_bias) return refuse(c, "mlp_bias", "MLP biases");
  GALE_ASSIGN_OR_RETURN(bool tie, c.boolean("tie_word_embeddings", false));
  const bool mistral_like = out.arch == HfArchitecture::kMistral || out.arch == HfArchitecture::kMixtral;
  if (mistral_like || out.arch == HfArchitecture::kQwen2) {
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
  m.add_qkv_bias = out.arch == HfArchitecture::kQwen2;
  m.untie_embeddings_and_output_weights = !tie;
  if (out.arch == HfArchitecture::kMixtral) GALE_RETURN_IF_ERROR(read_mixtral_experts(c, out));
  return Status::Ok();
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
  else
    return Unimplemented(path, ": architecture '", name,
                         "' is not supported yet (supported: GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, "
                         "MistralForCausalLM, MixtralForCausalLM)");
  GALE_RETURN_IF_ERROR(out.arch == HfArchitecture::kGpt2 ? read_gpt2(c, out) : read_llama_family(c, out));
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
  if (moe.enabled()) {
    const bool every_layer = std::all_of(moe.layer_pattern.begin(), moe.layer_pattern.end(), [](int f) { return f == 1; });
    if (!llama || m.add_qkv_bias || !every_layer || moe.moe_router_pre_softmax)
      return Unimplemented(where, ": a mixture-of-experts model (", moe.num_experts,
                           " experts) is written as MixtralForCausalLM only when it is LLaMA-shaped (RMSNorm, SwiGLU, "
                           "rope, no biases) with experts in every layer (--moe-layer-freq 1, found ",
                           moe.moe_layer_freq, ") and Megatron's default routing (found --moe-router-pre-softmax ",
                           moe.moe_router_pre_softmax ? "on" : "off", ")");
    out.arch = HfArchitecture::kMixtral;
    out.model.ffn_hidden_size = moe.moe_ffn_hidden_size;
  } else if (gpt2) out.arch = HfArchitecture::kGpt2;
  else if (llama) out.arch = m.add_qkv_bias ? HfArchitecture::kQwen2 : HfArchitecture::kLlama;
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
    j["activation_function"] = "gelu";  // exact erf GeLU, what Gale computes
    j["attn_pdrop"] = j["embd_pdrop"] = j["resid_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
    j["tie_word_embeddings"] = true;
  } else {
    j["model_type"] = hf.arch == HfArchitecture::kQwen2 ? "qwen2" : hf.arch == HfArchitecture::kMixtral ? "mixtral" : "llama";
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
    j["rope_scaling"] = nullptr;
    j["attention_dropout"] = 0.0;
    j["tie_word_embeddings"] = !m.untie_embeddings_and_output_weights;
    if (hf.arch == HfArchitecture::kMixtral) {
      j["sliding_window"] = nullptr;
      j["num_local_experts"] = hf.moe.num_experts;
      j["num_experts_per_tok"] = hf.moe.moe_router_topk;
      j["router_jitter_noise"] = 0.0;
      j["output_router_logits"] = false;
    } else if (hf.arch == HfArchitecture::kQwen2) {
      j["use_sliding_window"] = false;
      j["sliding_window"] = m.max_position_embeddings;
      j["max_window_layers"] = m.num_layers;
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
