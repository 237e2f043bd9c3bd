// Linear layers y = x·Wᵀ on [rows, in] activations with [out, in] weights, in f32 (sgemm) or,
// under --bf16, with bf16 inputs accumulating in f32 (oneDNN matmul; AMX where the CPU has it).
#pragma once

#include "core/tensor.h"
#include "kernels/cpu/gemm.h"
#include "model/params.h"

namespace gale {

// A linear layer's weight [out, in] (this TP rank's shard): the f32 master values, their bf16
// copy under --bf16 (null otherwise), the f32 gradient (null for a frozen weight: backward skips
// dW), and the f32 GEMM to run (OpTable::gemm).
struct LinearWeight {
  const float* w = nullptr;
  const bf16* w_bf16 = nullptr;
  float* grad = nullptr;
  int64_t out = 0, in = 0;
  SgemmFn gemm = sgemm;
};

// Parameter `id` of `pb` as a linear layer's weight: its local [out, in] shard, its bf16 copy when
// the buffer has one (--bf16), its gradient, on `gemm`.
LinearWeight linear_weight(const ParamBuffer& pb, int id, SgemmFn gemm);

// y[M, out] (f32) = x[M, in]·Wᵀ. x is f32, or bf16 (then W's bf16 copy is used).
Tensor linear_forward(const Tensor& x, const LinearWeight& w);
// Backward of linear_forward: returns dx[M, in] (f32, written) and accumulates dW += dyᵀ·x (unless
// w.grad is null). With
// a bf16 x, dy is rounded to bf16 once and both products run as bf16 GEMMs.
Tensor linear_backward(const Tensor& dy, const Tensor& x, const LinearWeight& w);

// x as a GEMM input is stored: unchanged (f32), or rounded to bf16 under --bf16 (half the bytes of
// the activations a layer keeps for backward).
Tensor to_gemm_input(const Tensor& x, bool use_bf16);
// A bf16 tensor widened back to f32 (or x itself when it is f32).
Tensor to_f32(const Tensor& x);

}  // namespace gale
