// Local element ranges of tensor-parallel parameter shards map to boxes of the global tensor that
// hold exactly those elements, for every kind of split the model uses.
#include "optim/shard_boxes.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

ParamSpec spec(Shape global, int split_dim, int blocks, int64_t parts, int64_t rank) {
  ParamSpec s;
  s.name = "w";
  s.global_shape = std::move(global);
  s.split_dim = split_dim;
  s.split_blocks = blocks;
  s.split_parts = parts;
  s.split_rank = rank;
  return s;
}

// Row-major index of `pos` in `shape`.
int64_t flat_index(const Shape& shape, const std::vector<int64_t>& pos) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + pos[d];
  return i;
}

// Checks that the boxes of [begin, end) hold exactly those local elements, in order.
void check_range(const ParamSpec& s, int64_t begin, int64_t end) {
  std::vector<ParamBox> boxes = local_range_boxes(s, begin, end);
  int64_t local = begin;
  for (const ParamBox& box : boxes) {
    ASSERT_EQ(box.local_begin, local) << s.name;
    ASSERT_EQ(box.shape.size(), s.global_shape.size());
    ASSERT_EQ(box.global_offsets.size(), s.global_shape.size());
    // Walk the box in row-major order: element k is local element local_begin + k.
    const int64_t rows = box.shape[0], cols = box.shape.size() == 2 ? box.shape[1] : 1;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        std::vector<int64_t> pos = box.global_offsets;
        pos[0] += r;
        if (pos.size() == 2) pos[1] += c;
        for (size_t d = 0; d < pos.size(); ++d) ASSERT_LT(pos[d], s.global_shape[d]);
        ASSERT_EQ(flat_index(s.global_shape, pos), s.global_index(local)) << "local element " << local;
        ++local;
      }
  }
  EXPECT_EQ(local, end) << "range [" << begin << ", " << end << ")";
}

void check_all_ranges(const ParamSpec& s) {
  const int64_t n = s.local_numel();
  for (int64_t begin = 0; begin <= n; ++begin)
    for (int64_t end = begin; end <= n; ++end) check_range(s, begin, end);
}

TEST(ShardBoxes, ReplicatedMatrixAndVector) {
  check_all_ranges(spec({5, 3}, -1, 1, 1, 0));
  check_all_ranges(spec({7}, -1, 1, 1, 0));
}

TEST(ShardBoxes, ColumnParallelRowsSplit) {
  for (int64_t r = 0; r < 3; ++r) {
    check_all_ranges(spec({6, 4}, 0, 1, 3, r));
    check_all_ranges(spec({6}, 0, 1, 3, r));
  }
}

TEST(ShardBoxes, SwigluTwoBlocksSplitSeparately) {
  for (int64_t r = 0; r < 2; ++r) {
    check_all_ranges(spec({8, 3}, 0, 2, 2, r));  // rows [gate; up], each half split across TP
    check_all_ranges(spec({8}, 0, 2, 2, r));
  }
}

TEST(ShardBoxes, RowParallelColumnsSplit) {
  for (int64_t r = 0; r < 4; ++r) check_all_ranges(spec({3, 8}, 1, 1, 4, r));
}

TEST(ShardBoxes, WholeParameterIsOneBoxPerBlock) {
  EXPECT_EQ(local_range_boxes(spec({6, 4}, -1, 1, 1, 0), 0, 24).size(), 1u);
  EXPECT_EQ(local_range_boxes(spec({6, 4}, 1, 1, 2, 1), 0, 12).size(), 1u);
  auto swiglu = local_range_boxes(spec({8, 3}, 0, 2, 2, 1), 0, 12);
  ASSERT_EQ(swiglu.size(), 2u);
  EXPECT_EQ(swiglu[0].global_offsets, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(swiglu[1].global_offsets, (std::vector<int64_t>{6, 0}));
  // A range cutting rows: partial row, whole rows, partial row.
  auto cut = local_range_boxes(spec({6, 4}, -1, 1, 1, 0), 3, 17);
  ASSERT_EQ(cut.size(), 3u);
  EXPECT_EQ(cut[0].shape, (Shape{1, 1}));
  EXPECT_EQ(cut[1].shape, (Shape{3, 4}));
  EXPECT_EQ(cut[2].shape, (Shape{1, 1}));
}

}  // namespace
}  // namespace gale
