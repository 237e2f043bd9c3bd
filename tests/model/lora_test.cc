// LoRA (model/lora.h): the adapted linear against its formula and finite differences, a whole
// model with adapters (every adapter gradient by finite differences, frozen base without gradient
// storage or optimizer state, exact start from the base, merge equivalence), and the memory saved.
#include "model/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/allocator.h"
#include "model/gpt_model.h"
#include "model/linear.h"
#include "model/lora_merge_check.h"
#include "optim/optimizer.h"
#include "model_test_batches.h"
#include "testing.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

using testing::directional_derivative;
using testing::dot;
using testing::fill_random;
using testing::random_vector;
using testing::rel_diff;

// ---- the adapted linear on its own ----

struct LinearCase {
  int64_t M = 5, in = 6, out = 7, r = 3;
  float scaling = 2.5f;  // alpha / r
  std::vector<float> x, w, a, b, ga, gb, probe;
  LinearCase() {
    x = random_vector(M * in, 1);
    w = random_vector(out * in, 2);
    a = random_vector(r * in, 3);
    b = random_vector(out * r, 4);
    ga.assign(a.size(), 0.0f);
    gb.assign(b.size(), 0.0f);
    probe = random_vector(M * out, 5);  // loss = Σ probe ⊙ y
  }
  LoraWeights lora() { return LoraWeights{a.data(), b.data(), ga.data(), gb.data(), r, out, in, scaling, sgemm}; }
  Tensor forward(Tensor* u) {
    Tensor xt = Tensor::from_blob(x.data(), {M, in}, DType::kF32);
    LinearWeight lw{w.data(), nullptr, nullptr, nullptr, out, in, sgemm};
    Tensor y = linear_forward(xt, lw);
    *u = lora_forward(xt, lora(), y);
    return y;
  }
  double loss() {
    Tensor u;
    Tensor y = forward(&u);
    return dot(y.data<float>(), probe.data(), M * out);
  }
};

TEST(LoraLinear, ForwardIsBaseplusScaledLowRankProduct) {
  LinearCase c;
  Tensor u;
  Tensor y = c.forward(&u);
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t o = 0; o < c.out; ++o) {
      double expect = 0.0;
      for (int64_t i = 0; i < c.in; ++i) expect += double(c.x[m * c.in + i]) * c.w[o * c.in + i];
      double low = 0.0;
      for (int64_t k = 0; k < c.r; ++k) {
        double xa = 0.0;
        for (int64_t i = 0; i < c.in; ++i) xa += double(c.x[m * c.in + i]) * c.a[k * c.in + i];
        low += xa * c.b[o * c.r + k];
      }
      expect += 2.5 * low;
      EXPECT_NEAR(y.data<float>()[m * c.out + o], expect, 1e-4) << m << "," << o;
    }
}

TEST(LoraLinear, BackwardMatchesFiniteDifferences) {
  LinearCase c;
  Tensor u;
  Tensor y = c.forward(&u);
  Tensor dy = Tensor::from_blob(c.probe.data(), {c.M, c.out}, DType::kF32);
  Tensor xt = Tensor::from_blob(c.x.data(), {c.M, c.in}, DType::kF32);
  Tensor dx = Tensor::zeros({c.M, c.in});
  lora_backward(dy, xt, u, c.lora(), dx);  // dx gets only the adapter's part here
  std::vector<float> dx_full(dx.data<float>(), dx.data<float>() + c.M * c.in);
  for (int64_t m = 0; m < c.M; ++m)  // plus the base's dy·W
    for (int64_t i = 0; i < c.in; ++i)
      for (int64_t o = 0; o < c.out; ++o) dx_full[m * c.in + i] += c.probe[m * c.out + o] * c.w[o * c.in + i];
  auto loss = [&] { return c.loss(); };
  struct Check {
    const char* name;
    std::vector<float>* values;
    const float* grad;
  } checks[] = {{"x", &c.x, dx_full.data()}, {"lora_A", &c.a, c.ga.data()}, {"lora_B", &c.b, c.gb.data()}};
  int seed = 10;
  for (const Check& k : checks) {
    const int64_t n = static_cast<int64_t>(k.values->size());
    auto dir = random_vector(n, seed++);
    const double analytic = dot(k.grad, dir.data(), n);
    const double numeric = directional_derivative(loss, k.values->data(), dir.data(), n, 1e-2);
    EXPECT_LT(rel_diff(analytic, numeric, 1e-3), 2e-3) << k.name << ": " << analytic << " vs " << numeric;
  }
}

