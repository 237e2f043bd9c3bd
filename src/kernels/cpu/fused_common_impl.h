// Building blocks shared by the ISA-generic fused kernels (templates over a simd type V).
//
// Included only by the per-ISA instantiation files; see the ISA-file rule in kernels/cpu/isa.h.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/threads.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/simd_math.h"

namespace gale::fused {

// Rows are reduced in this many fixed chunks (as the reference kernels do), so column sums do not
// depend on the thread count.
constexpr int64_t kReduceChunks = 32;

#define GALE_ALWAYS_INLINE __attribute__((always_inline))

namespace {  // internal linkage: each ISA file keeps its own copy (isa.h); no std:: float overloads
inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
inline double sqrt_f64(double x) { return __builtin_sqrt(x); }
inline double log_f64(double x) { return __builtin_log(x); }
inline double exp_f64(double x) { return __builtin_exp(x); }
}  // namespace

// Full vector when n >= W, else the first n lanes (zero-filled / partially stored).
template <class V>
GALE_ALWAYS_INLINE inline typename V::F ld(const float* p, int64_t n) {
  return n >= V::W ? V::load(p) : V::load_n(p, n);
}
template <class V>
GALE_ALWAYS_INLINE inline void st(float* p, typename V::F v, int64_t n) {
  if (n >= V::W)
    V::store(p, v);
  else
    V::store_n(p, v, n);
}

// body(i, n) for i = begin, begin + W, ... < end with n = min(W, end − i): full vectors with the
// constant n = W (the compiler folds ld/st), then one partial tail.
template <class V, class Body>
GALE_ALWAYS_INLINE inline void for_vectors_in(int64_t begin, int64_t end, Body&& body) {
  int64_t i = begin;
  for (; i + V::W <= end; i += V::W) body(i, int64_t{V::W});
  if (i < end) body(i, end - i);
}
template <class V, class Body>
GALE_ALWAYS_INLINE inline void for_vectors(int64_t len, Body&& body) {
  for_vectors_in<V>(0, len, body);
}

// dst[i] += src[i]
template <class V>
void add_into(float* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) V::store(dst + i, V::add(V::load(dst + i), V::load(src + i)));
  if (i < n) V::store_n(dst + i, V::add(V::load_n(dst + i, n - i), V::load_n(src + i, n - i)), n - i);
}

// Long sums are taken in float vectors within blocks of kSumBlock elements and in double across
// blocks, so their error does not grow with the row length (the references sum in double).
constexpr int64_t kSumBlock = 256;

// Σ_i term(i, n) over the vectors of [0, len) (term returns a vector; tail lanes must be 0).
template <class V, class Term>
GALE_ALWAYS_INLINE inline double blocked_sum(int64_t len, Term&& term) {
  double total = 0.0;
  for (int64_t b = 0; b < len; b += kSumBlock) {
    typename V::F acc = V::zero();
    for_vectors_in<V>(b, min_i64(len, b + kSumBlock),
                      [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE { acc = V::add(acc, term(i, n)); });
    total += V::reduce_add(acc);
  }
  return total;
}

template <class V>
double sum_of(const float* x, int64_t n) {
  return blocked_sum<V>(n, [&](int64_t i, int64_t k) GALE_ALWAYS_INLINE { return ld<V>(x + i, k); });
}

// Runs row_fn(r, acc) for every row, where acc points at `num_acc` zeroed [cols] accumulators
// (acc[k·cols + i]) private to the row's fixed chunk; afterwards outs[k][i] += Σ_chunks acc_k[i]
// in chunk order (outs[k] may be null: that accumulator is dropped). With no output at all the
// rows simply run in parallel with acc = nullptr.
template <class V, class RowFn>
void rows_with_column_sums(int64_t rows, int64_t cols, int num_acc, float* const* outs, RowFn&& row_fn) {
  bool any_out = false;
  for (int k = 0; k < num_acc; ++k) any_out = any_out || outs[k] != nullptr;
  if (!any_out) {
    parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) row_fn(r, static_cast<float*>(nullptr));
    });
    return;
  }
  const int64_t chunks = min_i64(kReduceChunks, rows);
  if (chunks <= 0) return;
  const int64_t per_chunk = num_acc * cols;
  ScratchBuffer partial(sizeof(float) * static_cast<size_t>(chunks * per_chunk));
  float* part = partial.floats();
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* acc = part + c * per_chunk;
      std::memset(acc, 0, sizeof(float) * static_cast<size_t>(per_chunk));
      for (int64_t r = rows * c / chunks; r < rows * (c + 1) / chunks; ++r) row_fn(r, acc);
    }
  });
  // Fold the chunks in order, parallel over columns.
  for (int k = 0; k < num_acc; ++k) {
    if (outs[k] == nullptr) continue;
    float* out = outs[k];
    parallel_for(cols, 1024, [&](int64_t i0, int64_t i1) {
      for (int64_t c = 0; c < chunks; ++c) add_into<V>(out + i0, part + c * per_chunk + k * cols + i0, i1 - i0);
    });
  }
}

// The row loops of a gated unit (SwiGLU, GLU, GeGLU): u is [rows, 2F], gate g = u[:, :F], linear half
// p = u[:, F:]. Forward: the bias [2F] (optional) is added to u in place, then act = f(g, p).
template <class V, class Act>
void gated_unit_forward(float* u, const float* bias, float* act, int64_t rows, int64_t F, Act&& f) {
  using Fv = typename V::F;
  parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* gate = u + r * 2 * F;
      float* lin = gate + F;
      float* ar = act + r * F;
      for_vectors<V>(F, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
        Fv g = ld<V>(gate + i, n), p = ld<V>(lin + i, n);
        if (bias) {
          g = V::add(g, ld<V>(bias + i, n));
          p = V::add(p, ld<V>(bias + F + i, n));
          st<V>(gate + i, g, n);
          st<V>(lin + i, p, n);
        }
        st<V>(ar + i, f(g, p), n);
      });
    }
  });
}

// Backward: grad(g, p, dact, &dg, &dp) for every element into du [rows, 2F] (dg in the gate half, dp
// in the linear half); dbias (optional) += column sums of du over fixed row chunks.
template <class V, class Grad>
void gated_unit_backward(const float* dact, const float* u, float* du, float* dbias, int64_t rows, int64_t F,
                         Grad&& grad) {
  using Fv = typename V::F;
  float* outs[1] = {dbias};
  rows_with_column_sums<V>(rows, 2 * F, 1, outs, [&](int64_t r, float* acc) {
    const float* gate = u + r * 2 * F;
    const float* lin = gate + F;
    const float* dr = dact + r * F;
    float* dgate = du + r * 2 * F;
    float* dlin = dgate + F;
    for_vectors<V>(F, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
      Fv dg, dp;
      grad(ld<V>(gate + i, n), ld<V>(lin + i, n), ld<V>(dr + i, n), &dg, &dp);
      st<V>(dgate + i, dg, n);
      st<V>(dlin + i, dp, n);
      if (acc) {
        st<V>(acc + i, V::add(ld<V>(acc + i, n), dg), n);
        st<V>(acc + F + i, V::add(ld<V>(acc + F + i, n), dp), n);
      }
    });
  });
}

}  // namespace gale::fused
