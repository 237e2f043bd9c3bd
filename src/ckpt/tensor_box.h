// Hyper-rectangles ("boxes") inside n-d tensors, and copying where two of them overlap.
//
// A checkpoint piece is a box of a global tensor: a TP shard of a [V, H] embedding on rank 1 of 2
// is the box {offsets [V/2, 0], shape [V/2, H]}. Loading at another layout asks for another box and
// assembles it from the intersections with the saved pieces.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/safetensors_dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace gale {

struct Box {
  std::vector<int64_t> offsets;  // first index in each dimension
  Shape shape;                   // extent in each dimension
  int64_t numel() const { return shape_numel(shape); }
  bool operator==(const Box&) const = default;
};

// The whole of a tensor of shape `shape`.
Box whole_box(const Shape& shape);
// "[0:32, 64:128]" (half-open ranges per dimension).
std::string box_string(const Box& box);
// The overlap of two boxes of the same rank, or nullopt when it is empty.
std::optional<Box> intersect_boxes(const Box& a, const Box& b);
// True when `inner` lies entirely inside `outer`.
bool box_contains(const Box& outer, const Box& inner);

// Copies `region` (global coordinates; inside both src_box and dst_box) from `src`, a row-major
// array of `src_dtype` laid out as src_box, into `dst`, a row-major Gale-dtype array laid out as
// dst_box, converting elements (convert_elements; `what` names the tensor in errors).
Status copy_box_region(const void* src, StDType src_dtype, const Box& src_box, void* dst, DType dst_dtype,
                       const Box& dst_box, const Box& region, std::string_view what);

}  // namespace gale
