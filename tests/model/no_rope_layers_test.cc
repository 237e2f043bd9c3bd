// --no-rope-freq (ModelConfig::no_rope_layers): a layer marked 1 attends without RoPE. Every layer
// marked is the model without position embedding; a mixed pattern is neither that nor full RoPE,
// its gradients match finite differences, and KV-cache decoding skips RoPE in the same layers.
#include <gtest/gtest.h>

#include "model/decoding_check.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

ModelConfig rope_config(std::vector<int> no_rope) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.num_layers = 2;
  c.position = PositionEmbedding::kRope;
  c.attention_dropout = c.hidden_dropout = 0.0f;
  c.no_rope_layers = std::move(no_rope);
  return c;
}

TEST(NoRopeLayers, EveryLayerWithoutRopeIsTheModelWithoutPositionEmbedding) {
  const ModelConfig all = rope_config({1, 1});
  ModelConfig none = rope_config({});
  none.position = PositionEmbedding::kNone;
  const MicroBatch mb = testing::masked_batch(all, 2, 7, false);
  const std::vector<float> a = testing::reference_logits(all, mb), n = testing::reference_logits(none, mb);
  ASSERT_EQ(a.size(), n.size());
  EXPECT_EQ(testing::max_abs_diff(a, n), 0.0);
}

TEST(NoRopeLayers, AMixedPatternIsNeitherFullRopeNorNone) {
  const MicroBatch mb = testing::masked_batch(rope_config({}), 2, 7, false);
  const std::vector<float> rope = testing::reference_logits(rope_config({}), mb), first = testing::reference_logits(rope_config({1, 0}), mb),
                           second = testing::reference_logits(rope_config({0, 1}), mb), none = testing::reference_logits(rope_config({1, 1}), mb);
  EXPECT_GT(testing::max_abs_diff(first, rope), 1e-3);
  EXPECT_GT(testing::max_abs_diff(first, none), 1e-3);
  EXPECT_GT(testing::max_abs_diff(first, second), 1e-3);
  EXPECT_EQ(testing::max_abs_diff(rope, testing::reference_logits(rope_config({0, 0}), mb)), 0.0);  // all zeros: RoPE everywhere
}

// Five-point directional derivatives in fp32 (testing::expect_every_parameter_matches_finite_differences).
TEST(NoRopeLayers, EveryParameterMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(rope_config({0, 1}));
}

TEST(NoRopeLayers, KvCacheDecodingEqualsTheWholeSequenceForward) {
  testing::expect_reference_model_decoding_equals_whole_forward(rope_config({1, 0}));
}

}  // namespace
}  // namespace gale
