// The MoE shared expert: finite-difference gradients (GeLU, SwiGLU, with and without the gate), its
// output against a float64 loop, and a whole GPT model whose MoE layers carry one (with and without
// --moe-shared-expert-overlap).
#include "model/moe_shared_expert.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/gpt_model.h"
#include "model/linear.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

using testing::directional_derivative;
using testing::dot;
using testing::random_vector;
using testing::rel_diff;

ModelConfig shared_config(int64_t H, int64_t Fs, bool swiglu, bool gate) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = H;
  c.ffn = 4;
  c.swiglu = swiglu;
  c.add_bias_linear = false;
  c.init_std = 0.5f;
  c.moe.num_experts = 2;
  c.moe.ffn = 4;
  c.moe.shared_ffn = Fs;
  c.moe.shared_gate = gate;
  return c;
}

// One shared expert with random parameters and a fixed projection R of its output: L = Σ R ⊙ out.
struct SharedFixture {
  ModelConfig c;
  ModelPartition part;
  OpTable ops = reference_ops();
  ParamBuffer pb;
  SharedExpertIds w;
  Tensor x;
  std::vector<float> r;

  SharedFixture(const ModelConfig& config, int64_t T, uint64_t seed) : c(config), part(single_process_partition(c)) {
    w = register_shared_expert_params(pb, c, part, 0);
    pb.finalize();
    pb.initialize(seed);
    x = Tensor::empty({T, c.hidden});
    testing::fill_random(x.data<float>(), x.numel(), seed + 1000);
    r = random_vector(T * c.hidden, seed + 2000);
  }

  Tensor forward(SharedExpertSaved* saved) { return shared_expert_forward(c, ops, pb, w, part, x, saved); }
  double loss() {
    const Tensor y = forward(nullptr);
    return dot(y.data<float>(), r.data(), y.numel());
  }

