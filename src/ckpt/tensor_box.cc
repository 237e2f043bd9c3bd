// Box intersection and strided region copies.
#include "ckpt/tensor_box.h"

#include <algorithm>

namespace gale {

Box whole_box(const Shape& shape) { return Box{std::vector<int64_t>(shape.size(), 0), shape}; }

std::string box_string(const Box& box) {
  std::string s = "[";
  for (size_t d = 0; d < box.shape.size(); ++d)
    s += str_cat(d ? ", " : "", box.offsets[d], ":", box.offsets[d] + box.shape[d]);
  return s + "]";
}

std::optional<Box> intersect_boxes(const Box& a, const Box& b) {
  GALE_CHECK_EQ(a.shape.size(), b.shape.size());
  Box out;
  for (size_t d = 0; d < a.shape.size(); ++d) {
    int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    int64_t hi = std::min(a.offsets[d] + a.shape[d], b.offsets[d] + b.shape[d]);
    if (hi <= lo) return std::nullopt;
    out.offsets.push_back(lo);
    out.shape.push_back(hi - lo);
  }
  return out;
}

bool box_contains(const Box& outer, const Box& inner) {
  if (outer.shape.size() != inner.shape.size()) return false;
  for (size_t d = 0; d < outer.shape.size(); ++d)
    if (inner.offsets[d] < outer.offsets[d] || inner.offsets[d] + inner.shape[d] > outer.offsets[d] + outer.shape[d])
      return false;
  return true;
}

Status copy_box_region(const void* src, StDType src_dtype, const Box& src_box, void* dst, DType dst_dtype,
                       const Box& dst_box, const Box& region, std::string_view what) {
  GALE_CHECK(box_contains(src_box, region) && box_contains(dst_box, region))
      << box_string(region) << " not inside " << box_string(src_box) << " and " << box_string(dst_box);
  const int nd = static_cast<int>(region.shape.size());
  if (region.numel() == 0) return Status::Ok();
  // Trailing dimensions that all three boxes span completely merge into one contiguous run.
  int split = nd;  // dims [split, nd) are contiguous in both arrays
  int64_t run = 1;
  while (split > 0) {
    int d = split - 1;
    run *= region.shape[d];
    --split;
    if (region.shape[d] != src_box.shape[d] || region.shape[d] != dst_box.shape[d]) break;
  }
  // Row-major strides (in elements) of both arrays.
  std::vector<int64_t> src_stride(nd, 1), dst_stride(nd, 1);
  for (int d = nd - 2; d >= 0; --d) {
    src_stride[d] = src_stride[d + 1] * src_box.shape[d + 1];
    dst_stride[d] = dst_stride[d + 1] * dst_box.shape[d + 1];
  }
  const int64_t src_size = st_dtype_size(src_dtype);
  const int64_t dst_size = dtype_size(dst_dtype);
  std::vector<int64_t> index(std::max(split, 0), 0);  // position within region over dims [0, split)
  while (true) {
    int64_t src_off = 0, dst_off = 0;
    for (int d = 0; d < nd; ++d) {
      int64_t g = region.offsets[d] + (d < split ? index[d] : 0);
      src_off += (g - src_box.offsets[d]) * src_stride[d];
      dst_off += (g - dst_box.offsets[d]) * dst_stride[d];
    }
    GALE_RETURN_IF_ERROR(convert_elements(src_dtype, static_cast<const char*>(src) + src_off * src_size, dst_dtype,
                                          static_cast<char*>(dst) + dst_off * dst_size, run, what));
    int d = split - 1;
    while (d >= 0 && ++index[d] == region.shape[d]) index[d--] = 0;
    if (d < 0) break;
  }
  return Status::Ok();
}

}  // namespace gale
