// GRPO's advantages, per-token loss, its derivative and the micro-batch reduction (train/grpo_loss.h).
#include "train/grpo_loss.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace gale {

std::vector<double> grpo_advantages(const std::vector<std::vector<double>>& rewards) {
  std::vector<double> out;
  if (rewards.empty()) return out;
  const size_t G = rewards.front().size();
  GALE_CHECK(G > 0) << "a GRPO group holds at least one completion";
  for (const std::vector<double>& group : rewards) {
    GALE_CHECK_EQ(group.size(), G) << "every GRPO group holds --grpo-group-size completions";
    double mean = 0.0;
    for (double r : group) mean += r;
    mean /= static_cast<double>(G);
    double var = 0.0;
    for (double r : group) var += (r - mean) * (r - mean);
    const double std_dev = std::sqrt(var / static_cast<double>(G));
    for (double r : group) out.push_back((r - mean) / (1e-4 + std_dev));
  }
  return out;
}

GrpoTokenLoss grpo_token_loss(double current, double old, double ref, double advantage, const GrpoLossOptions& o,
                              const double* inference) {
  GrpoTokenLoss t;
  if (inference != nullptr) {  // Megatron: is_weights = exp(old − inference), then min(·, coef)
    t.is_weight = std::exp(old - *inference);
    if (o.is_truncation_coef > 0.0) t.is_weight = std::min(t.is_weight, o.is_truncation_coef);
  }
  const double lo = 1.0 - o.clamp_eps_lower, hi = 1.0 + o.clamp_eps_upper;
  t.ratio = std::exp(current - old);
  const double clamped = std::clamp(t.ratio, lo, hi);
  t.truncated_from_above = t.ratio > hi;
  t.truncated_from_below = t.ratio < lo;
  const double unclamped_term = t.ratio * advantage, clamped_term = clamped * advantage;
  const double ref_diff = ref - current;
  t.kl_term = std::exp(ref_diff) - ref_diff - 1.0;
  t.entropy_term = -std::exp(current) * current;
  t.loss = -t.is_weight * std::min(unclamped_term, clamped_term) + o.kl_beta * t.kl_term - o.entropy_weight * t.entropy_term;
  // d min / d ratio: the smaller operand's derivative (half each on a tie); the clamped operand's
  // is A inside [lo, hi] (bounds included) and 0 outside.
  const double d_unclamped = advantage;
  const double d_clamped = (t.ratio >= lo && t.ratio <= hi) ? advantage : 0.0;
  double d_min_d_ratio;
  if (unclamped_term < clamped_term) d_min_d_ratio = d_unclamped;
  else if (clamped_term < unclamped_term) d_min_d_ratio = d_clamped;
  else d_min_d_ratio = 0.5 * (d_unclamped + d_clamped);
  t.d_loss_d_current = -t.is_weight * d_min_d_ratio * t.ratio + o.kl_beta * (1.0 - std::exp(ref_diff)) +
                       o.entropy_weight * std::exp(current) * (current + 1.0);
  return t;
}

GrpoMicroBatchLoss grpo_micro_batch_loss(const std::vector<double>& current, const std::vector<double>& old,
                                         const std::vector<double>& ref, const std::vector<double>& advantages,
                                         const std::vector<float>& mask, int64_t B, int64_t S,
                                         int64_t num_microbatches, const GrpoLossOptions& o,
                                         const std::vector<double>& inference) {
  const size_t n = static_cast<size_t>(B * S);
  GALE_CHECK(inference.empty() || inference.size() == n) << "GRPO inference log-probabilities are [B, S]";
  GALE_CHECK(current.size() == n && old.size() == n && ref.size() == n && mask.size() == n)
      << "GRPO micro-batch arrays are [B, S] = [" << B << ", " << S << "]";
  const bool per_token = advantages.size() == n;
  GALE_CHECK(per_token || advantages.size() == static_cast<size_t>(B))
      << "GRPO advantages are [B] or [B, S] = [" << B << ", " << S << "], found " << advantages.size();
  GALE_CHECK(num_microbatches > 0);
  GrpoMicroBatchLoss m;
  m.grad.assign(n, 0.0);
  std::vector<double> d(n, 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      const size_t i = static_cast<size_t>(b * S + s);
      const double w = mask[i];
      if (w == 0.0) continue;
      const GrpoTokenLoss t =
          grpo_token_loss(current[i], old[i], ref[i], advantages[per_token ? i : static_cast<size_t>(b)], o, inference.empty() ? nullptr : &inference[i]);
      m.tokens += w;
      m.loss_sum += w * t.loss;
      m.kl_sum += w * t.kl_term;
      m.ratio_sum += w * t.ratio;
      m.entropy_sum += w * t.entropy_term;
      m.truncated_above_sum += w * (t.truncated_from_above ? 1.0 : 0.0);
      m.truncated_below_sum += w * (t.truncated_from_below ? 1.0 : 0.0);
      d[i] = w * t.d_loss_d_current;
    }
  }
  const double denominator =
      o.per_token_loss ? 1.0 : std::max(m.tokens, 1.0) * static_cast<double>(num_microbatches);
  m.mb_loss = m.loss_sum / denominator;
  for (size_t i = 0; i < n; ++i) m.grad[i] = d[i] / denominator;
  return m;
}

}  // namespace gale
