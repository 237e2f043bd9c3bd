// Fused row kernels around the residual stream (templates over a simd type V): LayerNorm/RMSNorm
// forward and backward in one pass over each row, residual + bias + dropout, and residual + bias +
// dropout + norm. Semantics are the OpTable entries' (kernels/op_table.h).
#pragma once

#include "kernels/cpu/fused_common_impl.h"
#include "kernels/op_table.h"

namespace gale::fused {

// y = Norm(x) for one row; writes the row's statistics. x may be a row the caller just wrote.
template <class V>
void norm_row(const NormSpec& s, const float* x, const float* w, const float* b, float* y, int64_t H, float* mean,
              float* rstd) {
  using F = typename V::F;
  if (s.rms) {
    const double ss = blocked_sum<V>(H, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
      const F xv = ld<V>(x + i, n);
      return V::mul(xv, xv);
    });
    const float rs = static_cast<float>(1.0 / sqrt_f64(ss / H + s.eps));
    const F vr = V::set1(rs);
    for_vectors<V>(H, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
      st<V>(y + i, V::mul(V::mul(ld<V>(x + i, n), vr), ld<V>(w + i, n)), n);
    });
    *rstd = rs;
    return;
  }
  const float m = static_cast<float>(sum_of<V>(x, H) / H);
  const F vm = V::set1(m);
  const double var = blocked_sum<V>(H, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
    // Tail lanes load 0 and would add m²: mask them out.
    const F d = V::select(V::first(n), V::sub(ld<V>(x + i, n), vm), V::zero());
    return V::mul(d, d);
  });
  const float rs = static_cast<float>(1.0 / sqrt_f64(var / H + s.eps));
  const F vr = V::set1(rs);
  for_vectors<V>(H, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
    const F xhat = V::mul(V::sub(ld<V>(x + i, n), vm), vr);
    const F bias = b ? ld<V>(b + i, n) : V::zero();
    st<V>(y + i, V::fmadd(xhat, ld<V>(w + i, n), bias), n);
  });
  *mean = m;
  *rstd = rs;
}

template <class V>
void norm_forward(const NormSpec& s, const float* x, const float* w, const float* b, float* y, float* stats,
                  int64_t rows, int64_t H) {
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float mean = 0.0f, rstd = 0.0f;
      norm_row<V>(s, x + r * H, w, b, y + r * H, H, &mean, &rstd);
      if (s.rms) {
        stats[r] = rstd;
      } else {
        stats[r] = mean;
        stats[rows + r] = rstd;
      }
    }
  });
}

// dx for one row; dw_acc += dy·xhat and db_acc += dy when given (same pass).
template <class V>
void norm_backward_row(const NormSpec& s, const float* dy, const float* x, const float* w, float mean, float rs,
                       float* dx, float* dw_acc, float* db_acc, int64_t H) {
  using F = typename V::F;
  const F vm = V::set1(s.rms ? 0.0f : mean), vr = V::set1(rs);
  double sum_g = 0.0, sum_gx = 0.0;  // Σ dy·w, Σ dy·w·xhat (blocked as blocked_sum)
  for (int64_t b = 0; b < H; b += kSumBlock) {
    F g_acc = V::zero(), gx_acc = V::zero();
    for_vectors_in<V>(b, min_i64(H, b + kSumBlock), [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
      const F d = ld<V>(dy + i, n);
      const F xhat = V::mul(V::sub(ld<V>(x + i, n), vm), vr);  // tail lanes: d = 0, so they add nothing
      const F g = V::mul(d, ld<V>(w + i, n));
      g_acc = V::add(g_acc, g);
      gx_acc = V::fmadd(g, xhat, gx_acc);
      if (dw_acc) st<V>(dw_acc + i, V::fmadd(d, xhat, ld<V>(dw_acc + i, n)), n);
      if (db_acc) st<V>(db_acc + i, V::add(d, ld<V>(db_acc + i, n)), n);
    });
    sum_g += V::reduce_add(g_acc);
    sum_gx += V::reduce_add(gx_acc);
  }
  const F mean_gx = V::set1(static_cast<float>(sum_gx / H));
  const F mean_g = V::set1(s.rms ? 0.0f : static_cast<float>(sum_g / H));
  for_vectors<V>(H, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
    const F xhat = V::mul(V::sub(ld<V>(x + i, n), vm), vr);
    const F g = V::mul(ld<V>(dy + i, n), ld<V>(w + i, n));
    st<V>(dx + i, V::mul(vr, V::fnmadd(xhat, mean_gx, V::sub(g, mean_g))), n);
  });
}

