// --mla-down-proj-fusion: MLA's input norm and q/kv down projections as one norm + one GEMM.
//
// Megatron-Core's FusedMLASelfAttention (multi_latent_attention.py) replaces linear_q_down_proj
// [Cq, H] and linear_kv_down_proj [Ckv + R, H] by one linear_qkv_down_proj of the row
// concatenation [q_down; kv_down] ([Cq + Ckv + R, H]; the first Cq output columns are the query
// latent, the rest [kv latent | k_pos_emb]), and with Transformer Engine folds the layer's
// input_layernorm into it (a LayerNormLinear). Gale computes the same thing on the CPU:
//
//   forward:  xn = Norm(x_in) written straight in the GEMM input type (kernels/cpu/norm_gemm_input.h)
//             y [Tl, Cq + Ckv + R] = xn · [W_q_down; W_kv_down]ᵀ     ONE GEMM
//   backward: dxn = dy · [W_q; W_kv]                                 ONE GEMM
//             [dW_q; dW_kv] += dyᵀ · xn                              ONE GEMM
//             dx_in = Norm backward (dγ, dβ accumulated)             OpTable::norm_backward
//
// Parameters and checkpoints are unchanged: the weights stay Gale's (and Megatron's on-disk)
// linear_q_down_proj.weight, linear_kv_down_proj.weight and input_layernorm.weight (.bias), as
// Megatron's fused module saves them (its sharded_state_dict splits the fused weight back and maps
// linear_qkv_down_proj.layer_norm_* to input_layernorm.*). With the fusion on, register_mla_params
// registers kv_down right after q_down, so the two are adjacent in the flat parameter, GEMM-copy
// and gradient buffers and the concatenated weight is read in place; where they are not adjacent
// (padding, sharded storage, --reuse-fp32-param) the concatenation is copied per call and dW is
// accumulated per half (same values).
//
// Unfused (the level-0 reference): norm_forward, to_gemm_input, then the two linears. The two
// paths agree to rounding: the norm is bit-identical, each output element is the same dot product
// over H (the GEMM's blocking may differ), so fused = unfused to ~1e-6 relative in f32
// (tests/model/mla_down_proj_test.cc).
#pragma once

#include "core/tensor.h"
#include "model/layer_runtime.h"
#include "model/params.h"

namespace gale {

// The parameters of the fused projection: the input norm's weight (and bias with LayerNorm, else
// -1) and the two down projections.
struct MlaDownProjIds {
  int norm_w = -1, norm_b = -1;
  int q_down = -1, kv_down = -1;
};

// What forward keeps for backward.
struct MlaDownProjSaved {
  Tensor x_in;   // [Tl, H] f32, the norm's input
  Tensor stats;  // the norm's statistics
  Tensor xn;     // [Tl, H] the GEMM input (f32, or bf16 / f16 under --bf16 / --fp16)
};

// x_in [Tl, H] (f32) -> [Tl, Cq + Ckv + R] (f32). `saved` receives xn (also the input DSA's indexer
// reads) and what backward needs.
Tensor mla_down_proj_forward(const LayerRuntime& rt, const ParamBuffer& pb, const MlaDownProjIds& w, const Tensor& x_in,
                             MlaDownProjSaved* saved);

// dy [Tl, Cq + Ckv + R] -> dx_in [Tl, H] (through the norm); the weights' and the norm's gradients
// accumulated. Releases `saved`.
Tensor mla_down_proj_backward(const LayerRuntime& rt, ParamBuffer& pb, const MlaDownProjIds& w, MlaDownProjSaved& saved,
                              const Tensor& dy);

}  // namespace gale
