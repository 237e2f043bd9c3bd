// Linear layers y = x·Wᵀ on [rows, in] activations with [out, in] weights, in f32 (sgemm) or,
// under --bf16 / --fp16, with bf16 / f16 inputs accumulating in f32 (kernels/cpu/gemm.h).
#pragma once

#include "core/tensor.h"
#include "kernels/cpu/gemm.h"
#include "model/fp8.h"
#include "model/params.h"

namespace gale {

class WeightGradStore;  // model/weight_grad_store.h

// A linear layer's weight [out, in] (this TP rank's shard): the f32 master values (null for a
// weight stored as bf16 + residual under --reuse-fp32-param, model/params.h), their bf16
// copy under --bf16 or f16 copy under --fp16 (null otherwise), the f32 gradient (null for a frozen
// weight: backward skips dW), the f32 GEMM to run (OpTable::gemm; f16 GEMMs run on it too) and the
// bf16 one (OpTable::bf16_gemm). With `defer` (--dualpipev-dw-detach's input-gradient-only backward
// steps) linear_backward_weight queues dW there instead of computing it.
struct LinearWeight {
  const float* w = nullptr;
  const bf16* w_bf16 = nullptr;
  const f16* w_f16 = nullptr;
  float* grad = nullptr;
  int64_t out = 0, in = 0;
  SgemmFn gemm = sgemm;
  Bf16GemmFn bf16_gemm = gemm_bf16;
  WeightGradStore* defer = nullptr;
  // --qat-scheme (model/qat.h): the fake-quantised copies w (and w_bf16) then point into, owned here.
  Tensor qat_w, qat_w_bf16;
  // --fp8-format (model/fp8.h): when active, the three GEMMs read FP8-quantised, dequantised f32
  // operands (the weight from w_bf16 when there is one, else w) and run on `gemm` in f32.
  Fp8Operands fp8;
};

// Parameter `id` of `pb` as a linear layer's weight: its local [out, in] shard, its GEMM copy when
// the buffer has one (--bf16, --fp16), its gradient, on `gemm` and `bf16_gemm`. A weight marked
// for --qat-scheme reads its MX fake-quantised copy instead (model/qat.h); its gradient is the master's.
// A weight marked for --fp8-format carries its FP8 operands (model/fp8.h).
LinearWeight linear_weight(const ParamBuffer& pb, int id, SgemmFn gemm, Bf16GemmFn bf16_gemm = gemm_bf16);

// y[M, out] (f32) = x[M, in]·Wᵀ. x is f32, or bf16 / f16 (then W's copy of that type is used).
Tensor linear_forward(const Tensor& x, const LinearWeight& w);
// Backward of linear_forward: returns dx[M, in] (f32, written) and accumulates dW += dyᵀ·x (unless
// w.grad is null). With a bf16 or f16 x, dy is rounded to that type once and both products run as
// GEMMs of that type: under --fp16 a gradient beyond f16's range becomes infinite there, which is
// what the loss scaler detects (optim/grad_scaler.h).
Tensor linear_backward(const Tensor& dy, const Tensor& x, const LinearWeight& w);

// The pieces of both, for callers that split the rows (parallel/coc.h): the forward into a given
// f32 y[M, out] (a row range of a larger output may be passed); the input gradient dx[M, in] = dy·W
// (written) with dy rounded to `x_dtype` first when that is bf16 or f16; the weight gradient
// dW += dyᵀ·x (nothing for a frozen weight). Each row of y and dx depends only on its own row of
// x or dy, so computing them over any row split gives the same products (up to the GEMM's own
// blocking, kernels/cpu/gemm.h gemm_split_bit_exact). With w.defer the weight gradient is queued
// there (dy and x kept alive) and runs when the store pops it.
void linear_forward_into(const Tensor& x, const LinearWeight& w, Tensor& y);
void linear_backward_data_into(const Tensor& dy, const LinearWeight& w, DType x_dtype, Tensor& dx);
void linear_backward_weight(const Tensor& dy, const Tensor& x, const LinearWeight& w);

// x as a GEMM input is stored: unchanged (`dtype` kF32, or x is already of `dtype`), or rounded to
// bf16 (--bf16) or f16 (--fp16): half the bytes of the activations a layer keeps for backward.
Tensor to_gemm_input(const Tensor& x, DType dtype);
// A bf16 or f16 tensor widened back to f32 (or x itself when it is f32).
Tensor to_f32(const Tensor& x);

}  // namespace gale
