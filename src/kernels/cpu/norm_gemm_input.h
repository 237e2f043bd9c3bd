// LayerNorm / RMSNorm whose output is written straight in a GEMM's input type (f32, bf16 or f16).
//
// The first half of a norm fused into the linear layer that reads it (--mla-down-proj-fusion,
// model/mla_down_proj.h): one pass over each row computes its statistics and writes the normalised
// row already rounded to the GEMM input type, so the f32 norm output [rows, H] is never stored and
// x is read once. Values and statistics are those of the reference kernels (kernels/cpu/norm.h:
// the same double accumulation, the same f32 expression per element) followed by to_gemm_input's
// rounding, so the result is bit-identical to norm_forward_ref + conversion. Backward is the norm's
// own backward (OpTable::norm_backward) on the kept x and statistics.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/op_table.h"

namespace gale {

// y [rows, H] of type y_dtype (kF32, kBF16 or kF16) = Norm(x) with weight w (and bias b, LayerNorm
// only; may be null); stats as NormForwardFn: [rows] rstd (RMSNorm), [2, rows] mean then rstd (LayerNorm).
void norm_to_gemm_input(const NormSpec& spec, const float* x, const float* w, const float* b, void* y, DType y_dtype,
                        float* stats, int64_t rows, int64_t H);

}  // namespace gale
