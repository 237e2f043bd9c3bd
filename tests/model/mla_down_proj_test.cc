// --mla-down-proj-fusion (model/mla_down_proj.h): the fused input norm + [q_down; kv_down] GEMM against
// the unfused reference (loss and every gradient, f32 and bf16), finite differences through the fused
// path, the fused kernel on its own with adjacent and non-adjacent weights, the parameter layout,
// and the norm kernel written in the GEMM input type. Cases: RMSNorm and LayerNorm, with and
// without the latent norms, V narrower and wider than Q/K, bf16, DSA.
#include "model/mla_down_proj.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/norm.h"
#include "kernels/cpu/norm_gemm_input.h"
#include "model/gpt_model.h"
#include "model/linear.h"
#include "model/param_builders.h"
#include "mla_test_config.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

using testing::mla_config;

ModelConfig fused(ModelConfig c) {
  c.mla.down_proj_fusion = true;
  return c;
}

OpTable fused_ops() {
  OpTable ops = reference_ops();
  ops.mla_down_proj_fusion = true;
  return ops;
}

// Every parameter's gradient of `b` within rel·max|a's| + abs of `a`'s, matched by name (the two
// models may register the down projections in another order).
void expect_close_grads_by_name(const ParamBuffer& a, const ParamBuffer& b, double rel, double abs) {
  ASSERT_EQ(a.size(), b.size());
  for (int id = 0; id < a.size(); ++id) {
    const int other = b.find(a.spec(id).name);
    ASSERT_GE(other, 0) << a.spec(id).name;
    const int64_t n = a.spec(id).local_numel();
    ASSERT_EQ(n, b.spec(other).local_numel());
    const float *ga = a.grad_data(id), *gb = b.grad_data(other);
    double scale = 0.0, worst = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      scale = std::max(scale, std::abs(double(ga[i])));
      worst = std::max(worst, std::abs(double(ga[i]) - double(gb[i])));
    }
    EXPECT_LE(worst, rel * scale + abs) << a.spec(id).name << " (largest entry " << scale << ")";
  }
}

struct FusionCase {
  const char* name;
  ModelConfig config;
  double loss_rel, grad_rel;
};

class MlaDownProjFusion : public ::testing::TestWithParam<FusionCase> {};

// The unfused model (the flag off: Gale's and Megatron's plain MLA) against the fused one: same
// parameters (initialised by name), loss within loss_rel, every gradient (the down projections',
// the input norm's included) within grad_rel of its parameter's largest entry. f32: the norm is
// bit-identical and each output is the same dot product, so the only difference is the GEMM's
// blocking over 9 vs 6 + 9 rows (measured ≤ 1e-6). bf16: the same, but a one-ulp f32 difference
// can flip a later bf16 rounding (4e-3 of that element).
TEST_P(MlaDownProjFusion, FusedEqualsUnfused) {
  const FusionCase& fc = GetParam();
  OpTable ref_ops = reference_ops(), ops = fused_ops();
  GPTModel ref(fc.config, single_process_partition(fc.config), &ref_ops);
  const ModelConfig fc_config = fused(fc.config);
  GPTModel model(fc_config, single_process_partition(fc_config), &ops);
  ref.params().initialize(42);
  model.params().initialize(42);
  const MicroBatch mb = testing::masked_batch(fc.config, 2, 7, /*documents=*/true);
  const double l_ref = testing::mean_loss(ref, mb, true), l = testing::mean_loss(model, mb, true);
  EXPECT_NEAR(l, l_ref, fc.loss_rel * std::abs(l_ref));
  expect_close_grads_by_name(ref.params(), model.params(), fc.grad_rel, 1e-8);
  // The down projections' gradients are not zero (the comparison above is not vacuous).
  const int kv = model.params().find("decoder.layers.0.self_attention.linear_kv_down_proj.weight");
  ASSERT_GE(kv, 0);
  double norm = 0.0;
  for (int64_t i = 0; i < model.params().spec(kv).local_numel(); ++i) norm += std::abs(model.params().grad_data(kv)[i]);
  EXPECT_GT(norm, 0.0);
}

