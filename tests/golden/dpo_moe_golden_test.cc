// Offline DPO on an MoE model (train/dpo.h) against the independent float64 numpy reference
// (tools/reference/dpo_moe_reference.py, tests/data/golden/dpo_mixtral/): on the mixtral golden
// model (4 experts, top-2) with a perturbed frozen reference model, one micro-batch of two pairs
// gives the reference's loss and accuracy for every loss type, in training and in evaluation; the
// policy's auxiliary losses are the reference's and the reference model has none; the policy
// gradient (DPO loss plus the auxiliary losses with their coefficients) matches central
// differences; the auxiliary losses' gradients are averaged over micro-batches like the loss's.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "golden/dpo_golden_run.h"

namespace gale {
namespace {

using golden::GoldenFixture;

// The mixtral golden model (4 experts, top-2) and its DPO fixture.
struct DpoMoeRun : golden::DpoGoldenRun {
  DpoMoeRun() : DpoGoldenRun("mixtral", "dpo_mixtral") {}

  // What the policy's backward differentiates for one micro-batch (num_microbatches 1): the DPO
  // loss plus the auxiliary losses with their coefficients (the policy's gradients accumulate).
  double objective(const DpoOptions& o) {
    const DpoMicroBatchStats st = dpo_forward_backward(*policy, *reference, mb, 0, 1, o);
    const MoeAuxLosses aux = policy->take_moe_losses();
    return st.loss + args.moe.moe_aux_loss_coeff * aux.load_balancing + args.moe.moe_z_loss_coeff * aux.z;
  }
};

double sum_of(const nlohmann::json& values) {
  double s = 0.0;
  for (const auto& v : values) s += v.get<double>();
  return s;
}

TEST(DpoMoeGolden, LossAccuracyAndAuxiliaryLossesMatchTheReference) {
  DpoMoeRun s;
  ASSERT_GT(s.fixture["min_topk_margin"].get<double>(), 1e-3) << "the routing must not depend on rounding";
  const double lb = sum_of(s.fixture["load_balancing_loss"]), z = sum_of(s.fixture["z_loss"]);
  for (const nlohmann::json& c : s.fixture["configs"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const DpoOptions o = DpoMoeRun::options(c);
    const double loss = c["loss"].get<double>();
    const DpoMicroBatchStats eval = dpo_forward(*s.policy, *s.reference, s.mb, o);
    EXPECT_NEAR(eval.loss, loss, 1e-5 * std::abs(loss));
    EXPECT_DOUBLE_EQ(eval.accuracy, c["accuracy"].get<double>());
    const MoeAuxLosses none = s.policy->take_moe_losses();
    EXPECT_EQ(none.load_balancing, 0.0) << "evaluation collects no auxiliary loss";
    s.policy->params().zero_grads();
    const DpoMicroBatchStats train = dpo_forward_backward(*s.policy, *s.reference, s.mb, 0, 1, o);
    EXPECT_NEAR(train.loss, loss, 1e-5 * std::abs(loss));
    EXPECT_DOUBLE_EQ(train.accuracy, c["accuracy"].get<double>());
    const MoeAuxLosses aux = s.policy->take_moe_losses();
    EXPECT_NEAR(aux.load_balancing, lb, 1e-5 * lb);
    EXPECT_NEAR(aux.z, z, 1e-5 * z);
    const MoeAuxLosses ref = s.reference->take_moe_losses();
    EXPECT_EQ(ref.load_balancing, 0.0) << "the frozen reference model adds no auxiliary loss";
    EXPECT_EQ(ref.z, 0.0);
  }
}

// Central differences of the objective (DPO loss + auxiliary losses) for elements after the last
// routing decision (output layer, last experts) and of a router (the auxiliary losses' path; steps
// small enough that no token changes its experts: the smallest top-k margin is 2e-3).
TEST(DpoMoeGolden, PolicyGradientMatchesCentralDifferences) {
  DpoMoeRun s;
  const DpoOptions o = DpoMoeRun::options(s.fixture["configs"][0]);
  ParamBuffer& pb = s.policy->params();
  pb.zero_grads();
  s.objective(o);
  struct Probe {
    const char* name;
    int64_t index;
    float h;
  };
  const Probe probes[] = {{"output_layer.weight", 5 * 64 + 3, 1e-2f},
                          {"output_layer.weight", 40 * 64 + 17, 1e-2f},
                          {"decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight", 7, 1e-2f},
                          {"decoder.layers.1.mlp.router.weight", 1 * 64 + 9, 5e-4f},
                          {"decoder.layers.1.mlp.router.weight", 3 * 64 + 30, 5e-4f}};
  std::vector<float> analytic;
  for (const Probe& p : probes) analytic.push_back(pb.grad(pb.find(p.name)).data<float>()[p.index]);
  for (size_t i = 0; i < std::size(probes); ++i) {
    const Probe& p = probes[i];
    SCOPED_TRACE(std::string(p.name) + "[" + std::to_string(p.index) + "]");
    float* w = pb.param(pb.find(p.name)).data<float>() + p.index;
    const float w0 = *w;
    *w = w0 + p.h;
    const double plus = s.objective(o);
    *w = w0 - p.h;
    const double minus = s.objective(o);
    *w = w0;
    const double numeric = (plus - minus) / (2.0 * static_cast<double>(p.h));
    EXPECT_GT(std::abs(analytic[i]), 1e-4);
    EXPECT_NEAR(analytic[i], numeric, 3e-2 * std::abs(numeric) + 2e-5);
  }
}

// The objective is the mean over the iteration's micro-batches, auxiliary losses included
// (Megatron's MoEAuxLossAutoScaler: loss scale / micro-batches): the same micro-batch run as both
// of two micro-batches accumulates the gradient of one.
TEST(DpoMoeGolden, MicroBatchesAverageTheAuxiliaryLossesToo) {
  DpoMoeRun s;
  const DpoOptions o = DpoMoeRun::options(s.fixture["configs"][1]);
  ParamBuffer& pb = s.policy->params();
  pb.zero_grads();
  dpo_forward_backward(*s.policy, *s.reference, s.mb, 0, 1, o);
  const int router = pb.find("decoder.layers.0.mlp.router.weight");
  const std::vector<float> one(pb.grad(router).data<float>(), pb.grad(router).data<float>() + pb.grad(router).numel());
  pb.zero_grads();
  dpo_forward_backward(*s.policy, *s.reference, s.mb, 0, 2, o);
  dpo_forward_backward(*s.policy, *s.reference, s.mb, 1, 2, o);
  const float* two = pb.grad(router).data<float>();
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < one.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(two[i] - one[i])));
    norm = std::max(norm, static_cast<double>(std::abs(one[i])));
  }
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(diff, 1e-5 * norm);
  EXPECT_EQ(s.policy->grad_scale(), 1.0f) << "the model's grad scale is restored";
}

}  // namespace
}  // namespace gale
