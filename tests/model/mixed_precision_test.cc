// --bf16 and --fp16: bf16 or f16 weights and GEMM inputs (the backward's gradients included) with
// f32 master weights and gradients give gradients close to the f32 model's, keep f32 master values
// exact and keep less activation memory; and --fp16's loss scale every backward starts from
// (GPTModel::set_grad_scale): exact in f32, the rescue of gradients that would underflow in f16,
// and the overflow it must detect.
#include <gtest/gtest.h>

#include <cmath>

#include "core/allocator.h"
#include "model/gpt_model.h"
#include "testing.h"

namespace gale {
namespace {

// A small LLaMA-style model computing its GEMMs in `gemm` (kF32, kBF16 or kF16).
ModelConfig config(DType gemm, bool moe = false) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = 64;
  c.ffn = 256;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.vocab = 128;
  c.seq_length = 32;
  c.max_positions = 32;
  c.rms_norm = true;
  c.swiglu = true;
  c.position = PositionEmbedding::kRope;
  c.bf16 = gemm == DType::kBF16;
  c.fp16 = gemm == DType::kF16;
  if (moe) {
    c.moe.num_experts = 4;
    c.moe.topk = 2;
    c.moe.ffn = 64;
    c.moe.aux_loss_coeff = 0.3;
    c.moe.z_loss_coeff = 0.05;
  }
  return c;
}

MicroBatch batch(const ModelConfig& c) {
  MicroBatch mb;
  mb.B = 4;
  mb.S = c.seq_length;
  auto r = testing::random_vector(2 * mb.B * mb.S, 5);
  for (int64_t i = 0; i < mb.B * mb.S; ++i) {
    mb.tokens.push_back(static_cast<int32_t>((r[i] + 1.0f) * 0.5f * 127));
    mb.labels.push_back(static_cast<int32_t>((r[mb.B * mb.S + i] + 1.0f) * 0.5f * 127));
    mb.loss_mask.push_back(1.0f);
    mb.position_ids.push_back(static_cast<int32_t>(i % mb.S));
  }
  return mb;
}

struct Step {
  double loss = 0.0;
  std::vector<float> grads;  // divided by the scale and the loss factor again
  int64_t kept_bytes = 0;    // tensor bytes held between forward and backward
};

// One forward/backward with the loss gradient multiplied by `loss_factor` (tiny factors stand for
// tiny gradients) and the model's loss scale `grad_scale`.
Step run(DType gemm, float grad_scale = 1.0f, float loss_factor = 1.0f, bool moe = false) {
  ModelConfig c = config(gemm, moe);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(11);
  model.set_grad_scale(grad_scale);
  model.set_num_microbatches(1);
  MicroBatch mb = batch(c);
  GPTModel::LossSums sums;
  int64_t before = host_allocator().current_bytes();
  model.forward(0, mb, Tensor(), true, &sums);
  Step s;
  s.kept_bytes = host_allocator().current_bytes() - before;
  model.backward(0, Tensor(), static_cast<float>(loss_factor / sums.tokens));
  s.loss = sums.loss_sum / sums.tokens;
  const ParamBuffer& pb = model.params();
  s.grads.assign(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.trainable_numel());
  for (float& g : s.grads) g = g / grad_scale / loss_factor;
  return s;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(diff / norm);
}

TEST(Bf16, GradientsCloseToF32AndLessActivationMemory) {
  Step f32 = run(DType::kF32), b16 = run(DType::kBF16);
  EXPECT_NEAR(b16.loss, f32.loss, 2e-3 * f32.loss);
  // bf16 keeps 8 bits of mantissa: relative rounding ~4e-3 per input, averaged over sums.
  EXPECT_LT(rel_l2(b16.grads, f32.grads), 2e-2);
  EXPECT_GT(rel_l2(b16.grads, f32.grads), 0.0);  // the bf16 path really ran
  EXPECT_LT(b16.kept_bytes, f32.kept_bytes * 85 / 100) << b16.kept_bytes << " vs " << f32.kept_bytes;
}

TEST(Fp16, GradientsCloseToF32AndLessActivationMemory) {
  Step f32 = run(DType::kF32), h = run(DType::kF16);
  EXPECT_NEAR(h.loss, f32.loss, 1e-3 * f32.loss);
  // f16 keeps 11 bits of mantissa: relative rounding ~2.4e-4 per input, averaged over sums.
  EXPECT_LT(rel_l2(h.grads, f32.grads), 5e-3);
  EXPECT_GT(rel_l2(h.grads, f32.grads), 0.0);  // the f16 path really ran
  EXPECT_LT(h.kept_bytes, f32.kept_bytes * 85 / 100) << h.kept_bytes << " vs " << f32.kept_bytes;
}

// The GEMM copy follows the master weights, which keep every bit.
TEST(MixedPrecision, CopyFollowsTheMasterWeights) {
  for (DType gemm : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(gemm));
    ModelConfig c = config(gemm);
    OpTable ops = reference_ops();
    GPTModel model(c, single_process_partition(c), &ops);
    ParamBuffer& pb = model.params();
    pb.initialize(3);
    ASSERT_EQ(pb.gemm_copy_dtype(), gemm);
    int id = pb.find("decoder.layers.0.mlp.linear_fc1.weight");
    auto copy = [&] {
      return gemm == DType::kBF16 ? bf16_to_float(pb.param_bf16_data(id)[7]) : f16_to_float(pb.param_f16_data(id)[7]);
    };
    auto rounded = [&](float v) {
      return gemm == DType::kBF16 ? bf16_to_float(float_to_bf16(v)) : f16_to_float(float_to_f16(v));
    };
    EXPECT_EQ(copy(), rounded(pb.param_data(id)[7]));
    pb.param_data(id)[7] = 0.123456f;  // an optimizer step
    pb.refresh_gemm_copy();
    EXPECT_EQ(copy(), rounded(0.123456f));
    EXPECT_EQ(pb.param_data(id)[7], 0.123456f);
  }
}