ModelConfig with_bf16(ModelConfig c) {
  c.bf16 = true;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Configs, MlaDownProjFusion,
    ::testing::Values(FusionCase{"llama_rmsnorm_latent_norms", mla_config(true, 6, true, 3), 1e-6, 1e-5},
                      FusionCase{"gpt_layernorm_no_latent_norms", mla_config(false, 7, false, 5), 1e-6, 1e-5},
                      FusionCase{"gpt_layernorm_latent_norms_v_wide", mla_config(false, 6, true, 10), 1e-6, 1e-5},
                      FusionCase{"llama_bf16", with_bf16(mla_config(true, 6, true, 3)), 1e-3, 3e-2},
                      // DSA: the lightning indexer reads the normed input the fused pass writes.
                      FusionCase{"llama_dsa", testing::dsa_decode_config(6, 4), 1e-6, 1e-5}),
    [](const auto& info) { return std::string(info.param.name); });

// Inference (nothing kept for backward): the fused model's logits equal the unfused model's.
TEST(MlaDownProjFusion, LogitsWithoutSavedStateEqualUnfused) {
  const ModelConfig base = mla_config(true, 6, true, 3), c = fused(base);
  OpTable ref_ops = reference_ops(), ops = fused_ops();
  GPTModel ref(base, single_process_partition(base), &ref_ops), model(c, single_process_partition(c), &ops);
  ref.params().initialize(8);
  model.params().initialize(8);
  const MicroBatch mb = testing::masked_batch(c, 2, 3, false);
  const Tensor a = ref.forward_logits(mb, Tensor()), b = model.forward_logits(mb, Tensor());
  ASSERT_EQ(a.numel(), b.numel());
  double worst = 0.0, scale = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::abs(double(a.data<float>()[i]) - double(b.data<float>()[i])));
    scale = std::max(scale, std::abs(double(a.data<float>()[i])));
  }
  EXPECT_LE(worst, 1e-6 * scale + 1e-7);
}

// The fused path against finite differences, every parameter (as tests/model/mla_attention_test.cc).
TEST(MlaDownProjFusion, EveryParameterMatchesFiniteDifferences) {
  for (const ModelConfig& base : {mla_config(true, 6, true, 3), mla_config(false, 7, false, 5)}) {
    const ModelConfig c = fused(base);
    OpTable ops = fused_ops();
    GPTModel model(c, single_process_partition(c), &ops);
    model.params().initialize(42);
    const MicroBatch mb = testing::masked_batch(c, 2, 7, false);
    testing::mean_loss(model, mb, true);
    ParamBuffer& pb = model.params();
    std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
    auto loss = [&] { return testing::mean_loss(model, mb, false); };
    for (int id = 0; id < pb.size(); ++id) {
      const int64_t n = pb.spec(id).local_numel();
      auto dir = testing::random_vector(n, 100 + id);
      const double analytic = testing::dot(grads.data() + pb.spec(id).offset, dir.data(), n);
      const double numeric = testing::directional_derivative(loss, pb.param_data(id), dir.data(), n, 1e-3);
      EXPECT_LT(testing::rel_diff(analytic, numeric, 1e-2), 1e-2)
          << pb.spec(id).name << ": " << analytic << " vs " << numeric;
    }
  }
}

