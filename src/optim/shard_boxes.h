// Where a range of a parameter's local elements lies in its global (unsharded) tensor, as boxes.
//
// The distributed optimizer owns arbitrary flat ranges of a chunk's buffer, so a rank's piece of
// a parameter is a range [begin, end) of the row-major elements of its local tensor-parallel
// shard. Checkpoints store every tensor by its global name and shape as boxes (ckpt/), so that
// they reshard across layouts; this splits such a range into boxes of the global tensor: a partial
// first row, a block of whole rows, a partial last row — each block further split where the
// tensor-parallel layout cuts the rows (split_blocks) or shifts the columns (split_dim 1). Each
// box's elements are contiguous in the local tensor, starting at `local_begin`.
#pragma once

#include <cstdint>
#include <vector>

#include "model/params.h"

namespace gale {

struct ParamBox {
  std::vector<int64_t> global_offsets;  // the box's first element in the global tensor
  Shape shape;                          // the box's shape (same rank as the parameter)
  int64_t local_begin = 0;              // its first element in the local tensor (row-major)
};

// The boxes covering local elements [begin, end) of parameter `spec` (1-D or 2-D), in local order.
// Their sizes add up to end − begin; local element i maps to spec.global_index(i).
std::vector<ParamBox> local_range_boxes(const ParamSpec& spec, int64_t begin, int64_t end);

}  // namespace gale
