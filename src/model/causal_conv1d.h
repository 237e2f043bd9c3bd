// Causal depthwise convolution along the sequence (Mamba's and Gated DeltaNet's conv1d), forward and backward.
//
// Rows t = s·B + b of [T, ·] activations (T = S·B). Channel c of row t reads its input at column c of
// x + t·x_stride (a strided view into a wider projection output) and writes
//   y[t, c] = bias[c] + Σ_{k<K} w[c·K + k]·x[(s − K + 1 + k)·B + b, c]     (zero input before s = 0)
// into y [T, C]. bias may be null (none). w is PyTorch's conv1d weight [C, 1, K] read as [C, K].
//
// Decoding (model/mamba_state.h) runs the same convolution over sequences of rows that continue
// earlier positions: a ConvSequence's positions 0 .. length−1 are rows first + s·stride, and its
// state [K−1, C] holds the K−1 inputs before position 0, oldest first (row j: position j − (K−1));
// after the forward it holds the sequence's last K−1 inputs (mamba_ssm's causal_conv1d_update for
// length 1). A null state reads zeros and is not written. With `steps` (speculative decoding's
// rollback, train/inference_engine.h) the state after each position s is also written to
// steps + s·max(K−1, 1)·C, [K−1, C] each (the state the sequence would hold had it ended there).
#pragma once

#include <cstdint>
#include <vector>

namespace gale {

struct ConvSequence {
  int64_t first = 0, stride = 1, length = 0;
  float* state = nullptr;  // [K−1, C] or null
  float* steps = nullptr;  // [length, max(K−1, 1), C] or null: the state after each position
};

void causal_conv1d_forward(const float* x, int64_t x_stride, const float* w, const float* bias, float* y, int64_t C,
                           int64_t K, int64_t S, int64_t B);
// y row t for every row t of the sequences (which cover each row at most once); then each state
// gets its sequence's last K−1 inputs. causal_conv1d_forward is this with sample b's rows b, b + B, ...
// `starts` (packed sequences, model/document_starts.h; null: none) gives for each row t its
// document's first position in its sequence: row t reads no input before it (zero, as before s = 0).
void causal_conv1d_forward_sequences(const float* x, int64_t x_stride, const float* w, const float* bias, float* y,
                                     int64_t C, int64_t K, const std::vector<ConvSequence>& seqs,
                                     const int32_t* starts = nullptr);
// GALE_CHECKs that the sequences' rows cover rows [0, T) exactly once (`who` names the caller).
void check_conv_sequences(const std::vector<ConvSequence>& seqs, int64_t T, const char* who);
// From dy [T, C]: dx (stride dx_stride) += ∂/∂x, dw [C, K] += ∂/∂w, db [C] += ∂/∂bias; null
// dw / db: not accumulated. `starts` as the forward's (rows t = s·B + b).
void causal_conv1d_backward(const float* dy, const float* x, int64_t x_stride, const float* w, float* dx,
                            int64_t dx_stride, float* dw, float* db, int64_t C, int64_t K, int64_t S, int64_t B,
                            const int32_t* starts = nullptr);

}  // namespace gale
