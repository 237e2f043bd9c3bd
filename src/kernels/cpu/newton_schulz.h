// Newton-Schulz orthogonalisation of a matrix (the core of the Muon optimizer, optim/optimizer.h).
//
// Megatron-LM's Muon (megatron/core/optimizer/emerging_optimizers.py) calls NVIDIA's
// emerging_optimizers newton_schulz(); this is the same iteration on Gale's f32 GEMM:
//
//   X = G (Gᵀ when G has more rows than columns, so that X X ᵀ is the smaller Gram matrix)
//   X = X / max(‖X‖_F, 1e-15)
//   for each of `steps` coefficient triples (a, b, c):
//     A = X·Xᵀ;  B = b·A + c·A·A;  X = a·X + B·X      (c = 0: X = a·X + b·A·X)
//   result = X (transposed back)
//
// The triples come from a named set (--muon-coefficient-type): "quintic" (Muon's default, five
// triples), "simple" (one triple), "polar_express", "cans", "aol", "deepseekv4", "cubic5". Sets are
// cycled when `steps` exceeds their length, except polar_express, cans and deepseekv4, whose last
// triple repeats; cubic5 takes exactly 5 steps.
//
// Precision (--muon-fp32-matmul-prec): "medium" (Megatron's default) runs the iteration on bf16
// values, as emerging_optimizers does with torch's "medium" f32 matmul precision: X is rounded to
// bf16 after the normalisation and every product (A, B, X) is rounded to bf16 as it is stored,
// the products themselves accumulating in f32. "high" keeps every value f32 (on the GPU torch
// would use TF32 there; the CPU has no TF32).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace gale {

struct NsCoefficients {
  std::vector<std::array<float, 3>> sets;  // (a, b, c) per step
  bool repeat_last = false;                // past the end: repeat the last triple (else cycle)
  int64_t fixed_steps = 0;                 // > 0: the only step count the set allows (cubic5: 5)
  // The triple of step `i` (0-based).
  const std::array<float, 3>& at(int64_t i) const;
};

// The named coefficient set, or nullopt for an unknown name.
std::optional<NsCoefficients> ns_coefficients(const std::string& type);
// The names ns_coefficients() knows, for error messages: "simple, quintic, ...".
std::string ns_coefficient_type_list();

// Orthogonalises g [rows, cols] (row-major) into out [rows, cols] (out may equal g) with `steps`
// iterations of `coefficients`, using `gemm` for every product. `bf16` selects the "medium"
// precision described above.
void newton_schulz(const float* g, float* out, int64_t rows, int64_t cols, int64_t steps,
                   const NsCoefficients& coefficients, bool bf16, SgemmFn gemm = sgemm);

// Sums `n` floats in place over the ranks that hold the other shards of a matrix.
using NsAllReduce = std::function<void(float* data, int64_t n)>;

// --muon-tp-mode distributed (emerging_optimizers' newton_schulz_tp, mode "distributed"): the same
// iteration on a matrix split over ranks along `split_dim` (0: rows, 1: columns), g [rows, cols]
// being this rank's shard (rows or cols may be 0). Every rank calls it with its shard and `sum`
// over the same group. The shard is laid out so that the split dimension is X's long side (X = gᵀ
// for split_dim 0, g for 1, whatever the shape), so that the Gram matrix A = X·Xᵀ is a sum over
// the shards: the norm's sum of squares and each step's A are summed with `sum` (A rounded to bf16
// before and after the sum in "medium" precision), the rest (B, X) is local. The result is this
// rank's shard of the orthogonalised matrix; the whole equals newton_schulz() of the gathered
// matrix up to rounding, also where the unsharded call transposes the other way (each step is a
// polynomial p(X·Xᵀ)·X = X·p(Xᵀ·X), the same matrix through either Gram matrix).
void newton_schulz_sharded(const float* g, float* out, int64_t rows, int64_t cols, int split_dim, int64_t steps,
                           const NsCoefficients& coefficients, bool bf16, const NsAllReduce& sum,
                           SgemmFn gemm = sgemm);

// A plain triple-loop version of the same iteration (f32 or bf16-rounded likewise), the reference
// the GEMM version is tested against.
void newton_schulz_ref(const float* g, float* out, int64_t rows, int64_t cols, int64_t steps,
                       const NsCoefficients& coefficients, bool bf16);

// Muon's update scale for a [size_out, size_in] matrix (--muon-scale-mode): "spectral"
// √max(out, in), "unit_rms_norm" √(out/in), "shape_scaling" √max(1, out/in). nullopt for an
// unknown mode.
std::optional<double> muon_scale_factor(int64_t size_out, int64_t size_in, const std::string& mode);

}  // namespace gale
