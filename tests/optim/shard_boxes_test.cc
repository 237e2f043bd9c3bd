// Local element ranges of tensor-parallel parameter shards map to boxes of the global tensor that
// hold exactly those elements, for every kind of split the model uses (--tp-2d's 2-D blocks too).
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

// The Mamba mixer's in_proj: unequal blocks z|x|B|C|dt (ParamSpec::split_block_extents) of 4, 4,
// 2, 2 and 6 rows, each split on its own: rank 1 of 2 holds rows 2, 3 | 6, 7 | 9 | 11 | 15..17.
TEST(ShardBoxes, UnequalBlocksSplitEachOnItsOwn) {
  for (int64_t r = 0; r < 2; ++r) {
    ParamSpec s = spec({18, 3}, 0, 5, 2, r);
    s.split_block_extents = {4, 4, 2, 2, 6};
    check_all_ranges(s);
    ParamSpec v = spec({18}, 0, 5, 2, r);
    v.split_block_extents = {4, 4, 2, 2, 6};
    check_all_ranges(v);
  }
  ParamSpec s = spec({18}, 0, 5, 2, 1);
  s.split_block_extents = {4, 4, 2, 2, 6};
  EXPECT_EQ(s.local_shape(), (Shape{9}));
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < 9; ++i) rows.push_back(s.global_index(i));
  EXPECT_EQ(rows, (std::vector<int64_t>{2, 3, 6, 7, 9, 11, 15, 16, 17}));
  EXPECT_EQ(local_range_boxes(s, 0, 9).size(), 5u);
  const ParamSpec::SplitBlock dt = s.split_block(4);
  EXPECT_EQ(dt.global_start, 12);
  EXPECT_EQ(dt.local_start, 6);
  EXPECT_EQ(dt.rows, 3);
  EXPECT_EQ(dt.offset, 3);
}

TEST(ShardBoxes, RowParallelColumnsSplit) {
  for (int64_t r = 0; r < 4; ++r) check_all_ranges(spec({3, 8}, 1, 1, 4, r));
}

// --tp-2d weight blocks: rows split along dimension 0 over one axis (SwiGLU: each half), columns
// evenly over the other (ParamSpec::split2_*).
ParamSpec block_2d(Shape global, int blocks, int64_t row_parts, int64_t row_rank, int64_t col_parts,
                   int64_t col_rank) {
  ParamSpec s = spec(std::move(global), 0, blocks, row_parts, row_rank);
  s.split2_parts = col_parts;
  s.split2_rank = col_rank;
  return s;
}

TEST(ShardBoxes, Tp2dBlocksSplitRowsAndColumns) {
  for (int64_t rr = 0; rr < 2; ++rr)
    for (int64_t cr = 0; cr < 2; ++cr) {
      check_all_ranges(block_2d({6, 4}, 1, 2, rr, 2, cr));
      check_all_ranges(block_2d({8, 4}, 2, 2, rr, 2, cr));
    }
  check_all_ranges(block_2d({6, 4}, 1, 1, 0, 2, 1));  // X = 1: the columns only
  // The elements themselves: [8, 4] SwiGLU, row rank 1 of 2, column rank 0 of 2 holds rows 2, 3, 6,
  // 7 and columns 0, 1; [6, 4], row rank 1, column rank 1 holds rows 3..5, columns 2, 3.
  const ParamSpec swiglu = block_2d({8, 4}, 2, 2, 1, 2, 0);
  EXPECT_EQ(swiglu.local_shape(), (Shape{4, 2}));
  EXPECT_EQ(swiglu.global_index(0), 2 * 4 + 0);
  EXPECT_EQ(swiglu.global_index(3), 3 * 4 + 1);
  EXPECT_EQ(swiglu.global_index(5), 6 * 4 + 1);
  const ParamSpec plain = block_2d({6, 4}, 1, 2, 1, 2, 1);
  EXPECT_EQ(plain.local_shape(), (Shape{3, 2}));
  EXPECT_EQ(plain.global_index(0), 3 * 4 + 2);
  EXPECT_EQ(plain.global_index(5), 5 * 4 + 3);
  const std::vector<ParamBox> whole = local_range_boxes(plain, 0, 6);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].global_offsets, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(whole[0].shape, (Shape{3, 2}));
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
