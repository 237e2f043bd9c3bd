// LoRA on the routed experts' linear_fc1 / linear_fc2 (MindSpeed-LLM's LoRA on MoE models): the
// adapter backward split in two, as the experts' own backward is (input gradients first, then the
// weight gradients from the kept input rows), with the low-rank state u = x·Aᵀ recomputed there
// (r columns per row: nothing is kept between forward and backward).
//
//   register:  ids = register_expert_lora(pb, c, weight_spec)  (after the expert's weight spec)
//   forward:   lora_forward(x, l, y)                            (model/lora.h)
//   backward:  lora_backward_input(dy, l, dx); ...; lora_backward_weights(dy, x, l)
//
// The MoE shared experts' linear_fc1 / linear_fc2 (model/moe_shared_expert.h) take adapters too when
// --lora-target-modules names them (peft matches a module name's last part, so "linear_fc1" also
// names mlp.shared_experts.linear_fc1): registered by register_lora_params (model/lora.h), split
// over TP as the dense MLP's, and run with lora_forward and this split backward.
#pragma once

#include "core/tensor.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/params.h"

namespace gale {

// Registers lora_A [r, in] and lora_B [out, r] for the expert linear whose weight spec is
// `weight` (global shape [out, in]; its expert-parallel placement, global name and TP-partial-
// gradient marking copied, so the adapters sit at their global expert and reduce as the expert
// does). An expert split over the expert-TP group (--expert-tensor-parallel-size > 1, which
// arguments_moe.cc only allows equal to --tensor-model-parallel-size, so the expert-TP group is the
// TP group) is adapted as the dense parallel linears (model/lora.h): linear_fc1 (column-parallel,
// split on dim 0) gets lora_B split like it (SwiGLU: each of [gate; up]) and lora_A whole;
// linear_fc2 (row-parallel, split on dim 1) gets lora_A split like it and lora_B whole. No extra
// communication: the experts already run on the whole group's rows (gathered), so the whole
// factor's local gradient is a partial sum over the group (fc1: dA = Σ (s·dy_r·B_r)ᵀ·x; fc2:
// dB = Σ s·dyᵀ·(x_r·A_rᵀ)); it is marked sequence_parallel and all-reduced over TP with the
// norms, and the group's reduce-scatter of fc1's input gradient / fc2's output sums the adapters'
// partial dx and y.
LoraIds register_expert_lora(ParamBuffer& pb, const LoraConfig& c, const ParamSpec& weight);

// dx[M, in] += s·(dy·B)·A  (dy [M, out] f32 or bf16).
void lora_backward_input(const Tensor& dy, const LoraWeights& l, Tensor& dx);
// dB += s·dyᵀ·(x·Aᵀ), dA += (s·dy·B)ᵀ·x  (x [M, in], dy [M, out], each f32 or bf16).
void lora_backward_weights(const Tensor& dy, const Tensor& x, const LoraWeights& l);

}  // namespace gale