TEST(LoraLinear, MergeAddsScaledBA) {
  LinearCase c;
  Tensor u;
  Tensor y = c.forward(&u);
  std::vector<float> merged = c.w;
  lora_merge(merged.data(), c.lora());
  Tensor xt = Tensor::from_blob(c.x.data(), {c.M, c.in}, DType::kF32);
  Tensor y2 = linear_forward(xt, LinearWeight{merged.data(), nullptr, nullptr, nullptr, c.out, c.in, sgemm});
  for (int64_t i = 0; i < c.M * c.out; ++i) EXPECT_NEAR(y2.data<float>()[i], y.data<float>()[i], 1e-5) << i;
}

// ---- a model with adapters ----

ModelConfig base_config(bool llama) {
  ModelConfig c = testing::gradcheck_gpt_config();
  if (llama) {
    use_llama_architecture(c);
    c.heads = 4;
    c.head_dim = 4;
  }
  return c;
}

ModelConfig lora_config(bool llama, bool all_targets = true) {
  ModelConfig c = base_config(llama);
  c.lora.r = 3;
  c.lora.alpha = 6.0;
  c.lora.qkv = c.lora.fc2 = true;
  c.lora.proj = c.lora.fc1 = all_targets;
  return c;
}

MicroBatch make_batch(const ModelConfig& c, int64_t B, uint64_t seed) {
  return testing::tiny_batch(c, B, seed, /*documents=*/false);
}

class LoraModel : public ::testing::TestWithParam<bool> {};

