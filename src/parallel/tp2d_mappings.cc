// --tp-2d pieces and the row/head all-to-alls (parallel/tp2d_mappings.h).
#include "parallel/tp2d_mappings.h"

#include <cstring>

#include "core/check.h"
#include "parallel/mappings.h"

namespace gale {

namespace {

// x [R, W] as n column blocks, packed block after block: [n, R, W/n].
Tensor pack_column_blocks(const Tensor& x, int64_t n) {
  const int64_t R = x.size(0), W = x.size(1), w = W / n;
  const size_t es = dtype_size(x.dtype());
  Tensor out = Tensor::empty({n * R, w}, x.dtype());
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t k = 0; k < n; ++k)
    for (int64_t r = 0; r < R; ++r) std::memcpy(dst + ((k * R + r) * w) * es, src + (r * W + k * w) * es, w * es);
  return out;
}

// Its inverse: [n, R, W/n] blocks -> [R, W].
Tensor unpack_column_blocks(const Tensor& blocks, int64_t n) {
  const int64_t R = blocks.size(0) / n, w = blocks.size(1), W = w * n;
  const size_t es = dtype_size(blocks.dtype());
  Tensor out = Tensor::empty({R, W}, blocks.dtype());
  const char* src = static_cast<const char*>(blocks.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t k = 0; k < n; ++k)
    for (int64_t r = 0; r < R; ++r) std::memcpy(dst + (r * W + k * w) * es, src + ((k * R + r) * w) * es, w * es);
  return out;
}

}  // namespace

Tensor scatter_to_2d_piece(const Tensor& full, Communicator& x, Communicator& y) {
  return scatter_to_tp_region(scatter_to_sequence_parallel_region(full, x), y).clone();
}

Tensor scatter_to_2d_piece_backward(const Tensor& d_piece, Communicator& x, Communicator& y) {
  return gather_from_2d_piece(d_piece, x, y);
}

Tensor gather_from_2d_piece(const Tensor& piece, Communicator& x, Communicator& y) {
  return gather_from_sequence_parallel_region(gather_from_tp_region(piece, y), x);
}

Tensor gather_from_2d_piece_backward(const Tensor& d_full, Communicator& x, Communicator& y) {
  return scatter_to_2d_piece(d_full, x, y);
}

Tensor rows_to_heads(const Tensor& x, Communicator& g) {
  const int64_t n = g.size();
  GALE_CHECK(x.ndim() == 2 && x.size(1) % n == 0)
      << "rows_to_heads: " << x.shape_string() << " has no " << n << " equal column blocks";
  if (n == 1) return x;
  const Tensor send = pack_column_blocks(x, n);  // block k goes to rank k
  Tensor out = Tensor::empty(send.shape(), x.dtype());  // block j: rank j's rows, this rank's columns
  g.all_to_all(send.raw(), out.raw(), x.numel() / n, x.dtype());
  return out;
}

Tensor heads_to_rows(const Tensor& x, Communicator& g) {
  const int64_t n = g.size();
  GALE_CHECK(x.ndim() == 2 && x.size(0) % n == 0)
      << "heads_to_rows: " << x.shape_string() << " has no " << n << " equal row blocks";
  if (n == 1) return x;
  Tensor blocks = Tensor::empty(x.shape(), x.dtype());  // block j: this rank's rows, rank j's columns
  g.all_to_all(x.raw(), blocks.raw(), x.numel() / n, x.dtype());
  return unpack_column_blocks(blocks, n);
}

}  // namespace gale
