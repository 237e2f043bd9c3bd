// Gemma-2's config.json keys (query_pre_attn_scalar, soft-caps, sliding window and layer types) <-> Gale's flags.
#include "train/hf_gemma2.h"

#include <cmath>
#include <vector>

namespace gale {

namespace {

Status refuse_key(const nlohmann::json& config, const std::string& path, const char* key, const std::string& why) {
  return Unimplemented(path, ": '", key, "' = ", config.at(key).dump(), " is not supported yet (", why, ")");
}

// A soft-cap: absent -> Gemma2Config's default, null -> none (kUnsetF), else a positive finite number.
Status read_cap(const nlohmann::json& config, const std::string& path, const char* key, double fallback,
                double* out) {
  auto it = config.find(key);
  if (it == config.end()) {
    *out = fallback;
  } else if (it->is_null()) {
    *out = kUnsetF;
  } else if (!it->is_number() || !(it->get<double>() > 0.0) || !std::isfinite(it->get<double>())) {
    return InvalidArgument(path, ": '", key, "' must be null or a number greater than zero, found ", it->dump());
  } else {
    *out = it->get<double>();
  }
  return Status::Ok();
}

// transformers' default layer types: Gemma-2's sliding_attention in the even layers, Gemma-3's in all but
// every P-th (sliding_window_pattern P).
bool default_sliding(int64_t i, int64_t pattern) { return pattern == 0 ? i % 2 == 0 : (i + 1) % pattern != 0; }

bool is_gemma3(const HfModel& m) { return m.arch == HfArchitecture::kGemma3; }

// Gemma-3's RoPE keys: one base for every layer only (rope_local_base_freq = rope_theta), no scaling.
Status read_gemma3_rope(const nlohmann::json& config, const std::string& path, const ModelArgs& m) {
  if (auto it = config.find("rope_scaling"); it != config.end() && !it->is_null())
    return refuse_key(config, path, "rope_scaling", "Gemma-3 scales RoPE in its full-attention layers only; Gale's "
                      "RoPE scaling applies to every layer");
  auto local = config.find("rope_local_base_freq");
  const double base = local == config.end() || local->is_null() ? 10000.0  // Gemma3TextConfig's default
                      : local->is_number()                       ? local->get<double>()
                                                                 : std::nan("");
  if (base != static_cast<double>(m.rotary_base)) {
    if (local == config.end())
      return Unimplemented(path, ": 'rope_local_base_freq' absent (Gemma3TextConfig's default 10000) is not supported "
                           "yet with rope_theta ", m.rotary_base, " (Gale's RoPE has one base for every layer)");
    return refuse_key(config, path, "rope_local_base_freq",
                      str_cat("the sliding layers' RoPE base; Gale's RoPE has one base for every layer: only "
                              "rope_local_base_freq = rope_theta (", m.rotary_base, ") is read"));
  }
  return Status::Ok();
}

}  // namespace

Status read_gemma2_keys(const nlohmann::json& config, const std::string& path, HfModel& out) {
  ModelArgs& m = out.model;
  m.post_norm = true;
  m.qk_layernorm = is_gemma3(out);  // Gemma-3's q_norm / k_norm (1 + w, before RoPE)
  if (is_gemma3(out)) {
    GALE_RETURN_IF_ERROR(read_gemma3_rope(config, path, m));
  } else if (auto it = config.find("rope_scaling"); it != config.end() && !it->is_null()) {
    return refuse_key(config, path, "rope_scaling", "transformers 4.x's Gemma2ForCausalLM ignores rope_scaling and "
                      "5.x applies it: only plain RoPE (rope_scaling null) is read");
  }
  if (auto it = config.find("use_bidirectional_attention"); it != config.end() && !it->is_null() && *it != false)
    return refuse_key(config, path, "use_bidirectional_attention", "Gale's GPT model attends causally");
  auto scalar = config.find("query_pre_attn_scalar");
  if (scalar == config.end()) {
    m.query_pre_attn_scalar = 256;  // Gemma2Config's default
  } else {
    const bool integer = scalar->is_number() && scalar->get<double>() >= 1.0 &&
                         scalar->get<double>() == std::floor(scalar->get<double>()) && scalar->get<double>() < 1e15;
    if (!integer)
      return refuse_key(config, path, "query_pre_attn_scalar", "MindSpeed-LLM's --query-pre-attn-scalar is a "
                        "positive integer");
    m.query_pre_attn_scalar = static_cast<int64_t>(scalar->get<double>());
  }
  // Gemma2Config's defaults 50 / 30; Gemma3TextConfig's none.
  GALE_RETURN_IF_ERROR(read_cap(config, path, "attn_logit_softcapping", is_gemma3(out) ? kUnsetF : 50.0,
                                &m.attn_logit_softcapping));
  GALE_RETURN_IF_ERROR(read_cap(config, path, "final_logit_softcapping", is_gemma3(out) ? kUnsetF : 30.0,
                                &m.output_logit_softcapping));

  const int64_t L = m.num_layers;
  int64_t pattern = 0;  // Gemma-2: the even layers
  if (is_gemma3(out)) {
    pattern = 6;  // Gemma3TextConfig's default
    if (auto it = config.find("sliding_window_pattern"); it != config.end() && !it->is_null()) {
      if (!it->is_number_integer() || it->get<int64_t>() <= 0)
        return InvalidArgument(path, ": 'sliding_window_pattern' must be a positive integer, found ", it->dump());
      pattern = it->get<int64_t>();
    }
  }
  std::vector<int> windowed(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) windowed[static_cast<size_t>(i)] = default_sliding(i, pattern);
  if (auto types = config.find("layer_types"); types != config.end() && !types->is_null()) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != L)
      return InvalidArgument(path, ": 'layer_types' must list ", L, " layer types, found ", types->dump());
    bool differs = false;
    for (int64_t i = 0; i < L; ++i) {
      const nlohmann::json& t = (*types)[static_cast<size_t>(i)];
      if (t != "sliding_attention" && t != "full_attention")
        return InvalidArgument(path, ": 'layer_types' must hold \"sliding_attention\" or \"full_attention\", found ",
                               types->dump());
      windowed[static_cast<size_t>(i)] = t == "sliding_attention";
      differs = differs || windowed[static_cast<size_t>(i)] != static_cast<int>(default_sliding(i, pattern));
    }
    if (differs && !is_gemma3(out))
      out.warnings.push_back(str_cat(path, ": layer_types windows other layers than the even ones 0, 2, ...: read as "
                                     "written (transformers releases before layer_types window the even layers)"));
    if (differs && is_gemma3(out))
      out.warnings.push_back(str_cat(path, ": layer_types differs from sliding_window_pattern ", pattern, ": read as "
                                     "written (transformers releases before layer_types follow sliding_window_pattern)"));
  }
  int64_t window = 4096;  // Gemma2Config's default
  if (auto it = config.find("sliding_window"); it != config.end()) {
    if (it->is_null())
      return refuse_key(config, path, "sliding_window", "Gemma-2's sliding layers need a window: a positive integer "
                        "(at least max_position_embeddings for none)");
    if (!it->is_number_integer() || it->get<int64_t>() <= 0)
      return InvalidArgument(path, ": 'sliding_window' must be a positive integer, found ", it->dump());
    window = it->get<int64_t>();
  }
  int64_t sliding = 0;
  for (int v : windowed) sliding += v;
  if (sliding == 0 || window >= m.max_position_embeddings) return Status::Ok();  // no key is ever hidden
  m.sliding_window = window;
  if (sliding < L) {
    m.window_attn_pattern = windowed;
    m.window_attn_skip_freq = nlohmann::json(windowed).dump();
  }
  return Status::Ok();
}

