// LayerNorm / RMSNorm written straight in the GEMM input type: one pass per row.
#include "kernels/cpu/norm_gemm_input.h"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"

namespace gale {

namespace {

// One row's normalised values (f32) into the GEMM input type: the vectorised converters of
// kernels/cpu/gemm.h (round to nearest even, as to_gemm_input).
inline void store_row(const float* v, float* y, int64_t n) { std::memcpy(y, v, static_cast<size_t>(n) * sizeof(float)); }
inline void store_row(const float* v, bf16* y, int64_t n) { convert_f32_to_bf16(v, y, n); }
inline void store_row(const float* v, f16* y, int64_t n) { convert_f32_to_f16(v, y, n); }

template <class T>
void norm_rows(const NormSpec& spec, const float* x, const float* w, const float* b, T* y, float* stats, int64_t rows,
               int64_t H) {
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(std::is_same_v<T, float> ? 0 : static_cast<size_t>(H));  // the row before rounding
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * H;
      T* yr = y + r * H;
      float* row = std::is_same_v<T, float> ? reinterpret_cast<float*>(yr) : buf.data();
      if (spec.rms) {  // rmsnorm_forward_ref's arithmetic
        double ss = 0.0;
        for (int64_t i = 0; i < H; ++i) ss += static_cast<double>(xr[i]) * xr[i];
        const float rs = static_cast<float>(1.0 / std::sqrt(ss / H + spec.eps));
        for (int64_t i = 0; i < H; ++i) row[i] = xr[i] * rs * w[i];
        stats[r] = rs;
      } else {  // layernorm_forward_ref's arithmetic
        double sum = 0.0;
        for (int64_t i = 0; i < H; ++i) sum += xr[i];
        const double mu = sum / H;
        double var = 0.0;
        for (int64_t i = 0; i < H; ++i) var += (xr[i] - mu) * (xr[i] - mu);
        var /= H;
        const float rs = static_cast<float>(1.0 / std::sqrt(var + spec.eps));
        const float m = static_cast<float>(mu);
        for (int64_t i = 0; i < H; ++i) row[i] = (xr[i] - m) * rs * w[i] + (b ? b[i] : 0.0f);
        stats[r] = m;
        stats[rows + r] = rs;
      }
      if constexpr (!std::is_same_v<T, float>) store_row(row, yr, H);  // rounded while the row is in L1
    }
  });
}

}  // namespace

void norm_to_gemm_input(const NormSpec& spec, const float* x, const float* w, const float* b, void* y, DType y_dtype,
                        float* stats, int64_t rows, int64_t H) {
  switch (y_dtype) {
    case DType::kF32:
      return norm_rows(spec, x, w, b, static_cast<float*>(y), stats, rows, H);
    case DType::kBF16:
      return norm_rows(spec, x, w, b, static_cast<bf16*>(y), stats, rows, H);
    case DType::kF16:
      return norm_rows(spec, x, w, b, static_cast<f16*>(y), stats, rows, H);
    default:
      GALE_CHECK(false) << "norm_to_gemm_input: a " << dtype_name(y_dtype) << " output (expected f32, bf16 or f16)";
  }
}

}  // namespace gale
