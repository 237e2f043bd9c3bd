// --attention-output-gate (model/attention_output_gate.h): the gate rows' split and merge in Megatron's
// per-group order, the sigmoid gate's gradients, finite differences of a gated GQA model, and KV-cache
// decoding equal to the whole-sequence forward. The model's values against an independent reference:
// tests/golden (llama_gate, tools/reference/gpt_reference.py).
#include <gtest/gtest.h>

#include <cmath>

#include "model/attention_output_gate.h"
#include "model/decoding_check.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

// 4 query heads in 2 groups of HD 3: each group's 2·2·3 + 2·3 = 18 rows are q0 q1 | g0 g1 | k | v.
TEST(AttentionOutputGate, SplitTakesEachGroupsGateRowsAndMergeIsItsInverse) {
  const int64_t NH = 4, KV = 2, HD = 3, T = 2, row = (2 * NH + 2 * KV) * HD;
  Tensor packed = Tensor::empty({T, row});
  for (int64_t i = 0; i < T * row; ++i) packed.data<float>()[i] = static_cast<float>(i);
  Tensor gate;
  const Tensor qkv = split_output_gate(packed, NH, KV, HD, &gate);
  ASSERT_EQ(qkv.shape(), (Shape{T, (NH + 2 * KV) * HD}));
  ASSERT_EQ(gate.shape(), (Shape{T, NH * HD}));
  // Token 1, group 1 starts at 1·36 + 18 = 54: its q rows 54..59, gate 60..65, k 66..68, v 69..71.
  EXPECT_EQ(gate.data<float>()[1 * 12 + 6], 60.0f);   // head 2 (group 1's first) gate
  EXPECT_EQ(qkv.data<float>()[1 * 24 + 12], 54.0f);   // group 1's first query value
  EXPECT_EQ(qkv.data<float>()[1 * 24 + 18], 66.0f);   // group 1's key
  EXPECT_EQ(qkv.data<float>()[1 * 24 + 21], 69.0f);   // group 1's value
  const Tensor back = merge_output_gate(qkv, gate, NH, KV, HD);
  for (int64_t i = 0; i < T * row; ++i) EXPECT_EQ(back.data<float>()[i], packed.data<float>()[i]) << i;
}

TEST(AttentionOutputGate, GradientsOfTheSigmoidGate) {
  const float ctx[3] = {0.5f, -2.0f, 1.5f}, gate[3] = {0.0f, 1.0f, -3.0f}, d_out[3] = {1.0f, 0.25f, -2.0f};
  float out[3], d_ctx[3], d_gate[3];
  output_gate_forward(ctx, gate, out, 3);
  output_gate_backward(d_out, ctx, gate, d_ctx, d_gate, 3);
  for (int i = 0; i < 3; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-double(gate[i])));
    EXPECT_NEAR(out[i], ctx[i] * s, 1e-7);
    EXPECT_NEAR(d_ctx[i], d_out[i] * s, 1e-7);
    const double h = 1e-3;
    const double numeric = d_out[i] * ctx[i] *
                           (1.0 / (1.0 + std::exp(-(gate[i] + h))) - 1.0 / (1.0 + std::exp(-(gate[i] - h)))) / (2 * h);
    EXPECT_NEAR(d_gate[i], numeric, 1e-6);
  }
}

ModelConfig gated_config() {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.position = PositionEmbedding::kRope;
  c.attention_output_gate = true;
  c.attention_dropout = c.hidden_dropout = 0.0f;
  return c;
}

TEST(AttentionOutputGate, EveryParameterMatchesFiniteDifferences) {
  const ModelConfig c = gated_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  EXPECT_EQ(model.params().spec(model.params().find("decoder.layers.0.self_attention.linear_qkv.weight")).global_shape,
            (Shape{(2 * 4 + 2 * 2) * 4, c.hidden}));
  testing::expect_every_parameter_matches_finite_differences(c);
}

TEST(AttentionOutputGate, KvCacheDecodingEqualsTheWholeSequenceForward) {
  testing::expect_reference_model_decoding_equals_whole_forward(gated_config());
}

}  // namespace
}  // namespace gale
