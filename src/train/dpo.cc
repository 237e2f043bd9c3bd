// Offline DPO: the pair loss and one micro-batch's forward and backward (train/dpo.h).
#include "train/dpo.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace gale {

namespace {

double log_sigmoid(double z) { return z >= 0.0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z)); }
double sigmoid(double z) { return z >= 0.0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z)); }

}  // namespace

DpoPairLoss dpo_pair_loss(const DpoPairInput& in, const DpoOptions& o) {
  const bool average = o.loss_type == "ipo";  // MindSpeed-LLM: ipo (and orpo) use average log-probs
  const double nc = std::max(1.0, in.chosen_labels), nr = std::max(1.0, in.rejected_labels);
  const double sc = average ? 1.0 / nc : 1.0, sr = average ? 1.0 / nr : 1.0;  // d avg / d sum
  const double pc = in.policy_chosen * sc, pr = in.policy_rejected * sr;
  const double rc = in.reference_chosen * sc, rr = in.reference_rejected * sr;
  const double x = (pc - pr) - (rc - rr), b = o.beta;
  DpoPairLoss out;
  double dx = 0.0;  // d loss / d x
  if (o.loss_type == "sigmoid") {
    const double e = o.label_smoothing;
    out.loss = -log_sigmoid(b * x) * (1.0 - e) - log_sigmoid(-b * x) * e;
    dx = -(1.0 - e) * b * sigmoid(-b * x) + e * b * sigmoid(b * x);
  } else if (o.loss_type == "hinge") {
    out.loss = std::max(0.0, 1.0 - b * x);
    dx = 1.0 - b * x > 0.0 ? -b : 0.0;
  } else {
    GALE_CHECK(o.loss_type == "ipo") << "--dpo-loss-type " << o.loss_type;
    const double d = x - 1.0 / (2.0 * b);
    out.loss = d * d;
    dx = 2.0 * d;
  }
  double d_pc = dx, d_pr = -dx;  // with respect to pc, pr (averages with ipo)
  if (o.pref_ftx > 1e-6) {      // the SFT term on the chosen response: −πc / nc
    out.loss += o.pref_ftx * (-pc / nc);
    d_pc += -o.pref_ftx / nc;
  }
  out.d_policy_chosen = d_pc * sc;
  out.d_policy_rejected = d_pr * sr;
  out.chosen_reward = b * (pc - rc);
  out.rejected_reward = b * (pr - rr);
  return out;
}

DpoMicroBatchStats dpo_forward_backward(GPTModel& policy, GPTModel& reference, const MicroBatch& mb, int64_t mb_id,
                                        int64_t num_microbatches, const DpoOptions& o) {
  GALE_CHECK(mb.B % 2 == 0 && mb.B > 0) << "a DPO micro-batch holds chosen and rejected sequences";
  const int64_t n = mb.B / 2;
  reference.set_num_microbatches(0);
  GPTModel::LossSums ref;
  reference.forward(mb_id, mb, Tensor(), /*training=*/false, &ref);
  policy.set_num_microbatches(0);  // the loss gradient is known only after the forward
  GPTModel::LossSums pol;
  policy.forward(mb_id, mb, Tensor(), /*training=*/true, &pol);
  GALE_CHECK_EQ(static_cast<int64_t>(pol.sample_loss_sums.size()), mb.B);
  GALE_CHECK_EQ(static_cast<int64_t>(ref.sample_loss_sums.size()), mb.B);
  const std::vector<double>& labels = pol.sample_tokens;  // over the whole sequences (context parallelism)
  std::vector<float> weight(static_cast<size_t>(mb.B), 0.0f);
  DpoMicroBatchStats stats;
  const double scale = 1.0 / (static_cast<double>(n) * static_cast<double>(num_microbatches));
  for (int64_t i = 0; i < n; ++i) {
    DpoPairInput in;
    in.policy_chosen = -pol.sample_loss_sums[i];
    in.policy_rejected = -pol.sample_loss_sums[n + i];
    in.reference_chosen = -ref.sample_loss_sums[i];
    in.reference_rejected = -ref.sample_loss_sums[n + i];
    in.chosen_labels = labels[i];
    in.rejected_labels = labels[n + i];
    const DpoPairLoss l = dpo_pair_loss(in, o);
    stats.loss += l.loss / static_cast<double>(n);
    stats.accuracy += (l.chosen_reward > l.rejected_reward ? 1.0 : 0.0) / static_cast<double>(n);
    // log π = −Σ ℓ·mask: the per-token loss gradient is −(d objective / d log π).
    weight[i] = static_cast<float>(-l.d_policy_chosen * scale);
    weight[n + i] = static_cast<float>(-l.d_policy_rejected * scale);
  }
  policy.scale_loss_mask(mb_id, weight);
  policy.backward(mb_id, Tensor(), 1.0f);
  return stats;
}

}  // namespace gale
