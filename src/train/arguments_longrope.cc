// LongRoPE (Phi-3 / Phi-3.5; MindSpeed-LLM's --rope-scaling-type longrope and its flags) and its checks.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "train/arguments.h"

namespace gale {
namespace {

// "a,b,c" -> {a, b, c}: every entry a finite number > 0 (it divides a frequency).
StatusOr<std::vector<double>> parse_factor_list(const char* flag, const std::string& text) {
  std::vector<double> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(item.c_str(), &end);
    const bool blank = item.find_first_not_of(" \t") == std::string::npos;
    if (blank || errno != 0 || end == item.c_str() || std::string(end).find_first_not_of(" \t") != std::string::npos)
      return InvalidArgument(flag, ": expected comma-separated numbers, found \"", item, "\" in \"", text, "\"");
    if (!(std::isfinite(v) && v > 0.0))
      return InvalidArgument(flag, ": expected positive factors (each divides a rotary frequency), found ", item);
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

void add_longrope_args(ArgParser& p, ModelArgs& a) {
  p.add_choice("--rope-scaling-type", &a.rope_scaling_type, {"llama3", "yarn", "longrope"},
               "MindSpeed-LLM's RoPE scaling: longrope (Phi-3.5's LongRoPE, model/longrope_rope.h); Llama 3.1's is "
               "--use-rope-scaling and YaRN --position-embedding-type yarn in Gale (unset: none)");
  p.add("--rope-scaling-original-max-position-embeddings", &a.rope_scaling_original_max_position_embeddings,
        "--rope-scaling-type longrope: the context O the model was pretrained at; sequences longer than O use "
        "--long-factor (required with longrope)");
  p.add("--long-factor", &a.long_factor,
        "--rope-scaling-type longrope: comma-separated frequency divisors, one per rotary pair, used past the "
        "original context");
  p.add("--short-factor", &a.short_factor,
        "--rope-scaling-type longrope: comma-separated frequency divisors, one per rotary pair, used within the "
        "original context");
  p.add("--long-mscale", &a.long_mscale,
        "--rope-scaling-type longrope: the cos/sin scale with --long-factor (with --short-mscale; unset: "
        "sqrt(1 + ln(P/O) / ln O) for both, P = --max-position-embeddings)");
  p.add("--short-mscale", &a.short_mscale, "--rope-scaling-type longrope: the cos/sin scale with --short-factor");
  p.add_choice("--longrope-freqs-type", &a.longrope_freqs_type, {"mul", "outer"},
               "--rope-scaling-type longrope: MindSpeed-LLM's two orders of forming the angles (the same float64 "
               "tables in Gale)");
}

Status validate_longrope_args(ModelArgs& m, const ArgParser& p) {
  m.long_factors.clear();
  m.short_factors.clear();
  if (m.rope_scaling_type == "llama3")
    return InvalidArgument("--rope-scaling-type llama3: Gale's Llama 3.1 RoPE scaling is --use-rope-scaling "
                           "(Megatron's flag), found --rope-scaling-type llama3");
  if (m.rope_scaling_type == "yarn")
    return InvalidArgument("--rope-scaling-type yarn: Gale's YaRN is --position-embedding-type yarn (Megatron's "
                           "flag), found --rope-scaling-type yarn");
  const char* const longrope_flags[] = {"--rope-scaling-original-max-position-embeddings", "--long-factor",
                                        "--short-factor", "--long-mscale", "--short-mscale", "--longrope-freqs-type"};
  if (m.rope_scaling_type != "longrope") {
    for (const char* flag : longrope_flags)
      if (p.was_set(flag)) return InvalidArgument(flag, " needs --rope-scaling-type longrope, found it unset");
    return Status::Ok();
  }
  if (m.position_embedding_type != "rope")
    return InvalidArgument("--rope-scaling-type longrope needs --position-embedding-type rope, found ",
                           m.position_embedding_type);
  if (m.multi_latent_attention)
    return InvalidArgument("--rope-scaling-type longrope with --multi-latent-attention: MLA's RoPE scaling is YaRN "
                           "(--rope-type yarn)");
  if (m.use_rope_scaling)
    return InvalidArgument("--rope-scaling-type longrope with --use-rope-scaling: expected one RoPE scaling, found "
                           "LongRoPE and Llama 3.1's");
  if (!unset(m.rotary_seq_len_interpolation_factor))
    return InvalidArgument("--rope-scaling-type longrope with --rotary-seq-len-interpolation-factor: expected one "
                           "RoPE scaling, found LongRoPE and position interpolation");
  if (m.rope_scaling_original_max_position_embeddings == kUnset)
    return InvalidArgument("--rope-scaling-original-max-position-embeddings: expected the original context with "
                           "--rope-scaling-type longrope, found it unset");
  if (m.rope_scaling_original_max_position_embeddings <= 1)
    return InvalidArgument("--rope-scaling-original-max-position-embeddings: expected an integer > 1 (its log "
                           "divides the attention factor), found ", m.rope_scaling_original_max_position_embeddings);
  if (m.long_factor.empty())
    return InvalidArgument("--long-factor: expected one factor per rotary pair with --rope-scaling-type longrope, "
                           "found it unset");
  if (m.short_factor.empty())
    return InvalidArgument("--short-factor: expected one factor per rotary pair with --rope-scaling-type longrope, "
                           "found it unset");
  GALE_ASSIGN_OR_RETURN(m.long_factors, parse_factor_list("--long-factor", m.long_factor));
  GALE_ASSIGN_OR_RETURN(m.short_factors, parse_factor_list("--short-factor", m.short_factor));
  const int64_t head_dim = m.kv_channels != kUnset ? m.kv_channels : m.hidden_size / m.num_attention_heads;
  const int64_t rot_dim = static_cast<int64_t>(static_cast<double>(head_dim) * m.rotary_percent);
  if (rot_dim <= 0 || rot_dim % 2 != 0)
    return InvalidArgument("--rope-scaling-type longrope: expected an even rotary width (head dim x "
                           "--rotary-percent), found ", rot_dim);
  for (const auto& [flag, values] : {std::pair<const char*, const std::vector<double>*>{"--long-factor", &m.long_factors},
                                     {"--short-factor", &m.short_factors}})
    if (static_cast<int64_t>(values->size()) != rot_dim / 2)
      return InvalidArgument(flag, ": expected ", rot_dim / 2, " factors (one per rotary pair: head dim ", head_dim,
                             " x --rotary-percent ", m.rotary_percent, " / 2), found ", values->size());
  if (unset(m.long_mscale) != unset(m.short_mscale))
    return InvalidArgument("--long-mscale and --short-mscale: expected both or neither (MindSpeed-LLM), found only ",
                           unset(m.long_mscale) ? "--short-mscale" : "--long-mscale");
  for (const auto& [flag, value] : {std::pair{"--long-mscale", m.long_mscale}, {"--short-mscale", m.short_mscale}})
    if (!unset(value) && !(std::isfinite(value) && value > 0.0))
      return InvalidArgument(flag, ": expected a positive cos/sin scale, found ", value);
  return Status::Ok();
}

}  // namespace gale