template <class V>
void norm_backward(const NormSpec& s, const float* dy, const float* x, const float* w, const float* stats, float* dx,
                   float* dw, float* db, int64_t rows, int64_t H) {
  float* outs[2] = {dw, s.rms ? nullptr : db};
  rows_with_column_sums<V>(rows, H, 2, outs, [&](int64_t r, float* acc) {
    const float mean = s.rms ? 0.0f : stats[r];
    const float rs = s.rms ? stats[r] : stats[rows + r];
    float* dw_acc = acc && dw ? acc : nullptr;
    float* db_acc = acc && outs[1] ? acc + H : nullptr;
    norm_backward_row<V>(s, dy + r * H, x + r * H, w, mean, rs, dx + r * H, dw_acc, db_acc, H);
  });
}

// out = residual + dropout(x + bias) for one row.
template <class V>
void bias_dropout_add_row(const float* x, const float* bias, const float* residual, float* out, int64_t cols,
                          const simd::PhiloxDropout<V>& dropout, bool drop, uint64_t index_base) {
  using F = typename V::F;
  const F scale = V::set1(drop ? dropout.keep_scale() : 1.0f);
  simd::PhiloxDropoutRow<V> keep(dropout, index_base);
  for_vectors<V>(cols, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
    F t = ld<V>(x + i, n);
    if (bias) t = V::add(t, ld<V>(bias + i, n));
    if (drop) t = V::select(keep.next(), V::mul(t, scale), V::zero());
    st<V>(out + i, V::add(ld<V>(residual + i, n), t), n);
  });
}

namespace {
// Index of element (r, 0) in the dropout counter space (kernels/cpu/dropout.h).
inline uint64_t dropout_row_base(const DropoutSpec& d, int64_t r) {
  return static_cast<uint64_t>(d.row_ids[r]) * static_cast<uint64_t>(d.cols_total) +
         static_cast<uint64_t>(d.col_offset);
}
}  // namespace

template <class V>
void bias_dropout_add(const float* x, const float* bias, const float* residual, float* out, int64_t rows, int64_t cols,
                      const DropoutSpec& spec) {
  const simd::PhiloxDropout<V> dropout(spec.seed, spec.stream, spec.p);
  const bool drop = spec.p > 0.0f;
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      bias_dropout_add_row<V>(x + r * cols, bias, residual + r * cols, out + r * cols, cols, dropout, drop,
                              drop ? dropout_row_base(spec, r) : 0);
  });
}

template <class V>
void bias_dropout_add_backward(const float* dout, float* dx, float* dbias, int64_t rows, int64_t cols,
                               const DropoutSpec& spec) {
  using F = typename V::F;
  const simd::PhiloxDropout<V> dropout(spec.seed, spec.stream, spec.p);
  const bool drop = spec.p > 0.0f;
  const F scale = V::set1(drop ? dropout.keep_scale() : 1.0f);
  float* outs[1] = {dbias};
  rows_with_column_sums<V>(rows, cols, 1, outs, [&](int64_t r, float* acc) {
    const float* src = dout + r * cols;
    float* dst = dx + r * cols;
    simd::PhiloxDropoutRow<V> keep(dropout, drop ? dropout_row_base(spec, r) : 0);
    for_vectors<V>(cols, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
      F t = ld<V>(src + i, n);
      if (drop) t = V::select(keep.next(), V::mul(t, scale), V::zero());
      st<V>(dst + i, t, n);
      if (acc) st<V>(acc + i, V::add(ld<V>(acc + i, n), t), n);
    });
  });
}

// Plain dropout (OpTable::dropout): the backward above without a bias gradient, which is exactly
// y = dropout(x) with the reference's masks; y may alias x (each element is read before written).
template <class V>
void dropout(const float* x, float* y, int64_t rows, int64_t cols, const DropoutSpec& spec) {
  bias_dropout_add_backward<V>(x, y, nullptr, rows, cols, spec);
}

template <class V>
void bias_dropout_add_norm(const float* x, const float* bias, const float* residual, float* out, const NormSpec& norm,
                           const float* w, const float* b, float* y, float* stats, int64_t rows, int64_t cols,
                           const DropoutSpec& spec) {
  const simd::PhiloxDropout<V> dropout(spec.seed, spec.stream, spec.p);
  const bool drop = spec.p > 0.0f;
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* o = out + r * cols;
      bias_dropout_add_row<V>(x + r * cols, bias, residual + r * cols, o, cols, dropout, drop,
                              drop ? dropout_row_base(spec, r) : 0);
      float mean = 0.0f, rstd = 0.0f;
      norm_row<V>(norm, o, w, b, y + r * cols, cols, &mean, &rstd);
      if (norm.rms) {
        stats[r] = rstd;
      } else {
        stats[r] = mean;
        stats[rows + r] = rstd;
      }
    }
  });
}

}  // namespace gale::fused
