// The function table each ISA build of the fused kernels exports (scalar, AVX2, AVX-512).
//
// fused_ops.cc picks one set per op group when installing kernels into an OpTable. Each
// *_scalar.cc / *_avx2.cc / *_avx512.cc instantiation file fills its part of the set. The math
// hooks at the end exist for tests and benchmarks of the vector math itself.
#pragma once

#include <cstdint>

#include "kernels/op_table.h"

namespace gale {

struct FusedKernelSet {
  const char* isa = nullptr;
  NormForwardFn norm_forward = nullptr;
  NormBackwardFn norm_backward = nullptr;
  BiasDropoutAddFn bias_dropout_add = nullptr;
  BiasDropoutAddBackwardFn bias_dropout_add_backward = nullptr;
  BiasDropoutAddNormFn bias_dropout_add_norm = nullptr;
  DropoutFn dropout = nullptr;
  ActivationForwardFn gelu_forward = nullptr;
  ActivationBackwardFn gelu_backward = nullptr;
  ActivationForwardFn swiglu_forward = nullptr;
  ActivationBackwardFn swiglu_backward = nullptr;
  GluForwardFn glu_forward = nullptr;  // installed with the gelu and swiglu groups
  GluBackwardFn glu_backward = nullptr;
  RopeFn rope_forward = nullptr;
  RopeFn rope_backward = nullptr;
  AttentionForwardFn attention_forward = nullptr;
  AttentionBackwardFn attention_backward = nullptr;
  EmbeddingForwardFn embedding_forward = nullptr;
  EmbeddingBackwardFn embedding_backward = nullptr;
  LmHeadLossForwardFn lm_head_loss_forward = nullptr;
  LmHeadLossBackwardFn lm_head_loss_backward = nullptr;
  AdamWFn adamw_step = nullptr;
  EmaAdamWFn ema_adamw_step = nullptr;  // installed with adamw

  // Not (yet) an OpTable entry: the optimizer's gradient-norm reduction, Σ x² (deterministic,
  // vectorised; within 1e-6 relative of sum_of_squares in kernels/cpu/optimizer.h).
  double (*sum_of_squares)(const float* x, int64_t n) = nullptr;

  // Vector math, element by element: y = exp(x), y = erf(x); keep[i] = dropout keep decision of
  // index base + i (dropout_uniform_at(seed, stream, base + i) >= p) as the fused bias-dropout-add
  // draws it (simd::PhiloxDropoutRow).
  void (*exp)(const float* x, float* y, int64_t n) = nullptr;
  void (*erf)(const float* x, float* y, int64_t n) = nullptr;
  void (*dropout_keep)(uint64_t seed, uint64_t stream, float p, uint64_t base, int64_t n, uint8_t* keep) = nullptr;
  // keep[l·n + j] = keep decision of index bases[l] + offsets[j] (l < lanes, j < n; offsets >= 0) as
  // flash attention draws it for query lanes over key positions (simd::PhiloxDropoutLanes, W lanes
  // at a time, one block per 4 rows when the offsets are consecutive).
  void (*dropout_keep_lanes)(uint64_t seed, uint64_t stream, float p, const uint64_t* bases, int64_t lanes,
                             const int32_t* offsets, int64_t n, uint8_t* keep) = nullptr;
};

// Filled by the per-ISA instantiation files.
void add_elementwise_kernels_scalar(FusedKernelSet* set);
void add_elementwise_kernels_avx2(FusedKernelSet* set);
void add_elementwise_kernels_avx512(FusedKernelSet* set);
void add_attention_kernels_scalar(FusedKernelSet* set);
void add_attention_kernels_avx2(FusedKernelSet* set);
void add_attention_kernels_avx512(FusedKernelSet* set);
void add_lm_head_kernels_scalar(FusedKernelSet* set);
void add_lm_head_kernels_avx2(FusedKernelSet* set);
void add_lm_head_kernels_avx512(FusedKernelSet* set);

}  // namespace gale
