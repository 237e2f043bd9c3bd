// The MoE shared expert (Megatron-Core SharedExpertMLP): a dense MLP every token passes through,
// added to the routed experts' output; optionally gated; explicit forward and backward.
//
// With --moe-shared-expert-intermediate-size Fs (the total FFN size of all shared experts) every MoE
// layer gains, next to its router and routed experts (model/moe_layer.h):
//   m = fc2(act(fc1(x)))          fc1 [Fs or 2Fs, H] (SwiGLU: [gate; up]), fc2 [H, Fs], GeLU or SwiGLU
//                                 as the routed experts; no biases (Megatron asserts
//                                 --disable-bias-linear for the shared experts)
//   --moe-shared-expert-gate:     out = sigmoid(x·gate_weightᵀ) ⊙ m, gate_weight [1, H] (one scalar
//                                 per token); otherwise out = m
//   the MoE layer's output:       y = routed(x) + out
// Parameter names: decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight, ...linear_fc2.weight,
// ...gate_weight. Init (Megatron's): fc1 and the gate normal(0, std); fc2 normal(0, std/sqrt(2L)).
//
// Tensor parallelism (Megatron's SharedExpertMLP is an MLP on the TP group, whatever
// --expert-tensor-parallel-size says): fc1 column-parallel (SwiGLU: each half split), fc2
// row-parallel. MoE under TP requires --sequence-parallel, so the input is this rank's token slice
// [Tl, H]: it is all-gathered over TP before fc1 and fc2's partial output is reduce-scattered back
// to [Tl, H] (backward: all-gather of the output gradient, reduce-scatter of fc1's input gradient),
// the same mappings as the dense MLP. The gate is computed on the local slice; its weight is
// replicated and its gradient partial per TP rank (marked sequence_parallel: all-reduced over TP).
// The shared expert is a dense (non-expert) parameter: under EP it is replicated on every EP rank
// and its gradient reduced over data parallelism like the router's. Under CP each rank applies it
// to its own positions. Under --bf16 fc1 and fc2 run as bf16 GEMMs (as every linear); the gate's
// dot products run in f32 (as the router).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "kernels/op_table.h"
#include "model/config.h"
#include "model/params.h"

namespace gale {

class WeightGradStore;  // model/weight_grad_store.h

// Ids of one layer's shared-expert parameters in the ParamBuffer (-1 when absent).
struct SharedExpertIds {
  int fc1_w = -1;   // decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight [Fs or 2Fs, H] (TP dim 0)
  int fc2_w = -1;   // ...linear_fc2.weight [H, Fs] (TP dim 1)
  int gate_w = -1;  // ...gate_weight [1, H] (replicated; --moe-shared-expert-gate)
  bool defined() const { return fc1_w >= 0; }
  std::vector<int> all() const;  // fc1, fc2, gate (the defined ones)
};

// Registers global layer `layer`'s shared expert when config.moe.shared_ffn > 0 (else returns ids
// that are all -1), split over part.tp.
SharedExpertIds register_shared_expert_params(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part,
                                              int64_t layer);

// What forward keeps for backward (one layer, one micro-batch).
struct SharedExpertSaved {
  Tensor x;        // [Tl, H] the local input as the GEMMs take it (the gate's input)
  Tensor x_full;   // [T, H] fc1's input (the SP all-gather of x; x itself without TP)
  Tensor fc1_out;  // [T, Fs/TP or 2Fs/TP] the activation's input
  Tensor act;      // [T, Fs/TP] fc2's input (bf16 under --bf16)
  Tensor m;        // [Tl, H] the ungated output (gate only)
  Tensor gate;     // [Tl] sigmoid(x·gate_weightᵀ) (gate only)
};

// Returns out [Tl, H] (f32) for the local tokens x [Tl, H] (f32 or bf16, as the GEMMs take it).
// With `saved` (training) the state for backward is kept. Every rank of part.tp must call it.
Tensor shared_expert_forward(const ModelConfig& c, const OpTable& ops, const ParamBuffer& pb,
                             const SharedExpertIds& w, const ModelPartition& part, const Tensor& x,
                             SharedExpertSaved* saved);

// Returns dx [Tl, H] (f32) for d_out [Tl, H]; accumulates the shared expert's gradients (its two
// linears' weight gradients queued in `defer_weight_grads` when given: --dualpipev-dw-detach; the
// gate's at once). Releases `s`.
Tensor shared_expert_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const SharedExpertIds& w,
                              const ModelPartition& part, SharedExpertSaved& s, const Tensor& d_out,
                              WeightGradStore* defer_weight_grads = nullptr);

}  // namespace gale