TEST_P(LoraModel, OnlyAdaptersTrainAndTheirGradientsMatchFiniteDifferences) {
  const ModelConfig c = lora_config(GetParam());
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  ParamBuffer& pb = model.params();
  pb.initialize(42);
  testing::randomise_lora_b(pb, 77);
  int64_t adapters = 0, lora_numel = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    const bool is_lora = s.name.find(".lora_") != std::string::npos;
    EXPECT_EQ(s.trainable, is_lora) << s.name;
    if (is_lora) {
      ++adapters;
      lora_numel += s.local_numel();
    }
  }
  EXPECT_EQ(adapters, 2 * 4 * c.num_layers);  // A and B of 4 linears per layer
  EXPECT_EQ(pb.trainable_numel(), lora_numel);
  EXPECT_EQ(pb.flat_grads().numel(), lora_numel);  // no gradient storage for the base
  const std::vector<float> base_before(pb.flat_params().data<float>() + pb.trainable_numel(),
                                       pb.flat_params().data<float>() + pb.numel());
  MicroBatch mb = make_batch(c, 2, 7);
  testing::mean_loss(model, mb, true);
  std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.trainable_numel());
  auto loss = [&] { return testing::mean_loss(model, mb, false); };
  for (int id = 0; id < pb.size(); ++id) {
    if (!pb.spec(id).trainable) continue;
    const int64_t n = pb.spec(id).local_numel();
    auto dir = random_vector(n, 100 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative(loss, pb.param_data(id), dir.data(), n, 1e-3);
    EXPECT_LT(rel_diff(analytic, numeric, 2e-3), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
  }
  // Backward never writes the frozen parameters.
  EXPECT_EQ(0, std::memcmp(base_before.data(), pb.flat_params().data<float>() + pb.trainable_numel(),
                           base_before.size() * sizeof(float)));
}

TEST_P(LoraModel, StartsExactlyAtTheBaseModelAndMergesIntoIt) {
  const ModelConfig lc = lora_config(GetParam()), bc = base_config(GetParam());
  OpTable ops = reference_ops();
  GPTModel lora(lc, single_process_partition(lc), &ops), base(bc, single_process_partition(bc), &ops);
  lora.params().initialize(5);
  base.params().initialize(5);  // the same base values: they depend on (seed, name, index) only
  const ParamBuffer& lp = lora.params();
  for (int id = 0; id < lp.size(); ++id) {
    const ParamSpec& s = lp.spec(id);
    if (s.name.find(".lora_A.") != std::string::npos) {  // kaiming-uniform(a = sqrt(5)): U(±1/sqrt(in))
      const float bound = 1.0f / std::sqrt(static_cast<float>(s.global_shape[1]));
      float largest = 0.0f;
      for (int64_t i = 0; i < s.local_numel(); ++i) largest = std::max(largest, std::fabs(lp.param_data(id)[i]));
      EXPECT_LE(largest, bound) << s.name;
      EXPECT_GT(largest, 0.5f * bound) << s.name;
    } else if (s.name.find(".lora_B.") != std::string::npos) {
      for (int64_t i = 0; i < s.local_numel(); ++i) ASSERT_EQ(lp.param_data(id)[i], 0.0f) << s.name;
    }
  }
  MicroBatch mb = make_batch(lc, 2, 9);
  // Trained-looking adapters, merged into the base: W += (alpha / r)·B·A gives the same logits.
  testing::expect_lora_starts_at_base_and_merges(lora, base, lc, mb, 4 * static_cast<int>(lc.num_layers), 1e-5, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Architectures, LoraModel, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "llama" : "gpt"; });

// --bf16: the base GEMMs take bf16 inputs, the adapter branch widens them to f32; logits and
// adapter gradients stay close to the f32 run's.
TEST(LoraModel, Bf16RunsCloseToF32) {
  ModelConfig c = lora_config(true);
  OpTable ops = reference_ops();
  GPTModel f32(c, single_process_partition(c), &ops);
  c.bf16 = true;
  GPTModel b16(c, single_process_partition(c), &ops);
  f32.params().initialize(8);
  b16.params().initialize(8);
  testing::randomise_lora_b(f32.params(), 4);
  testing::randomise_lora_b(b16.params(), 4);
  b16.params().refresh_gemm_copy();
  const MicroBatch mb = make_batch(c, 2, 13);
  testing::mean_loss(f32, mb, true);
  testing::mean_loss(b16, mb, true);
  const ParamBuffer &a = f32.params(), &b = b16.params();
  ASSERT_EQ(a.trainable_numel(), b.trainable_numel());
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < a.trainable_numel(); ++i) {
    const double d = a.flat_grads().data<float>()[i] - b.flat_grads().data<float>()[i];
    diff += d * d;
    norm += double(a.flat_grads().data<float>()[i]) * a.flat_grads().data<float>()[i];
  }
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(std::sqrt(diff / norm), 3e-2);
}

TEST(LoraModel, SomeTargetsOnly) {
  const ModelConfig c = lora_config(true, /*all_targets=*/false);  // linear_qkv and linear_fc2
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  EXPECT_GE(pb.find("decoder.layers.1.self_attention.linear_qkv.lora_A.default.weight"), 0);
  EXPECT_GE(pb.find("decoder.layers.1.mlp.linear_fc2.lora_B.default.weight"), 0);
  EXPECT_EQ(pb.find("decoder.layers.1.self_attention.linear_proj.lora_A.default.weight"), -1);
  EXPECT_EQ(pb.find("decoder.layers.0.mlp.linear_fc1.lora_B.default.weight"), -1);
  const int a = pb.find("decoder.layers.0.mlp.linear_fc2.lora_A.default.weight");
  const int b = pb.find("decoder.layers.0.mlp.linear_fc2.lora_B.default.weight");
  EXPECT_EQ(pb.spec(a).global_shape, (Shape{3, c.ffn}));     // [r, in]
  EXPECT_EQ(pb.spec(b).global_shape, (Shape{c.hidden, 3}));  // [out, r]
}