// With the flag, kv_down follows q_down in the flat buffers (the fused GEMM reads them in place);
// the names and shapes are Megatron's unfused ones (no linear_qkv_down_proj in Gale's checkpoints).
TEST(MlaDownProjFusion, WeightsAdjacentUnderTheUnfusedNames) {
  const ModelConfig c = fused(mla_config(true, 6, true, 3));
  OpTable ops = fused_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  const int q = pb.find("decoder.layers.1.self_attention.linear_q_down_proj.weight");
  const int kv = pb.find("decoder.layers.1.self_attention.linear_kv_down_proj.weight");
  ASSERT_GE(q, 0);
  ASSERT_GE(kv, 0);
  EXPECT_EQ(pb.spec(q).global_shape, (Shape{6, 16}));
  EXPECT_EQ(pb.spec(kv).global_shape, (Shape{5 + 4, 16}));
  EXPECT_EQ(pb.spec(kv).offset, pb.spec(q).offset + pb.spec(q).local_numel());
  EXPECT_EQ(pb.find("decoder.layers.1.self_attention.linear_qkv_down_proj.weight"), -1);
  EXPECT_GE(pb.find("decoder.layers.1.input_layernorm.weight"), 0);
}

// The norm written in the GEMM input type equals the reference norm followed by the conversion,
// bit for bit (f32 and bf16; RMSNorm and LayerNorm), with the same statistics.
TEST(NormToGemmInput, BitIdenticalToNormThenConversion) {
  const int64_t rows = 37, H = 24;
  const std::vector<float> x = testing::random_vector(rows * H, 1, 2.0f), w = testing::random_vector(H, 2),
                           b = testing::random_vector(H, 3);
  for (bool rms : {true, false}) {
    std::vector<float> y(rows * H), stats(2 * rows), stats2(2 * rows), yf(rows * H);
    if (rms)
      rmsnorm_forward_ref(x.data(), w.data(), y.data(), stats.data(), rows, H, 1e-5f);
    else
      layernorm_forward_ref(x.data(), w.data(), b.data(), y.data(), stats.data(), stats.data() + rows, rows, H, 1e-5f);
    norm_to_gemm_input(NormSpec{rms, 1e-5f}, x.data(), w.data(), rms ? nullptr : b.data(), yf.data(), DType::kF32,
                       stats2.data(), rows, H);
    for (int64_t i = 0; i < rows * H; ++i) ASSERT_EQ(y[i], yf[i]) << (rms ? "rms " : "ln ") << i;
    for (int64_t r = 0; r < (rms ? 1 : 2) * rows; ++r) ASSERT_EQ(stats[r], stats2[r]) << r;
    std::vector<bf16> yb(rows * H);
    norm_to_gemm_input(NormSpec{rms, 1e-5f}, x.data(), w.data(), rms ? nullptr : b.data(), yb.data(), DType::kBF16,
                       stats2.data(), rows, H);
    for (int64_t i = 0; i < rows * H; ++i) ASSERT_EQ(yb[i].bits, float_to_bf16(y[i]).bits) << i;
  }
}

