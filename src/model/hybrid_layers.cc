// Megatron's hybrid layer allocation: ratios spread evenly, or an explicit pattern.
#include "model/hybrid_layers.h"

#include <algorithm>
#include <cmath>

#include "model/hybrid_pattern.h"

namespace gale {

bool is_hybrid_layer_symbol(char s) {
  for (char v : {kHybridMamba, kHybridGatedDeltaNet, kHybridAttention, kHybridMla, kHybridDsa, kHybridMlp, kHybridMoe})
    if (s == v) return true;
  return false;
}

namespace {

// Megatron's rule for '*', '+' and 'D', then the refusal of the two Gale does not build.
Status check_unbuilt_symbols(const std::string& pattern) {
  const bool attention = pattern.find(kHybridAttention) != std::string::npos;
  const bool latent = pattern.find(kHybridMla) != std::string::npos || pattern.find(kHybridDsa) != std::string::npos;
  if (attention && latent)
    return InvalidArgument("--hybrid-override-pattern: expected attention layers ('*') or multi-latent / DeepSeek "
                           "sparse attention layers ('+', 'D'), not both in one model, found '", pattern, "'");
  struct Unbuilt {
    char symbol;
    const char* name;
  };
  for (const Unbuilt& u : {Unbuilt{kHybridDsa, "DeepSeek sparse attention"}})
    if (pattern.find(u.symbol) != std::string::npos)
      return Unimplemented("--hybrid-override-pattern: the ", u.name, " layers ('", std::string(1, u.symbol), "') of '",
                           pattern, "': not supported yet (Gale's hybrid stack builds M, G, *, +, - and E layers)");
  return Status::Ok();
}

// Python's round() of a non-negative value: half to even.
int64_t round_half_even(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

std::string allocate_auto(int64_t L, double attention_ratio, double mlp_ratio) {
  std::string t(static_cast<size_t>(L), kHybridMamba);
  const int64_t attention = round_half_even(static_cast<double>(L) * attention_ratio);
  int64_t mamba = L - attention;
  const double section = static_cast<double>(mamba) / static_cast<double>(attention + 1);
  double x = section;
  for (int64_t l = 0; l < L; ++l) {
    if (x < 0.5) {
      t[static_cast<size_t>(l)] = kHybridAttention;
      x += section;
    } else {
      x -= 1.0;
    }
  }
  const int64_t mlp = round_half_even(static_cast<double>(L) * mlp_ratio);
  if (mlp > 0) {
    mamba -= mlp;
    const double per_mlp = static_cast<double>(mamba) / static_cast<double>(mlp);
    x = per_mlp;
    for (int64_t l = 0; l < L; ++l) {
      if (t[static_cast<size_t>(l)] != kHybridMamba) continue;
      if (x < 0.5) {
        t[static_cast<size_t>(l)] = kHybridMlp;
        x += per_mlp;
      } else {
        x -= 1.0;
      }
    }
  }
  return t;
}

bool counts_match(const std::string& a, const std::string& b) {
  for (char s : {kHybridMamba, kHybridGatedDeltaNet, kHybridAttention, kHybridMlp, kHybridMoe})
    if (std::count(a.begin(), a.end(), s) != std::count(b.begin(), b.end(), s)) return false;
  return true;
}

}  // namespace

Status allocate_hybrid_layers(int64_t num_layers, double attention_ratio, double mlp_ratio,
                              const std::string& override_pattern, std::string* layers) {
  // A --hybrid-layer-pattern in the unified format: its decoder layers (stage boundaries and MTP
  // depths apart; model/hybrid_pattern.h).
  const std::string pattern = hybrid_pattern_layers(override_pattern);
  if (num_layers <= 0) return InvalidArgument("--num-layers: expected a positive count for the hybrid model, found ", num_layers);
  if (!(attention_ratio >= 0.0 && attention_ratio <= 1.0))
    return InvalidArgument("--hybrid-attention-ratio: expected a value in [0, 1], found ", attention_ratio);
  if (!(mlp_ratio >= 0.0 && mlp_ratio <= 1.0))
    return InvalidArgument("--hybrid-mlp-ratio: expected a value in [0, 1], found ", mlp_ratio);
  if (attention_ratio + mlp_ratio > 1.0)
    return InvalidArgument("--hybrid-attention-ratio + --hybrid-mlp-ratio: expected at most 1, found ",
                           attention_ratio + mlp_ratio);
  std::string t = allocate_auto(num_layers, attention_ratio, mlp_ratio);
  if (!pattern.empty()) {
    if (static_cast<int64_t>(pattern.size()) != num_layers)
      return InvalidArgument("--hybrid-override-pattern: the pattern has the wrong length: expected ", num_layers,
                             " symbols (--num-layers), found ", pattern.size(), " ('", pattern, "')");
    for (char s : pattern)
      if (!is_hybrid_layer_symbol(s))
        return InvalidArgument("--hybrid-override-pattern: '", std::string(1, s),
                               "' is not a layer symbol: expected one of M (Mamba), G (Gated DeltaNet), * (attention), "
                               "+ (multi-latent attention), D (DeepSeek sparse attention), - (MLP), E (MoE)");
    GALE_RETURN_IF_ERROR(check_unbuilt_symbols(pattern));
    if ((attention_ratio > 0.0 || mlp_ratio > 0.0) && !counts_match(pattern, t))
      return InvalidArgument("--hybrid-override-pattern: the number of each type of layer in the pattern ('",
                             pattern, "') must match the number in the pattern the ratios give ('", t,
                             "')");
    t = pattern;
  }
  *layers = t;
  return Status::Ok();
}

std::vector<int> hybrid_moe_layer_flags(const std::string& layers) {
  std::vector<int> flags;
  for (char s : layers) flags.push_back(s == kHybridMoe ? 1 : 0);
  return flags;
}

std::vector<int> hybrid_gdn_layer_flags(const std::string& layers) {
  std::vector<int> flags;
  for (char s : layers) flags.push_back(s == kHybridGatedDeltaNet ? 1 : 0);
  return flags;
}

Status check_hybrid_moe_layers(const std::string& layers, bool moe_enabled) {
  const bool has_moe = layers.find(kHybridMoe) != std::string::npos;
  if (has_moe && !moe_enabled)
    return InvalidArgument("--hybrid-override-pattern: the MoE layers ('E') of '", layers,
                           "' need --num-experts, found no --num-experts");
  if (!has_moe && moe_enabled)
    return InvalidArgument("--num-experts with --is-hybrid-model: expected MoE layers ('E') in "
                           "--hybrid-override-pattern, found none in '", layers, "'");
  return Status::Ok();
}

Status check_mamba_sizes(int64_t hidden, int64_t state_dim, int64_t head_dim, int64_t num_groups) {
  struct Size {
    const char* flag;
    int64_t value;
  };
  for (const Size& s : {Size{"--mamba-state-dim", state_dim}, Size{"--mamba-head-dim", head_dim},
                        Size{"--mamba-num-groups", num_groups}})
    if (s.value <= 0) return InvalidArgument(s.flag, ": expected a positive integer, found ", s.value);
  const int64_t d_inner = 2 * hidden;
  if (d_inner % head_dim != 0)
    return InvalidArgument("--mamba-head-dim: expected a divisor of the Mamba mixer's d_inner = 2 x --hidden-size = ",
                           d_inner, ", found ", head_dim);
  const int64_t nheads = d_inner / head_dim;
  if (nheads % num_groups != 0)
    return InvalidArgument("--mamba-num-groups: expected a divisor of the Mamba mixer's heads (2 x --hidden-size / "
                           "--mamba-head-dim = ", nheads, "), found ", num_groups);
  return Status::Ok();
}

}  // namespace gale
