// Offline DPO: the pair loss and one micro-batch's forward and backward (train/dpo.h).
#include "train/dpo.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

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

namespace {

// The micro-batch's stats from both models' per-sequence sums; with `weight`, each sequence's
// per-token loss gradient −(d objective / d log π)·scale.
DpoMicroBatchStats pair_stats(const GPTModel::LossSums& pol, const GPTModel::LossSums& ref, int64_t B,
                              const DpoOptions& o, double scale, std::vector<float>* weight) {
  GALE_CHECK_EQ(static_cast<int64_t>(pol.sample_loss_sums.size()), B);
  GALE_CHECK_EQ(static_cast<int64_t>(ref.sample_loss_sums.size()), B);
  const int64_t n = B / 2;
  const std::vector<double>& labels = pol.sample_tokens;  // over the whole sequences (context parallelism)
  DpoMicroBatchStats stats;
  if (weight) weight->assign(static_cast<size_t>(B), 0.0f);
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
    if (!weight) continue;
    // log π = −Σ ℓ·mask: the per-token loss gradient is −(d objective / d log π).
    (*weight)[i] = static_cast<float>(-l.d_policy_chosen * scale);
    (*weight)[n + i] = static_cast<float>(-l.d_policy_rejected * scale);
  }
  return stats;
}

}  // namespace

namespace {

// The policy's pair loss of micro-batch `m` from both models' sums; training: scales the policy's
// loss mask by each sequence's per-token loss gradient (the pair mean's 1 / n; the micro-batch
// count is in the grad scale, PolicyGradScale), so its backward starts from scale 1.
DpoMicroBatchStats policy_pair_loss(GPTModel& policy, int64_t m, const GPTModel::LossSums& pol,
                                    const GPTModel::LossSums& ref, const DpoOptions& o, bool training) {
  const int64_t B = static_cast<int64_t>(pol.sample_loss_sums.size());
  GALE_CHECK(B % 2 == 0 && B > 0) << "a DPO micro-batch holds chosen and rejected sequences";
  std::vector<float> weight;
  const DpoMicroBatchStats stats =
      pair_stats(pol, ref, B, o, 1.0 / static_cast<double>(B / 2), training ? &weight : nullptr);
  if (training) policy.scale_loss_mask(m, weight);
  return stats;
}

// While a training pass runs: the loss gradient is known only after the forward (no eager LM-head
// backward), so the chunks' micro-batch count is 0 and the backward scale 1 / num_microbatches
// comes in through the grad scale instead: the MoE auxiliary losses' gradients get it as Megatron's
// MoEAuxLossAutoScaler (loss scale / micro-batches), and the per-token weights leave it out. The
// grad scales are restored at the end of the scope.
class PolicyGradScale {
 public:
  PolicyGradScale(const std::vector<GPTModel*>& chunks, int64_t num_microbatches) : chunks_(chunks) {
    for (GPTModel* c : chunks_) {
      scales_.push_back(c->grad_scale());
      c->set_num_microbatches(0);
      c->set_grad_scale(c->grad_scale() / static_cast<float>(num_microbatches));
    }
  }
  ~PolicyGradScale() {
    for (size_t i = 0; i < chunks_.size(); ++i) chunks_[i]->set_grad_scale(scales_[i]);
  }
  PolicyGradScale(const PolicyGradScale&) = delete;
  PolicyGradScale& operator=(const PolicyGradScale&) = delete;

 private:
  std::vector<GPTModel*> chunks_;
  std::vector<float> scales_;
};

}  // namespace

DpoMicroBatchStats dpo_forward_backward(GPTModel& policy, GPTModel& reference, const MicroBatch& mb, int64_t mb_id,
                                        int64_t num_microbatches, const DpoOptions& o) {
  GALE_CHECK(mb.B % 2 == 0 && mb.B > 0) << "a DPO micro-batch holds chosen and rejected sequences";
  reference.set_num_microbatches(0);
  GPTModel::LossSums ref;
  reference.forward(mb_id, mb, Tensor(), /*training=*/false, &ref);
  const PolicyGradScale scale({&policy}, num_microbatches);
  GPTModel::LossSums pol;
  policy.forward(mb_id, mb, Tensor(), /*training=*/true, &pol);
  const DpoMicroBatchStats stats = policy_pair_loss(policy, mb_id, pol, ref, o, /*training=*/true);
  policy.backward(mb_id, Tensor(), 1.0f);
  return stats;
}

DpoMicroBatchStats dpo_forward(GPTModel& policy, GPTModel& reference, const MicroBatch& mb, const DpoOptions& o) {
  GALE_CHECK(mb.B % 2 == 0 && mb.B > 0) << "a DPO micro-batch holds chosen and rejected sequences";
  GPTModel::LossSums ref, pol;
  reference.forward(0, mb, Tensor(), /*training=*/false, &ref);
  policy.forward(0, mb, Tensor(), /*training=*/false, &pol);
  return policy_pair_loss(policy, 0, pol, ref, o, /*training=*/false);
}

StatusOr<DpoIterationStats> dpo_iteration(const std::vector<GPTModel*>& policy, const std::vector<GPTModel*>& reference,
                                          int64_t num_microbatches, bool forward_only, const DpoOptions& o,
                                          const DpoSchedule& run) {
  GALE_CHECK_EQ(policy.size(), reference.size()) << "the reference model's chunks are the policy's virtual stages";
  // The reference model's pass: each micro-batch's per-sequence sums, where the loss is.
  std::map<int64_t, GPTModel::LossSums> ref;
  auto keep = [&](GPTModel&, int64_t m, const GPTModel::LossSums& sums) {
    ref[m] = sums;
    return 0.0f;
  };
  GALE_RETURN_IF_ERROR(run(reference, /*forward_only=*/true, keep).status());
  // The policy's pass with the pair loss.
  DpoIterationStats stats;
  auto pair_loss = [&](GPTModel& model, int64_t m, const GPTModel::LossSums& pol) {
    auto it = ref.find(m);
    GALE_CHECK(it != ref.end()) << "micro-batch " << m << " has no reference log-probabilities";
    const DpoMicroBatchStats st = policy_pair_loss(model, m, pol, it->second, o, !forward_only);
    ref.erase(it);
    stats.loss_sum += st.loss;
    stats.accuracy_sum += st.accuracy;
    stats.micro_batches += 1.0;
    if (!forward_only) {
      stats.micro_batch_losses.resize(static_cast<size_t>(num_microbatches), 0.0);
      stats.micro_batch_losses[static_cast<size_t>(m)] = st.loss;
    }
    return 1.0f;
  };
  std::optional<PolicyGradScale> scale;
  if (!forward_only) scale.emplace(policy, num_microbatches);
  GALE_RETURN_IF_ERROR(run(policy, forward_only, pair_loss).status());
  return stats;
}

}  // namespace gale
