// Offline DPO (train/dpo.h) against the independent float64 PyTorch reference
// (tools/reference/dpo_reference.py, tests/data/golden/dpo_llama/): on the llama golden model with
// a perturbed frozen reference model, one micro-batch of two preference pairs gives the reference's
// loss, rewards accuracy and every policy gradient (sigmoid with label smoothing and --pref-ftx;
// plain sigmoid, hinge and ipo through loss and gradient norm); the reference model is never
// changed; with the reference equal to the policy the sigmoid loss is log 2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "golden/dpo_golden_run.h"

namespace gale {
namespace {

using golden::GoldenFixture;

// The llama golden model and its DPO fixture.
struct DpoRun : golden::DpoGoldenRun {
  DpoRun() : DpoGoldenRun("llama", "dpo_llama") {}
};

std::map<std::string, Tensor> read_all(const std::string& file, DType dtype = DType::kF32) {
  return golden::read_all_tensors(golden::golden_dir() + "/dpo_llama/" + file, dtype);
}

double grad_norm(const ParamBuffer& pb) {
  double s = 0.0;
  for (int id = 0; id < pb.size(); ++id) {
    const Tensor g = pb.grad(id);
    for (int64_t i = 0; i < g.numel(); ++i) s += static_cast<double>(g.data<float>()[i]) * g.data<float>()[i];
  }
  return std::sqrt(s);
}

TEST(DpoGolden, LossAccuracyAndPolicyGradientsMatchTheReference) {
  DpoRun s;
  ParamBuffer& pb = s.policy->params();
  const std::vector<float> reference_before(s.reference->params().flat_params().data<float>(),
                                            s.reference->params().flat_params().data<float>() +
                                                s.reference->params().numel());
  const auto grads = read_all("grads.safetensors");
  bool first = true;
  for (const nlohmann::json& c : s.fixture["configs"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    pb.zero_grads();
    const DpoMicroBatchStats st = dpo_forward_backward(*s.policy, *s.reference, s.mb, 0, 1, DpoRun::options(c));
    const double loss = c["loss"].get<double>();
    EXPECT_NEAR(st.loss, loss, 2e-6 * std::abs(loss));
    EXPECT_DOUBLE_EQ(st.accuracy, c["accuracy"].get<double>());
    const double norm = c["grad_norm"].get<double>();
    EXPECT_NEAR(grad_norm(pb), norm, 1e-4 * norm);
    if (first) {
      int checked = 0;
      for (int id = 0; id < pb.size(); ++id) {
        const std::string& name = pb.spec(id).name;
        ASSERT_TRUE(grads.count(name)) << name;
        Status cmp = golden::compare_tensors(pb.grad(id), grads.at(name), 2e-3, 1e-7, name);
        EXPECT_TRUE(cmp.ok()) << cmp.message();
        ++checked;
      }
      EXPECT_EQ(checked, static_cast<int>(grads.size()));
      first = false;
    }
  }
  // The reference model is frozen: its parameters are untouched and it accumulated no gradient.
  const ParamBuffer& rb = s.reference->params();
  EXPECT_EQ(std::memcmp(reference_before.data(), rb.flat_params().data<float>(), reference_before.size() * 4), 0);
  double ref_grad = 0.0;
  for (int id = 0; id < rb.size(); ++id)
    for (int64_t i = 0; i < rb.grad(id).numel(); ++i) ref_grad += std::abs(rb.grad(id).data<float>()[i]);
  EXPECT_EQ(ref_grad, 0.0);
}

// The objective is the mean over the iteration's micro-batches: the same micro-batch run as both
// of two micro-batches accumulates exactly the gradient of one.
TEST(DpoGolden, MicroBatchesAverage) {
  DpoRun s;
  ParamBuffer& pb = s.policy->params();
  const DpoOptions o = DpoRun::options(s.fixture["configs"][0]);
  pb.zero_grads();
  dpo_forward_backward(*s.policy, *s.reference, s.mb, 0, 1, o);
  const double one = grad_norm(pb);
  pb.zero_grads();
  dpo_forward_backward(*s.policy, *s.reference, s.mb, 0, 2, o);
  dpo_forward_backward(*s.policy, *s.reference, s.mb, 1, 2, o);
  EXPECT_NEAR(grad_norm(pb), one, 1e-5 * one);
}

// At the first step with the reference equal to the policy every log-ratio is 0: the sigmoid loss
// is log 2, no pair is "accurate", and the gradient is β/2 times that of (πc − πr).
TEST(DpoGolden, ReferenceEqualToThePolicyGivesLogTwo) {
  DpoRun s;
  DpoRun::load(*s.reference, s.f.initial_weights());
  DpoOptions o;  // sigmoid, β 0.1, no smoothing
  s.policy->params().zero_grads();
  const DpoMicroBatchStats st = dpo_forward_backward(*s.policy, *s.reference, s.mb, 0, 1, o);
  EXPECT_NEAR(st.loss, std::log(2.0), 1e-7);
  EXPECT_EQ(st.accuracy, 0.0);
  EXPECT_GT(grad_norm(s.policy->params()), 0.0);
}

TEST(DpoPairLoss, FormulasAndDerivatives) {
  DpoPairInput in{-10.0, -12.0, -11.0, -11.5, 4.0, 5.0};
  for (const char* type : {"sigmoid", "hinge", "ipo"}) {
    SCOPED_TRACE(type);
    DpoOptions o;
    o.loss_type = type;
    o.beta = 0.3;
    o.label_smoothing = std::string(type) == "sigmoid" ? 0.2 : 0.0;
    o.pref_ftx = 0.1;
    const DpoPairLoss l = dpo_pair_loss(in, o);
    // Central differences of the loss in the policy's log-probabilities.
    const double h = 1e-5;
    DpoPairInput a = in, b = in;
    a.policy_chosen += h;
    b.policy_chosen -= h;
    EXPECT_NEAR(l.d_policy_chosen, (dpo_pair_loss(a, o).loss - dpo_pair_loss(b, o).loss) / (2 * h), 1e-7);
    a = in;
    b = in;
    a.policy_rejected += h;
    b.policy_rejected -= h;
    EXPECT_NEAR(l.d_policy_rejected, (dpo_pair_loss(a, o).loss - dpo_pair_loss(b, o).loss) / (2 * h), 1e-7);
  }
  DpoOptions o;
  o.beta = 0.5;
  const DpoPairLoss l = dpo_pair_loss(in, o);
  // x = (−10 + 12) − (−11 + 11.5) = 1.5: −logσ(0.75); rewards β(πc − refc) = 0.5, β(πr − refr) = −0.25.
  EXPECT_NEAR(l.loss, std::log1p(std::exp(-0.75)), 1e-12);
  EXPECT_NEAR(l.chosen_reward, 0.5, 1e-12);
  EXPECT_NEAR(l.rejected_reward, -0.25, 1e-12);
}

}  // namespace
}  // namespace gale