// The fused kernel alone, on a hand-made buffer: [norm, q_down, kv_down] (adjacent: one GEMM in
// place) and [norm, q_down, spacer, kv_down] (copied, dW per half) against norm + two linears.
TEST(MlaDownProj, KernelMatchesNormThenTwoLinearsAdjacentOrNot) {
  for (bool adjacent : {true, false}) {
    for (bool rms : {true, false}) {
      ModelConfig c = testing::gradcheck_gpt_config();
      c.rms_norm = rms;
      const int64_t H = c.hidden, Cq = 6, Ckv = 9, rows = 11;
      ParamBuffer pb;
      MlaDownProjIds ids;
      ids.norm_w = pb.add(make_param_spec("norm.weight", {H}, InitKind::kNormal, 1.0f, false));
      if (!rms) ids.norm_b = pb.add(make_param_spec("norm.bias", {H}, InitKind::kNormal, 0.5f, false));
      ids.q_down = pb.add(make_param_spec("q_down.weight", {Cq, H}, InitKind::kNormal, 0.3f, true));
      if (!adjacent) pb.add(make_param_spec("spacer", {5}, InitKind::kNormal, 1.0f, true));
      ids.kv_down = pb.add(make_param_spec("kv_down.weight", {Ckv, H}, InitKind::kNormal, 0.3f, true));
      pb.finalize();
      pb.initialize(5);
      OpTable ops = reference_ops();
      LayerRuntime rt;
      rt.config = &c;
      rt.ops = &ops;
      const std::vector<float> xv = testing::random_vector(rows * H, 9, 1.5f);
      Tensor x = Tensor::empty({rows, H});
      std::copy(xv.begin(), xv.end(), x.data<float>());
      const std::vector<float> dyv = testing::random_vector(rows * (Cq + Ckv), 10);
      Tensor dy = Tensor::empty({rows, Cq + Ckv});
      std::copy(dyv.begin(), dyv.end(), dy.data<float>());

      // Reference: norm, two linears, their backward, the norm's backward.
      Tensor xn = Tensor::empty({rows, H}), stats = Tensor::empty({2, rows});
      ops.norm_forward(NormSpec{rms, c.norm_eps}, x.data<float>(), pb.param_data(ids.norm_w),
                       rms ? nullptr : pb.param_data(ids.norm_b), xn.data<float>(), stats.data<float>(), rows, H);
      const LinearWeight lq = linear_weight(pb, ids.q_down, ops.gemm), lkv = linear_weight(pb, ids.kv_down, ops.gemm);
      const Tensor yq = linear_forward(xn, lq), ykv = linear_forward(xn, lkv);
      Tensor dyq = Tensor::empty({rows, Cq}), dykv = Tensor::empty({rows, Ckv});
      for (int64_t t = 0; t < rows; ++t) {
        for (int64_t j = 0; j < Cq; ++j) dyq.data<float>()[t * Cq + j] = dyv[t * (Cq + Ckv) + j];
        for (int64_t j = 0; j < Ckv; ++j) dykv.data<float>()[t * Ckv + j] = dyv[t * (Cq + Ckv) + Cq + j];
      }
      pb.zero_grads();
      Tensor dxn = linear_backward(dyq, xn, lq);
      const Tensor dxn2 = linear_backward(dykv, xn, lkv);
      for (int64_t i = 0; i < rows * H; ++i) dxn.data<float>()[i] += dxn2.data<float>()[i];
      Tensor dx_ref = Tensor::empty({rows, H});
      ops.norm_backward(NormSpec{rms, c.norm_eps}, dxn.data<float>(), x.data<float>(), pb.param_data(ids.norm_w),
                        stats.data<float>(), dx_ref.data<float>(), pb.grad_data(ids.norm_w),
                        rms ? nullptr : pb.grad_data(ids.norm_b), rows, H);
      std::vector<float> g_ref(pb.grad_data(0), pb.grad_data(0) + pb.trainable_numel());

      pb.zero_grads();
      MlaDownProjSaved saved;
      const Tensor y = mla_down_proj_forward(rt, pb, ids, x, &saved);
      ASSERT_EQ(y.shape(), (Shape{rows, Cq + Ckv}));
      for (int64_t t = 0; t < rows; ++t) {
        for (int64_t j = 0; j < Cq; ++j)
          EXPECT_NEAR(y.data<float>()[t * (Cq + Ckv) + j], yq.data<float>()[t * Cq + j], 1e-5) << t << "," << j;
        for (int64_t j = 0; j < Ckv; ++j)
          EXPECT_NEAR(y.data<float>()[t * (Cq + Ckv) + Cq + j], ykv.data<float>()[t * Ckv + j], 1e-5) << t << "," << j;
      }
      const Tensor dx = mla_down_proj_backward(rt, pb, ids, saved, dy);
      for (int64_t i = 0; i < rows * H; ++i) EXPECT_NEAR(dx.data<float>()[i], dx_ref.data<float>()[i], 1e-5) << i;
      for (int64_t i = 0; i < pb.trainable_numel(); ++i)
        EXPECT_NEAR(pb.grad_data(0)[i], g_ref[static_cast<size_t>(i)], 1e-4) << "flat gradient " << i;
      EXPECT_FALSE(saved.xn.defined());  // released
    }
  }
}

}  // namespace
}  // namespace gale