TEST(Fp16, LossScaleMultipliesEveryGradientExactlyInF32) {
  // Powers of two: scaling the loss gradient scales every f32 gradient exactly, the MoE auxiliary
  // losses' included.
  for (bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "moe" : "dense");
    Step plain = run(DType::kF32, 1.0f, 1.0f, moe), scaled = run(DType::kF32, 1024.0f, 1.0f, moe);
    ASSERT_EQ(plain.grads.size(), scaled.grads.size());
    int64_t differing = 0;
    for (size_t i = 0; i < plain.grads.size(); ++i) differing += plain.grads[i] != scaled.grads[i];
    EXPECT_EQ(differing, 0);
  }
}

TEST(Fp16, LossScaleRescuesGradientsThatUnderflowInF16) {
  // Gradients 2^-28 times smaller fall below f16's smallest subnormal, 2^-24, and flush to zero:
  // every gradient behind the first f16 GEMM input is lost — all but the output layer's, which the
  // LM head computes in f32 (about half the norm here). Scaling the loss by 2^28 brings them back.
  const float tiny = 0x1p-28f;
  Step ref = run(DType::kF32, 1.0f, tiny);
  Step unscaled = run(DType::kF16, 1.0f, tiny);
  Step scaled = run(DType::kF16, 0x1p28f, tiny);
  EXPECT_GT(rel_l2(unscaled.grads, ref.grads), 0.3);
  EXPECT_LT(rel_l2(scaled.grads, ref.grads), 5e-3);
}

TEST(Fp16, TooLargeALossScaleOverflowsToNonFiniteGradients) {
  Step h = run(DType::kF16, 4294967296.0f);  // Megatron's initial 2^32
  int64_t non_finite = 0;
  for (float g : h.grads) non_finite += !std::isfinite(g);
  EXPECT_GT(non_finite, 0);
  Step f32 = run(DType::kF32, 4294967296.0f);  // f32 has the range for it
  for (float g : f32.grads) ASSERT_TRUE(std::isfinite(g));
}

}  // namespace
}  // namespace gale