  void expect_gradients_match_finite_differences() {
    pb.zero_grads();
    SharedExpertSaved saved;
    forward(&saved);
    const Tensor dy = Tensor::from_blob(r.data(), x.shape(), DType::kF32);
    const Tensor dx = shared_expert_backward(c, ops, pb, w, part, saved, dy);
    const std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
    auto l = [&] { return loss(); };
    for (int id = 0; id < pb.size(); ++id) {
      const int64_t n = pb.spec(id).local_numel();
      const auto dir = random_vector(n, 300 + id);
      const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
      const double numeric = directional_derivative(l, pb.param_data(id), dir.data(), n, 1e-3);
      EXPECT_GT(std::abs(analytic), 1e-3) << pb.spec(id).name << ": no gradient";
      EXPECT_LT(rel_diff(analytic, numeric, 2e-3), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
    }
    const auto dir = random_vector(x.numel(), 999);
    const double analytic = dot(dx.data<float>(), dir.data(), x.numel());
    const double numeric = directional_derivative(l, x.data<float>(), dir.data(), x.numel(), 1e-3);
    EXPECT_LT(rel_diff(analytic, numeric, 2e-3), 1e-2) << "input: " << analytic << " vs " << numeric;
  }
};

TEST(MoeSharedExpert, GradientsMatchFiniteDifferencesGelu) {
  SharedFixture f(shared_config(8, 6, /*swiglu=*/false, /*gate=*/false), 9, 31);
  EXPECT_EQ(f.w.gate_w, -1);
  f.expect_gradients_match_finite_differences();
}

TEST(MoeSharedExpert, GradientsMatchFiniteDifferencesSwigluWithGate) {
  SharedFixture f(shared_config(5, 3, /*swiglu=*/true, /*gate=*/true), 7, 32);
  ASSERT_GE(f.w.gate_w, 0);
  f.expect_gradients_match_finite_differences();
}

TEST(MoeSharedExpert, GradientsMatchFiniteDifferencesGeluWithGate) {
  SharedFixture f(shared_config(6, 4, /*swiglu=*/false, /*gate=*/true), 8, 33);
  f.expect_gradients_match_finite_differences();
}

// --bf16: the GEMMs take the bf16 weight copy and bf16 inputs (the gate stays f32); output and
// every gradient stay within bf16 rounding of the f32 run, and differ from it (the bf16 path ran).
TEST(MoeSharedExpert, Bf16IsCloseToF32) {
  auto run = [](bool bf16, std::vector<float>* out) {
    ModelConfig c = shared_config(16, 24, /*swiglu=*/true, /*gate=*/true);
    c.bf16 = bf16;
    SharedFixture f(c, 10, 35);
    if (bf16) {
      f.pb.enable_gemm_copy(DType::kBF16);
      f.pb.refresh_gemm_copy();
    }
    f.pb.zero_grads();
    SharedExpertSaved saved;
    const Tensor x = to_gemm_input(f.x, c.gemm_dtype());
    const Tensor y = shared_expert_forward(f.c, f.ops, f.pb, f.w, f.part, x, &saved);
    out->assign(y.data<float>(), y.data<float>() + y.numel());
    const Tensor dy = Tensor::from_blob(f.r.data(), f.x.shape(), DType::kF32);
    const Tensor dx = shared_expert_backward(f.c, f.ops, f.pb, f.w, f.part, saved, dy);
    out->insert(out->end(), dx.data<float>(), dx.data<float>() + dx.numel());
    out->insert(out->end(), f.pb.flat_grads().data<float>(), f.pb.flat_grads().data<float>() + f.pb.numel());
  };
  std::vector<float> a, b;
  run(false, &a);
  run(true, &b);
  ASSERT_EQ(a.size(), b.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (b[i] - a[i]) * (b[i] - a[i]);
    norm += a[i] * a[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), 2e-2);
  EXPECT_GT(std::sqrt(diff / norm), 0.0);
}

// out_t = sigmoid(x_t·g) · W2·(silu(W1g·x_t) ⊙ W1u·x_t), written out in float64.
TEST(MoeSharedExpert, OutputMatchesAFloat64Loop) {
  SharedFixture f(shared_config(5, 3, /*swiglu=*/true, /*gate=*/true), 6, 34);
  const Tensor y = f.forward(nullptr);
  const int64_t H = 5, Fs = 3;
  const float* w1 = f.pb.param_data(f.w.fc1_w);  // [2Fs, H]: gate rows, then up rows
  const float* w2 = f.pb.param_data(f.w.fc2_w);  // [H, Fs]
  const float* g = f.pb.param_data(f.w.gate_w);  // [1, H]
  for (int64_t t = 0; t < 6; ++t) {
    const float* x = f.x.data<float>() + t * H;
    std::vector<double> act(Fs);
    for (int64_t i = 0; i < Fs; ++i) {
      double a = 0.0, b = 0.0;
      for (int64_t h = 0; h < H; ++h) {
        a += static_cast<double>(w1[i * H + h]) * x[h];
        b += static_cast<double>(w1[(Fs + i) * H + h]) * x[h];
      }
      act[i] = a / (1.0 + std::exp(-a)) * b;
    }
    double logit = 0.0;
    for (int64_t h = 0; h < H; ++h) logit += static_cast<double>(g[h]) * x[h];
    const double gate = 1.0 / (1.0 + std::exp(-logit));
    for (int64_t h = 0; h < H; ++h) {
      double m = 0.0;
      for (int64_t i = 0; i < Fs; ++i) m += static_cast<double>(w2[h * Fs + i]) * act[i];
      EXPECT_NEAR(y.data<float>()[t * H + h], gate * m, 1e-5) << "token " << t << " dim " << h;
    }
  }
}

// Qwen2-MoE-like: LLaMA architecture, MoE layers 0 and 2 with a gated shared expert.
ModelConfig model_config() {
  ModelConfig c = testing::tiny_moe_config();
  c.moe.shared_ffn = 10;
  c.moe.shared_gate = true;
  return c;
}

TEST(MoeSharedExpertModel, MegatronNamesAndShapes) {
  const ModelConfig c = model_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  EXPECT_EQ(pb.spec(pb.find("decoder.layers.0.mlp.shared_experts.linear_fc1.weight")).global_shape, (Shape{20, 8}));
  EXPECT_EQ(pb.spec(pb.find("decoder.layers.2.mlp.shared_experts.linear_fc2.weight")).global_shape, (Shape{8, 10}));
  EXPECT_EQ(pb.spec(pb.find("decoder.layers.2.mlp.shared_experts.gate_weight")).global_shape, (Shape{1, 8}));
  EXPECT_EQ(pb.find("decoder.layers.1.mlp.shared_experts.linear_fc1.weight"), -1);  // the dense layer
}

// Whole model: every parameter (the shared experts' included) against finite differences.
TEST(MoeSharedExpertModel, EveryParameterMatchesFiniteDifferences) {
  const ModelConfig c = model_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(7);
  const MicroBatch mb = testing::full_batch(c, 2, 41);
  auto objective = [&](bool backward) {
    if (backward) model.params().zero_grads();
    GPTModel::LossSums sums;
    model.forward(0, mb, Tensor(), true, &sums);
    model.backward(0, Tensor(), backward ? static_cast<float>(1.0 / sums.tokens) : 0.0f);
    const MoeAuxLosses aux = model.take_moe_losses();
    return sums.loss_sum / sums.tokens + c.moe.aux_loss_coeff * aux.load_balancing;
  };
  objective(true);
  ParamBuffer& pb = model.params();
  const std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  for (int id = 0; id < pb.size(); ++id) {
    const int64_t n = pb.spec(id).local_numel();
    const auto dir = random_vector(n, 600 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative([&] { return objective(false); }, pb.param_data(id), dir.data(), n, 1e-3);
    EXPECT_LT(rel_diff(analytic, numeric, 2e-3), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
  }
}

// --moe-shared-expert-overlap runs the shared expert inside the dispatch (forward) and the
// gradients' dispatch (backward) and adds its output at the same place: the same loss and the same
// gradients, bit for bit.
TEST(MoeSharedExpertModel, OverlapGivesTheSameLossAndGradients) {
  OpTable ops = reference_ops();
  auto run = [&](bool overlap, double* loss) {
    ModelConfig c = model_config();
    c.moe.shared_overlap = overlap;
    GPTModel model(c, single_process_partition(c), &ops);
    model.params().initialize(8);
    const MicroBatch mb = testing::full_batch(c, 2, 42);
    GPTModel::LossSums sums;
    model.forward(0, mb, Tensor(), true, &sums);
    model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
    *loss = sums.loss_sum;
    const float* g = model.params().flat_grads().data<float>();
    return std::vector<float>(g, g + model.params().numel());
  };
  double a = 0.0, b = 0.0;
  const std::vector<float> plain = run(false, &a), overlapped = run(true, &b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(plain, overlapped);
}

}  // namespace
}  // namespace gale
