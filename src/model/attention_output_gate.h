// --attention-output-gate (Megatron-Core's attention_output_gate; Qwen3-Next's gated attention): sigmoid gates on attention's output.
//
// linear_qkv then produces, per query group g, Megatron's rows
//   [ q (NH/KV·HD) | gate (NH/KV·HD) | k (HD) | v (HD) ]
// so one more NH·HD rows in all, split over TP in whole groups as before. The gate of query head h
// (HD values per token) multiplies that head's attention output elementwise by sigmoid(gate)
// before linear_proj: ctx_gated = ctx ⊙ σ(gate).
//
// split_output_gate takes the gate rows out of the packed [T, (2·NHl + 2·KVl)·HD] rows, leaving the
// [T, (NHl + 2·KVl)·HD] rows every attention path reads (kernels/cpu/head_layout.h); merge_output_gate
// puts the gradients back in the gated layout for linear_qkv's backward. Dimensions are this
// rank's: NHl query heads in KVl groups.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace gale {

// The packed rows without the gate [T, (NHl + 2·KVl)·HD], and the gate [T, NHl·HD] (head-major, as ctx).
Tensor split_output_gate(const Tensor& qkv_gated, int64_t NHl, int64_t KVl, int64_t HD, Tensor* gate);
// The inverse of split_output_gate: [T, (2·NHl + 2·KVl)·HD] from d_qkv [T, (NHl + 2·KVl)·HD] and d_gate [T, NHl·HD].
Tensor merge_output_gate(const Tensor& d_qkv, const Tensor& d_gate, int64_t NHl, int64_t KVl, int64_t HD);

// out[i] = ctx[i]·σ(gate[i]) over n values (f32).
void output_gate_forward(const float* ctx, const float* gate, float* out, int64_t n);
// d_ctx[i] = d_out[i]·σ(gate[i]); d_gate[i] = d_out[i]·ctx[i]·σ(gate[i])·(1 − σ(gate[i])).
void output_gate_backward(const float* d_out, const float* ctx, const float* gate, float* d_ctx, float* d_gate,
                          int64_t n);

}  // namespace gale
