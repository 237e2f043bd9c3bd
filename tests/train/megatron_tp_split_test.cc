// Megatron's tensor-parallel splits: which names split how, and merging TP pieces as cutting's inverse.
#include "train/megatron_tp_split.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

Tensor iota(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  return t;
}

std::vector<float> values(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

TEST(MegatronTpSplit, SplitOfTorchAndTorchDistNames) {
  EXPECT_EQ(megatron_split_of("decoder.layers.0.mlp.linear_fc1.weight", true), MegatronSplit::kGatedRows);
  EXPECT_EQ(megatron_split_of("decoder.layers.mlp.linear_fc1.weight", false), MegatronSplit::kRows);  // stacked
  EXPECT_EQ(megatron_split_of("decoder.layers.self_attention.linear_qkv.weight", true), MegatronSplit::kRows);
  EXPECT_EQ(megatron_split_of("embedding.word_embeddings.weight", true), MegatronSplit::kRows);
  EXPECT_EQ(megatron_split_of("output_layer.weight", true), MegatronSplit::kRows);
  EXPECT_EQ(megatron_split_of("decoder.layers.1.self_attention.linear_proj.weight", true), MegatronSplit::kColumns);
  EXPECT_EQ(megatron_split_of("decoder.layers.mlp.linear_fc2.weight", true), MegatronSplit::kColumns);
  EXPECT_EQ(megatron_split_of("decoder.layers.mlp.linear_fc1.layer_norm_weight", true), MegatronSplit::kReplicated);
  EXPECT_EQ(megatron_split_of("decoder.layers.self_attention.linear_proj.bias", true), MegatronSplit::kReplicated);
  EXPECT_EQ(megatron_split_of("decoder.final_layernorm.weight", true), MegatronSplit::kReplicated);
}

// SwiGLU's fc1 [gate; up] (8 rows) at TP 2: rank t holds [gate rows of t; up rows of t].
TEST(MegatronTpSplit, GatedRowsCutAndMergeHalvesSeparately) {
  const Tensor whole = iota({8, 1});
  auto r1 = megatron_cut_tp(whole, MegatronSplit::kGatedRows, 2, 1, "fc1");
  ASSERT_TRUE(r1.ok()) << r1.status().message();
  EXPECT_EQ(values(*r1), (std::vector<float>{2, 3, 6, 7}));
  auto r0 = megatron_cut_tp(whole, MegatronSplit::kGatedRows, 2, 0, "fc1");
  ASSERT_TRUE(r0.ok());
  auto merged = megatron_merge_tp({*r0, *r1}, MegatronSplit::kGatedRows, "fc1", "W");
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  EXPECT_EQ(values(*merged), values(whole));
  EXPECT_EQ(merged->shape(), whole.shape());
}

TEST(MegatronTpSplit, RowsAndColumnsRoundTrip) {
  const Tensor whole = iota({4, 6});
  for (MegatronSplit split : {MegatronSplit::kRows, MegatronSplit::kColumns, MegatronSplit::kReplicated}) {
    std::vector<Tensor> parts;
    for (int64_t t = 0; t < 2; ++t) {
      auto p = megatron_cut_tp(whole, split, 2, t, "w");
      ASSERT_TRUE(p.ok()) << p.status().message();
      parts.push_back(*p);
    }
    if (split == MegatronSplit::kColumns) {
      EXPECT_EQ(values(parts[1]), (std::vector<float>{3, 4, 5, 9, 10, 11, 15, 16, 17, 21, 22, 23}));
    } else if (split == MegatronSplit::kRows) {
      EXPECT_EQ(values(parts[1]), (std::vector<float>{12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}));
    }
    auto merged = megatron_merge_tp(parts, split, "w", "W");
    ASSERT_TRUE(merged.ok()) << merged.status().message();
    EXPECT_EQ(values(*merged), values(whole));
  }
}

TEST(MegatronTpSplit, PiecesThatDoNotFitAreNamed) {
  auto odd = megatron_cut_tp(iota({6, 2}), MegatronSplit::kGatedRows, 2, 0, "fc1");
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().message(),
            "tensor 'fc1' of shape [6, 2]: 6 rows do not split into 4 equal parts for tensor-parallel size 2");
  auto differ = megatron_merge_tp({iota({2, 2}), iota({3, 2})}, MegatronSplit::kRows, "w", "W");
  ASSERT_FALSE(differ.ok());
  EXPECT_EQ(differ.status().message(),
            "W: tensor 'w' has shape [2, 2] on tensor-parallel rank 0 but [3, 2] (f32) on another");
}

}  // namespace
}  // namespace gale