// AdamW over a LoRA model's buffer: state for the adapters only, the base bit-identical after
// steps, and the bytes saved measured by the allocator's exact accounting.
TEST(LoraModel, OptimizerStepsLeaveTheBaseUnchangedAndHoldStateForAdaptersOnly) {
  const ModelConfig lc = lora_config(true), bc = base_config(true);
  OpTable ops = reference_ops();
  Allocator& alloc = host_allocator();
  const int64_t before_base = alloc.current_bytes();
  auto base = std::make_unique<GPTModel>(bc, single_process_partition(bc), &ops);
  Optimizer base_opt(OptimizerConfig{}, &base->params(), &ops, make_self_communicator("mp"));
  const int64_t base_bytes = alloc.current_bytes() - before_base;
  const int64_t before_lora = alloc.current_bytes();
  GPTModel model(lc, single_process_partition(lc), &ops);
  Optimizer opt(OptimizerConfig{}, &model.params(), &ops, make_self_communicator("mp"));
  const int64_t lora_bytes = alloc.current_bytes() - before_lora;
  ParamBuffer& pb = model.params();
  const int64_t n = pb.numel(), t = pb.trainable_numel(), base_n = base->params().numel();
  EXPECT_EQ(n - t, base_n);
  EXPECT_EQ(opt.state_bytes(), 2 * t * 4);  // exp_avg and exp_avg_sq of the adapters only
  EXPECT_EQ(base_opt.state_bytes(), 2 * base_n * 4);
  // Full training holds params + grads + 2 moments (16 bytes per element); LoRA holds the base
  // params, the adapters' params, grads and moments, and one scratch the size of the largest
  // frozen 1-D parameter (where the norm kernels write a frozen norm's gradient).
  int64_t largest_frozen = 0;
  for (const ParamSpec& s : pb.specs())
    if (!s.trainable && s.global_shape.size() == 1) largest_frozen = std::max(largest_frozen, s.local_numel());
  EXPECT_EQ(pb.grad_data(pb.find("output_layer.weight")), nullptr);  // frozen 2-D: no gradient at all
  const int64_t base_model_overhead = base_bytes - 16 * base_n;  // RoPE tables etc., the same in both
  EXPECT_EQ(lora_bytes - base_model_overhead, 4 * base_n + 16 * t + 4 * largest_frozen);
  std::printf("[ LoRA memory ] full fine-tuning %lld bytes (params, grads, AdamW state), LoRA %lld bytes: "
              "%lld saved (%lld trainable of %lld elements)\n",
              static_cast<long long>(16 * base_n), static_cast<long long>(lora_bytes - base_model_overhead),
              static_cast<long long>(16 * base_n - (lora_bytes - base_model_overhead)), static_cast<long long>(t),
              static_cast<long long>(n));
  base.reset();

  pb.initialize(11);
  const std::vector<float> frozen(pb.flat_params().data<float>() + t, pb.flat_params().data<float>() + n);
  const std::vector<float> adapters_before(pb.flat_params().data<float>(), pb.flat_params().data<float>() + t);
  for (int step = 0; step < 3; ++step) {
    testing::mean_loss(model, make_batch(lc, 2, 20 + step), true);
    ASSERT_TRUE(opt.step(1e-2, 0.1).applied);
  }
  EXPECT_EQ(0, std::memcmp(frozen.data(), pb.flat_params().data<float>() + t, frozen.size() * sizeof(float)))
      << "a frozen base weight changed";
  double moved = 0.0;
  for (int64_t i = 0; i < t; ++i) moved = std::max(moved, double(std::fabs(pb.flat_params().data<float>()[i] - adapters_before[i])));
  EXPECT_GT(moved, 1e-3) << "the adapters did not train";
}

}  // namespace
}  // namespace gale
