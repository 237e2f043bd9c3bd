// Fills a FusedKernelSet with the row/elementwise kernels of one simd type V (norms, residual +
// dropout, activations, RoPE, embedding, AdamW) and the vector-math test hooks.
#pragma once

#include "kernels/cpu/fused_activation_impl.h"
#include "kernels/cpu/fused_embedding_adamw_impl.h"
#include "kernels/cpu/fused_kernel_set.h"
#include "kernels/cpu/fused_norm_impl.h"
#include "kernels/cpu/fused_rope_impl.h"

namespace gale::fused {

template <class V>
void exp_array(const float* x, float* y, int64_t n) {
  for_vectors<V>(n, [&](int64_t i, int64_t k) { st<V>(y + i, simd::exp<V>(ld<V>(x + i, k)), k); });
}

template <class V>
void erf_array(const float* x, float* y, int64_t n) {
  for_vectors<V>(n, [&](int64_t i, int64_t k) { st<V>(y + i, simd::erf<V>(ld<V>(x + i, k)), k); });
}

template <class V>
void dropout_keep_array(uint64_t seed, uint64_t stream, float p, uint64_t base, int64_t n, uint8_t* keep) {
  const simd::PhiloxDropout<V> dropout(seed, stream, p);
  simd::PhiloxDropoutRow<V> row(dropout, base);
  for_vectors<V>(n, [&](int64_t i, int64_t k) {
    const uint32_t bits = V::mask_bits(row.next());
    for (int64_t l = 0; l < k; ++l) keep[i + l] = (bits >> l) & 1u;
  });
}

template <class V>
void dropout_keep_lanes(uint64_t seed, uint64_t stream, float p, const uint64_t* bases, int64_t lanes,
                        const int32_t* offsets, int64_t n, uint8_t* keep) {
  const simd::PhiloxDropout<V> dropout(seed, stream, p);
  bool consecutive = true;
  for (int64_t j = 1; j < n; ++j) consecutive = consecutive && offsets[j] == offsets[0] + j;
  for_vectors<V>(lanes, [&](int64_t l0, int64_t k) {
    int32_t lo[V::W] = {}, hi[V::W] = {};
    for (int64_t l = 0; l < k; ++l) {
      lo[l] = static_cast<int32_t>(static_cast<uint32_t>(bases[l0 + l]));
      hi[l] = static_cast<int32_t>(static_cast<uint32_t>(bases[l0 + l] >> 32));
    }
    simd::PhiloxDropoutLanes<V> rows(dropout, V::iload(lo), V::iload(hi), n > 0 ? static_cast<uint32_t>(offsets[0]) : 0,
                                     consecutive);
    for (int64_t j = 0; j < n; ++j) {
      const uint32_t bits = V::mask_bits(rows.keep(j, static_cast<uint32_t>(offsets[j])));
      for (int64_t l = 0; l < k; ++l) keep[(l0 + l) * n + j] = (bits >> l) & 1u;
    }
  });
}

template <class V>
void fill_elementwise(FusedKernelSet* s) {
  s->norm_forward = &norm_forward<V>;
  s->norm_backward = &norm_backward<V>;
  s->bias_dropout_add = &bias_dropout_add<V>;
  s->bias_dropout_add_backward = &bias_dropout_add_backward<V>;
  s->bias_dropout_add_norm = &bias_dropout_add_norm<V>;
  s->dropout = &dropout<V>;
  s->gelu_forward = &gelu_forward<V>;
  s->gelu_backward = &gelu_backward<V>;
  s->swiglu_forward = &swiglu_forward<V>;
  s->swiglu_backward = &swiglu_backward<V>;
  s->glu_forward = &glu_forward<V>;
  s->glu_backward = &glu_backward<V>;
  s->rope_forward = &rope_forward<V>;
  s->rope_backward = &rope_backward<V>;
  s->embedding_forward = &embedding_forward<V>;
  s->embedding_backward = &embedding_backward<V>;
  s->adamw_step = &adamw_step<V>;
  s->ema_adamw_step = &ema_adamw_step<V>;
  s->sum_of_squares = &sum_of_squares<V>;
  s->exp = &exp_array<V>;
  s->erf = &erf_array<V>;
  s->dropout_keep = &dropout_keep_array<V>;
  s->dropout_keep_lanes = &dropout_keep_lanes<V>;
}

}  // namespace gale::fused
