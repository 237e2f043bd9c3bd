// Reference dropout (forward and backward share the mask function).
#include "kernels/cpu/dropout.h"

#include "core/rng.h"
#include "core/threads.h"

namespace gale {

namespace {
void apply(const float* x, float* y, int64_t rows, int64_t cols, const DropoutSpec& s) {
  const float scale = 1.0f / (1.0f - s.p);
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      uint64_t base = static_cast<uint64_t>(s.row_ids[r]) * s.cols_total + s.col_offset;
      for (int64_t c = 0; c < cols; ++c) {
        bool keep = dropout_uniform_at(s.seed, s.stream, base + c) >= s.p;
        y[r * cols + c] = keep ? x[r * cols + c] * scale : 0.0f;
      }
    }
  });
}
}  // namespace

void dropout_forward_ref(const float* x, float* y, int64_t rows, int64_t cols, const DropoutSpec& spec) {
  apply(x, y, rows, cols, spec);
}

void dropout_backward_ref(const float* dy, float* dx, int64_t rows, int64_t cols, const DropoutSpec& spec) {
  apply(dy, dx, rows, cols, spec);
}

}  // namespace gale
