// --bf16: bf16 weights and GEMM inputs with f32 master weights and gradients give gradients close
// to the f32 model's, keep f32 master values exact, and keep less activation memory.
#include <gtest/gtest.h>

#include <cmath>

#include "core/allocator.h"
#include "model/gpt_model.h"
#include "testing.h"

namespace gale {
namespace {

ModelConfig config(bool bf16) {
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
  c.bf16 = bf16;
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
  std::vector<float> grads;
  int64_t kept_bytes = 0;  // tensor bytes held between forward and backward
};

Step run(bool bf16) {
  ModelConfig c = config(bf16);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(11);
  MicroBatch mb = batch(c);
  GPTModel::LossSums sums;
  int64_t before = host_allocator().current_bytes();
  model.forward(0, mb, Tensor(), true, &sums);
  Step s;
  s.kept_bytes = host_allocator().current_bytes() - before;
  model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  s.loss = sums.loss_sum / sums.tokens;
  const ParamBuffer& pb = model.params();
  s.grads.assign(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  return s;
}

TEST(Bf16, GradientsCloseToF32AndLessActivationMemory) {
  Step f32 = run(false), b16 = run(true);
  EXPECT_NEAR(b16.loss, f32.loss, 2e-3 * f32.loss);
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < f32.grads.size(); ++i) {
    diff += (b16.grads[i] - f32.grads[i]) * (b16.grads[i] - f32.grads[i]);
    norm += f32.grads[i] * f32.grads[i];
  }
  // bf16 keeps 8 bits of mantissa: relative rounding ~4e-3 per input, averaged over sums.
  EXPECT_LT(std::sqrt(diff / norm), 2e-2);
  EXPECT_GT(std::sqrt(diff / norm), 0.0);  // the bf16 path really ran
  EXPECT_LT(b16.kept_bytes, f32.kept_bytes * 85 / 100) << b16.kept_bytes << " vs " << f32.kept_bytes;
}

TEST(Bf16, CopyFollowsTheMasterWeights) {
  ModelConfig c = config(true);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  ParamBuffer& pb = model.params();
  pb.initialize(3);
  ASSERT_TRUE(pb.has_gemm_copy());
  int id = pb.find("decoder.layers.0.mlp.linear_fc1.weight");
  EXPECT_EQ(pb.param_bf16_data(id)[7].bits, float_to_bf16(pb.param_data(id)[7]).bits);
  pb.param_data(id)[7] = 0.123456f;  // an optimizer step
  pb.refresh_gemm_copy();
  EXPECT_EQ(bf16_to_float(pb.param_bf16_data(id)[7]), bf16_to_float(float_to_bf16(0.123456f)));
  EXPECT_EQ(pb.param_data(id)[7], 0.123456f);  // the master copy keeps every bit
}

}  // namespace
}  // namespace gale
