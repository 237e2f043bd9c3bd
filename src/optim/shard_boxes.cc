// Local element ranges of a parameter as boxes of its global tensor.
#include "optim/shard_boxes.h"

#include <algorithm>

#include "core/check.h"

namespace gale {

std::vector<ParamBox> local_range_boxes(const ParamSpec& spec, int64_t begin, int64_t end) {
  const Shape local = spec.local_shape();
  GALE_CHECK(local.size() == 1 || local.size() == 2) << spec.name << ": parameters are 1-D or 2-D";
  GALE_CHECK(0 <= begin && begin <= end && end <= spec.local_numel())
      << spec.name << ": range [" << begin << ", " << end << ") of " << spec.local_numel() << " elements";
  const bool two_d = local.size() == 2;
  const int64_t rows = local[0], cols = two_d ? local[1] : 1;
  const bool split = spec.split_dim >= 0 && spec.split_parts > 1;
  GALE_CHECK(!split || spec.split_dim == 0 || spec.split_blocks == 1) << spec.name;
  // Rows of the local tensor are cut into split_blocks blocks, each placed in its own global block.
  const bool row_split = split && spec.split_dim == 0;
  const int64_t blocks = row_split ? spec.split_blocks : 1;
  std::vector<ParamSpec::SplitBlock> block(static_cast<size_t>(blocks));
  if (row_split)
    for (int64_t b = 0; b < blocks; ++b) block[static_cast<size_t>(b)] = spec.split_block(b);
  else
    block[0].rows = rows;
  // Columns shift with a split of dimension 1 (over TP, or a --tp-2d column split).
  const int64_t col_shift = split && spec.split_dim == 1 ? spec.split_block_offset() : spec.split2_offset();

  std::vector<ParamBox> out;
  auto emit = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {  // local rows [r0, r1), cols [c0, c1)
    size_t b = 0;
    while (r0 < r1) {
      while (r0 >= block[b].local_start + block[b].rows) ++b;
      const ParamSpec::SplitBlock& k = block[b];
      const int64_t stop = std::min(r1, k.local_start + k.rows);
      ParamBox box;
      const int64_t global_row = k.global_start + k.offset + (r0 - k.local_start);
      box.global_offsets = two_d ? std::vector<int64_t>{global_row, c0 + col_shift} : std::vector<int64_t>{global_row};
      box.shape = two_d ? Shape{stop - r0, c1 - c0} : Shape{stop - r0};
      box.local_begin = r0 * cols + c0;
      out.push_back(std::move(box));
      r0 = stop;
    }
  };
  int64_t i = begin;
  while (i < end) {
    const int64_t r = i / cols, c = i % cols;
    if (c != 0 || end - i < cols) {  // part of one row
      const int64_t c1 = std::min(cols, c + (end - i));
      emit(r, r + 1, c, c1);
      i += c1 - c;
    } else {  // whole rows
      const int64_t n = (end - i) / cols;
      emit(r, r + n, 0, cols);
      i += n * cols;
    }
  }
  return out;
}

}  // namespace gale
