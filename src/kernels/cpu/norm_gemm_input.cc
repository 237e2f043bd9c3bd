// LayerNorm / RMSNorm written straight in the GEMM input type: one pass per row.
#include "kernels/cpu/norm_gemm_input.h"

#include <cmath>

#include "core/check.h"
#include "core/threads.h"

namespace gale {

namespace {

template <class T>
inline T store(float v);
template <>
inline float store<float>(float v) {
  return v;
}
template <>
inline bf16 store<bf16>(float v) {
  return float_to_bf16(v);
}
template <>
inline f16 store<f16>(float v) {
  return float_to_f16(v);
}

template <class T>
void norm_rows(const NormSpec& spec, const float* x, const float* w, const float* b, T* y, float* stats, int64_t rows,
               int64_t H) {
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * H;
      T* yr = y + r * H;
      if (spec.rms) {  // rmsnorm_forward_ref's arithmetic
        double ss = 0.0;
        for (int64_t i = 0; i < H; ++i) ss += static_cast<double>(xr[i]) * xr[i];
        const float rs = static_cast<float>(1.0 / std::sqrt(ss / H + spec.eps));
        for (int64_t i = 0; i < H; ++i) yr[i] = store<T>(xr[i] * rs * w[i]);
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
        for (int64_t i = 0; i < H; ++i) yr[i] = store<T>((xr[i] - m) * rs * w[i] + (b ? b[i] : 0.0f));
        stats[r] = m;
        stats[rows + r] = rs;
      }
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