void add_gemma2_config(const HfModel& hf, nlohmann::json* j) {
  const ModelArgs& m = hf.model;
  (*j)["hidden_act"] = (*j)["hidden_activation"] = m.gelu_tanh ? "gelu_pytorch_tanh" : "gelu";
  (*j)["query_pre_attn_scalar"] = m.query_pre_attn_scalar != kUnset ? m.query_pre_attn_scalar : m.kv_channels;
  (*j)["attn_logit_softcapping"] =
      unset(m.attn_logit_softcapping) ? nlohmann::json() : nlohmann::json(m.attn_logit_softcapping);
  (*j)["final_logit_softcapping"] =
      unset(m.output_logit_softcapping) ? nlohmann::json() : nlohmann::json(m.output_logit_softcapping);
  const bool window = m.sliding_window != kUnset;
  (*j)["sliding_window"] = window ? m.sliding_window : m.max_position_embeddings;
  const int64_t L = m.num_layers, default_pattern = is_gemma3(hf) ? 6 : 0;
  std::vector<int> sliding(static_cast<size_t>(L));
  nlohmann::json types = nlohmann::json::array();
  for (int64_t i = 0; i < L; ++i) {
    sliding[static_cast<size_t>(i)] = !window ? default_sliding(i, default_pattern)
                                      : m.window_attn_pattern.empty()
                                          ? 1
                                          : m.window_attn_pattern[static_cast<size_t>(i)] != 0;
    types.push_back(sliding[static_cast<size_t>(i)] ? "sliding_attention" : "full_attention");
  }
  (*j)["layer_types"] = types;
  if (is_gemma3(hf)) {  // one RoPE base; sliding_window_pattern too when one P gives the layers (older readers)
    (*j)["rope_local_base_freq"] = static_cast<double>(m.rotary_base);
    for (int64_t p = 1; p <= L + 1; ++p) {
      bool fits = true;
      for (int64_t i = 0; i < L; ++i) fits = fits && sliding[static_cast<size_t>(i)] == default_sliding(i, p);
      if (fits) {
        (*j)["sliding_window_pattern"] = p;
        break;
      }
    }
  }
  (*j)["attention_bias"] = false;
  (*j)["cache_implementation"] = "hybrid";
}

}  // namespace gale
