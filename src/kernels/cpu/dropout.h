// Dropout with counter-based masks (core/rng.h): reference kernels.
//
// Element (r, c) of a [rows, cols] matrix is kept when
//   dropout_uniform_at(seed, stream, row_ids[r]·cols_total + col_offset + c) >= p
// and scaled by 1/(1 − p). dropout_uniform_at (core/rng.h) draws index i from word i & 3 of the
// Philox block at counter i >> 2, so the fused kernels get 4 consecutive decisions per block; the
// reference calls it once per element. row_ids gives each row's global id (e.g. sample·S + position), so the
// mask of an element does not depend on how rows and columns are split across ranks, and the
// backward redraws the same mask instead of storing it.
#pragma once

#include <cstdint>

namespace gale {

struct DropoutSpec {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t stream = 0;
  const int64_t* row_ids = nullptr;  // [rows]
  int64_t cols_total = 0;            // width of the full (unsplit) matrix
  int64_t col_offset = 0;            // first column of this slice
};

// y = dropout(x); y may alias x.
void dropout_forward_ref(const float* x, float* y, int64_t rows, int64_t cols, const DropoutSpec& spec);
// dx = dy·mask/(1 − p); dx may alias dy.
void dropout_backward_ref(const float* dy, float* dx, int64_t rows, int64_t cols, const DropoutSpec& spec);

}  // namespace gale
