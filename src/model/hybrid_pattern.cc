// Megatron main's unified hybrid layer pattern: '|' pipeline segments and '/' MTP depths, parsed and checked.
#include "model/hybrid_pattern.h"

#include "model/hybrid_layers.h"

namespace gale {

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts(1);
  for (char c : text) {
    if (c == sep)
      parts.emplace_back();
    else
      parts.back() += c;
  }
  return parts;
}

// Megatron's _validate_pattern: every symbol a layer symbol ('|' too in the main pattern), and no
// attention ('*') beside multi-latent or DeepSeek sparse attention ('+', 'D').
Status validate(const std::string& pattern, const char* which, bool allow_pipe, const std::string& flag,
                const std::string& text) {
  for (char c : pattern)
    if (!is_hybrid_layer_symbol(c) && !(allow_pipe && c == kHybridPipe))
      return InvalidArgument(flag, " '", text, "': in the ", which, " pattern, '", std::string(1, c),
                             "' is not a valid layer symbol: expected one of M (Mamba), G (Gated DeltaNet), "
                             "* (attention), + (multi-latent attention), D (DeepSeek sparse attention), - (MLP), "
                             "E (MoE)",
                             allow_pipe ? ", or '|' between pipeline stages" : " ('|' only in the main pattern)");
  const bool attention = pattern.find(kHybridAttention) != std::string::npos;
  const bool latent = pattern.find(kHybridMla) != std::string::npos || pattern.find(kHybridDsa) != std::string::npos;
  if (attention && latent)
    return InvalidArgument(flag, " '", text, "': the ", which, " pattern '", pattern,
                           "' mixes attention ('*') with multi-latent or DeepSeek sparse attention ('+', 'D'): "
                           "Megatron does not support both in one model");
  return Status::Ok();
}

}  // namespace

bool has_hybrid_separators(const std::string& text) {
  return text.find(kHybridPipe) != std::string::npos || text.find(kHybridMtpSeparator) != std::string::npos;
}

bool has_hybrid_pipes(const std::string& text) {
  return text.substr(0, text.find(kHybridMtpSeparator)).find(kHybridPipe) != std::string::npos;
}

std::string hybrid_pattern_layers(const std::string& text) {
  std::string layers;
  for (char c : text) {
    if (c == kHybridMtpSeparator) break;
    if (c != kHybridPipe) layers += c;
  }
  return layers;
}

StatusOr<HybridLayerPattern> parse_hybrid_layer_pattern(const std::string& text, const std::string& flag) {
  const std::vector<std::string> parts = split(text, kHybridMtpSeparator);
  HybridLayerPattern p;
  p.main = parts.front();
  GALE_RETURN_IF_ERROR(validate(p.main, "main", true, flag, text));
  p.stages = split(p.main, kHybridPipe);
  p.layers = hybrid_pattern_layers(p.main);
  bool any_mtp = false;
  for (size_t i = 1; i < parts.size(); ++i) any_mtp = any_mtp || !parts[i].empty();
  if (!any_mtp) return p;  // "M*M*", "M*M*/", "M*M*//": no MTP
  const std::string& first = parts[1];
  for (size_t i = 2; i < parts.size(); ++i)
    if (parts[i] != first)
      return InvalidArgument(flag, " '", text, "': all MTP patterns (after each '/') must be identical, found '", first,
                             "' as MTP pattern 1 and '", parts[i], "' as MTP pattern ", i);
  GALE_RETURN_IF_ERROR(validate(first, "MTP", false, flag, text));
  p.mtp = first;
  p.mtp_depths = static_cast<int64_t>(parts.size()) - 1;
  return p;
}

int64_t hybrid_pattern_mtp_depths(const std::string& text) {
  if (text.find(kHybridMtpSeparator) == std::string::npos) return 0;
  StatusOr<HybridLayerPattern> p = parse_hybrid_layer_pattern(text, "");
  return p.ok() ? p->mtp_depths : 0;
}

std::string hybrid_pattern_mtp_layers(const std::string& text) {
  if (text.find(kHybridMtpSeparator) == std::string::npos) return "";
  StatusOr<HybridLayerPattern> p = parse_hybrid_layer_pattern(text, "");
  std::string all;
  if (p.ok())
    for (int64_t k = 0; k < p->mtp_depths; ++k) all += p->mtp;
  return all;
}

StatusOr<std::vector<std::vector<int64_t>>> hybrid_pattern_stage_layers(const HybridLayerPattern& pattern, int64_t pp,
                                                                        const std::string& flag) {
  const int64_t segments = static_cast<int64_t>(pattern.stages.size());
  if (pp < 1 || segments % pp != 0)
    return InvalidArgument(flag, " '", pattern.main, "': the number of pipe-delimited segments (", segments,
                           ") must be evenly divisible by --pipeline-model-parallel-size (", pp, ")");
  const int64_t vpp = segments / pp;
  std::vector<std::vector<int64_t>> layers(static_cast<size_t>(pp), std::vector<int64_t>(static_cast<size_t>(vpp)));
  for (int64_t k = 0; k < segments; ++k)
    layers[static_cast<size_t>(k % pp)][static_cast<size_t>(k / pp)] =
        static_cast<int64_t>(pattern.stages[static_cast<size_t>(k)].size());
  return layers;
}

}  // namespace gale
