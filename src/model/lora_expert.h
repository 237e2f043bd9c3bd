// LoRA on the routed experts' linear_fc1 / linear_fc2 (MindSpeed-LLM's LoRA on MoE models): the
// adapter backward split in two, as the experts' own backward is (input gradients first, then the
// weight gradients from the kept input rows), with the low-rank state u = x·Aᵀ recomputed there
// (r columns per row: nothing is kept between forward and backward).
//
//   register:  ids = register_expert_lora(pb, c, weight_spec)  (after the expert's weight spec)
//   forward:   lora_forward(x, l, y)                            (model/lora.h)
//   backward:  lora_backward_input(dy, l, dx); ...; lora_backward_weights(dy, x, l)
#pragma once

#include "core/tensor.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/params.h"

namespace gale {

// Registers lora_A [r, in] and lora_B [out, r] for the expert linear whose weight spec is
// `weight` (global shape [out, in]; its expert-parallel placement, global name and TP-partial-
// gradient marking copied, so the adapters sit at their global expert and reduce as the expert
// does); not split (the expert must be whole on this rank: --expert-tensor-parallel-size 1).
LoraIds register_expert_lora(ParamBuffer& pb, const LoraConfig& c, const ParamSpec& weight);

// dx[M, in] += s·(dy·B)·A  (dy [M, out] f32 or bf16).
void lora_backward_input(const Tensor& dy, const LoraWeights& l, Tensor& dx);
// dB += s·dyᵀ·(x·Aᵀ), dA += (s·dy·B)ᵀ·x  (x [M, in], dy [M, out], each f32 or bf16).
void lora_backward_weights(const Tensor& dy, const Tensor& x, const LoraWeights& l);

}  // namespace gale
