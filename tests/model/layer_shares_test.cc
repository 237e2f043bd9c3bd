// The tensor-parallel split arithmetic of --unaligned-linear: MindSpeed's rule for heads, query
// groups and FFN columns, and ParamSpec's uneven shards (every global element held exactly once).
#include "model/layer_shares.h"

#include <gtest/gtest.h>

#include <vector>

#include "model/param_builders.h"

namespace gale {
namespace {

ModelConfig config(int64_t heads, int64_t groups, int64_t head_dim, int64_t ffn) {
  ModelConfig c;
  c.heads = heads;
  c.kv_heads = groups;
  c.head_dim = head_dim;
  c.hidden = heads * head_dim;
  c.ffn = ffn;
  return c;
}

std::vector<int64_t> counts(int64_t n, int64_t parts) {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < parts; ++r) out.push_back(tp_share(n, parts, r).count);
  return out;
}

std::vector<int64_t> offsets(int64_t n, int64_t parts) {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < parts; ++r) out.push_back(tp_share(n, parts, r).offset);
  return out;
}

TEST(TpShare, FirstRanksTakeTheRemainder) {
  EXPECT_EQ(counts(6, 4), (std::vector<int64_t>{2, 2, 1, 1}));
  EXPECT_EQ(offsets(6, 4), (std::vector<int64_t>{0, 2, 4, 5}));
  EXPECT_EQ(counts(25, 4), (std::vector<int64_t>{7, 6, 6, 6}));  // MindSpeed's documented example
  EXPECT_EQ(counts(100, 3), (std::vector<int64_t>{34, 33, 33}));
  EXPECT_EQ(offsets(100, 3), (std::vector<int64_t>{0, 34, 67}));
  EXPECT_EQ(counts(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));  // divisible: Megatron's even split
  EXPECT_EQ(offsets(8, 4), (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(counts(2, 3), (std::vector<int64_t>{1, 1, 0}));
}

TEST(LayerShares, MhaHeadsOverTp4) {
  const ModelConfig c = config(6, 6, 8, 100);
  std::vector<int64_t> heads, first;
  for (int64_t r = 0; r < 4; ++r) {
    const LayerShares s = layer_shares(c, 4, r);
    EXPECT_EQ(s.groups, s.heads);  // MHA: a group is one head
    heads.push_back(s.heads);
    first.push_back(s.head_offset);
    EXPECT_EQ(s.ffn, 25);
    EXPECT_EQ(s.qkv_rows_per_group, 3 * 8);
    EXPECT_EQ(s.proj_cols_per_group, 8);
  }
  EXPECT_EQ(heads, (std::vector<int64_t>{2, 2, 1, 1}));
  EXPECT_EQ(first, (std::vector<int64_t>{0, 2, 4, 5}));
}

TEST(LayerShares, GqaKeepsGroupsWithTheirHeads) {
  // 10 heads in 5 groups over TP 3: groups 2, 2, 1 -> heads 4, 4, 2.
  const ModelConfig c = config(10, 5, 8, 100);
  const int64_t expect_heads[] = {4, 4, 2}, expect_first[] = {0, 4, 8}, expect_ffn[] = {34, 33, 33},
                expect_ffn_first[] = {0, 34, 67};
  for (int64_t r = 0; r < 3; ++r) {
    const LayerShares s = layer_shares(c, 3, r);
    EXPECT_EQ(s.heads, expect_heads[r]) << r;
    EXPECT_EQ(s.head_offset, expect_first[r]) << r;
    EXPECT_EQ(s.heads, s.groups * 2) << r;
    EXPECT_EQ(s.ffn, expect_ffn[r]) << r;
    EXPECT_EQ(s.ffn_offset, expect_ffn_first[r]) << r;
    EXPECT_EQ(s.qkv_rows_per_group, (2 + 2) * 8);
    EXPECT_EQ(s.proj_cols_per_group, 2 * 8);
  }
  // 10 heads in 2 groups over TP 3: 5, 5, 0 (validation refuses such a layout).
  const ModelConfig two = config(10, 2, 8, 100);
  EXPECT_EQ(layer_shares(two, 3, 0).heads, 5);
  EXPECT_EQ(layer_shares(two, 3, 1).heads, 5);
  EXPECT_EQ(layer_shares(two, 3, 2).heads, 0);
}

// Every element of the global tensor is held by exactly one rank, at the place the rank's share says.
void expect_partition(ParamSpec s, int64_t tp, const std::vector<Shape>& local_shapes) {
  std::vector<int> held(static_cast<size_t>(shape_numel(s.global_shape)), 0);
  for (int64_t r = 0; r < tp; ++r) {
    s.split_parts = tp;
    s.split_rank = r;
    EXPECT_EQ(s.local_shape(), local_shapes[static_cast<size_t>(r)]) << s.name << " rank " << r;
    for (int64_t i = 0; i < s.local_numel(); ++i) ++held[static_cast<size_t>(s.global_index(i))];
  }
  for (size_t i = 0; i < held.size(); ++i) ASSERT_EQ(held[i], 1) << s.name << " element " << i;
}

TEST(LayerShares, UnevenParamShardsCoverTheGlobalTensor) {
  const ModelConfig c = config(10, 5, 8, 100);  // H = 80
  const LayerShares s0 = layer_shares(c, 3, 0);
  ModelPartition part;
  ParamSpec qkv = tp_split(make_param_spec("qkv", {(10 + 2 * 5) * 8, 80}, InitKind::kNormal, 0.02f, true), part, 0,
                           1, s0.qkv_rows_per_group);
  expect_partition(qkv, 3, {{64, 80}, {64, 80}, {32, 80}});  // 2, 2, 1 groups of 32 rows
  ParamSpec proj = tp_split(make_param_spec("proj", {80, 80}, InitKind::kNormal, 0.02f, true), part, 1, 1,
                            s0.proj_cols_per_group);
  expect_partition(proj, 3, {{80, 32}, {80, 32}, {80, 16}});  // 4, 4, 2 heads of 8 columns
  // SwiGLU's fc1 [gate; up]: each half split 34, 33, 33.
  ParamSpec fc1 = tp_split(make_param_spec("fc1", {200, 80}, InitKind::kNormal, 0.02f, true), part, 0, 2);
  expect_partition(fc1, 3, {{68, 80}, {66, 80}, {66, 80}});
  fc1.split_parts = 3;
  fc1.split_rank = 1;
  EXPECT_EQ(fc1.split_block_offset(), 34);
  EXPECT_EQ(fc1.global_index(33 * 80), (100 + 34) * 80);  // rank 1's first up row is global row 134
  ParamSpec fc2 = tp_split(make_param_spec("fc2", {80, 100}, InitKind::kNormal, 0.02f, true), part, 1);
  expect_partition(fc2, 3, {{80, 34}, {80, 33}, {80, 33}});
}

}  // namespace
}  // namespace gale
