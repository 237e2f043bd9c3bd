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
  for_vectors<V>(n, [&](int64_t i, int64_t k) {
    float lanes[V::W];
    V::store(lanes, V::select(dropout.keep(base + static_cast<uint64_t>(i)), V::set1(1.0f), V::zero()));
    for (int64_t l = 0; l < k; ++l) keep[i + l] = lanes[l] != 0.0f;
  });
}

template <class V>
void fill_elementwise(FusedKernelSet* s) {
  s->norm_forward = &norm_forward<V>;
  s->norm_backward = &norm_backward<V>;
  s->bias_dropout_add = &bias_dropout_add<V>;
  s->bias_dropout_add_backward = &bias_dropout_add_backward<V>;
  s->bias_dropout_add_norm = &bias_dropout_add_norm<V>;
  s->gelu_forward = &gelu_forward<V>;
  s->gelu_backward = &gelu_backward<V>;
  s->swiglu_forward = &swiglu_forward<V>;
  s->swiglu_backward = &swiglu_backward<V>;
  s->rope_forward = &rope_forward<V>;
  s->rope_backward = &rope_backward<V>;
  s->embedding_forward = &embedding_forward<V>;
  s->embedding_backward = &embedding_backward<V>;
  s->adamw_step = &adamw_step<V>;
  s->sum_of_squares = &sum_of_squares<V>;
  s->exp = &exp_array<V>;
  s->erf = &erf_array<V>;
  s->dropout_keep = &dropout_keep_array<V>;
}

}  // namespace gale::fused
