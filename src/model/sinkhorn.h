// Sinkhorn-Knopp projection of an n×n matrix of logits onto the doubly stochastic matrices (mHC's H_res).
//
// Forward (Megatron-Core's SinkhornKnopp): M0 = exp(L − rowmax(L)), then `iterations` times a row
// normalisation M ← M / max(Σ_j M_ij, ε) followed by a column normalisation M ← M / max(Σ_i M_ij, ε),
// ε = 1e-6. Backward goes through every iteration as autograd does (the clamp passes the gradient
// where the sum is ≥ ε), then through the exponential: dL = dM0 ⊙ M0 (the row-max shift drops out
// because the first row normalisation cancels any per-row factor; Megatron's backward uses the same
// formula). Every value is computed in double and stored as f32.
#pragma once

#include <cstdint>

namespace gale {

constexpr double kSinkhornEps = 1e-6;

// One matrix: logits [n, n] row-major -> m0 [n, n] (the shifted exponential, what backward takes)
// and out [n, n].
void sinkhorn_forward(const float* logits, float* m0, float* out, int64_t n, int64_t iterations);

// Its backward from m0 (forward's) and d_out [n, n]: d_logits [n, n] (written).
void sinkhorn_backward(const float* m0, const float* d_out, float* d_logits, int64_t n, int64_t iterations);

}  // namespace gale
