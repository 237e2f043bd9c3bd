// Vectorised rotary position embedding (templates over a simd type V), in place on heads read
// through a HeadLayout; the same arithmetic as the reference (kernels/cpu/rope.h), so the results
// are bit-identical to it. Rotate-half layout only: interleaved tables (--rotary-interleaved) are
// handed to the reference kernel (and the use-fused-rotary-pos-emb feature reports itself inactive).
#pragma once

#include "core/check.h"
#include "kernels/cpu/fused_common_impl.h"
#include "kernels/cpu/rope.h"

namespace gale::fused {

template <class V>
void rope_apply(float* x, const HeadLayout& layout, int64_t heads, int64_t S, int64_t B, int64_t HD,
                const int32_t* position_ids, const RopeTables& tables, float sin_sign) {
  using F = typename V::F;
  const int64_t half = tables.rot_dim / 2;
  GALE_CHECK_LE(tables.rot_dim, HD);
  if (tables.interleaved) {
    return sin_sign > 0.0f ? rope_forward_ref(x, layout, heads, S, B, HD, position_ids, tables)
                           : rope_backward_ref(x, layout, heads, S, B, HD, position_ids, tables);
  }
  const float* cos_table = tables.cos.data();
  const float* sin_table = tables.sin.data();
  const F sign = V::set1(sin_sign);
  parallel_for(S * B, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = t / B, b = t % B;
      const int64_t pos = position_ids[b * S + s];
      GALE_CHECK(pos >= 0 && pos < tables.max_positions)
          << "position " << pos << " outside the RoPE table of " << tables.max_positions;
      const float* c = cos_table + pos * half;
      const float* sn = sin_table + pos * half;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + layout.offset(t, h);
        for_vectors<V>(half, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE {
          const F x1 = ld<V>(v + i, n), x2 = ld<V>(v + half + i, n);
          const F cv = ld<V>(c + i, n), sv = V::mul(sign, ld<V>(sn + i, n));
          st<V>(v + i, V::sub(V::mul(x1, cv), V::mul(x2, sv)), n);
          st<V>(v + half + i, V::add(V::mul(x2, cv), V::mul(x1, sv)), n);
        });
      }
    }
  });
}

template <class V>
void rope_forward(float* x, const HeadLayout& layout, int64_t heads, int64_t S, int64_t B, int64_t HD,
                  const int32_t* position_ids, const RopeTables& tables) {
  rope_apply<V>(x, layout, heads, S, B, HD, position_ids, tables, 1.0f);
}

template <class V>
void rope_backward(float* dx, const HeadLayout& layout, int64_t heads, int64_t S, int64_t B, int64_t HD,
                   const int32_t* position_ids, const RopeTables& tables) {
  rope_apply<V>(dx, layout, heads, S, B, HD, position_ids, tables, -1.0f);
}

}  // namespace gale::fused
