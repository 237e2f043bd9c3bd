// Quantisation-aware training (MindSpeed's --qat-scheme, QATQuantEngineFeature): the linear layers'
// GEMMs read MX fake-quantised weights (kernels/cpu/mx_quant.h) while the master weights stay as
// they are.
//
// Which weights: every transformer layer's (MTP layers' included) linear_qkv, linear_proj,
// linear_fc1 and linear_fc2 weight — dense MLPs, routed experts and shared experts — and, with
// --multi-latent-attention, linear_q_proj, linear_q_down_proj, linear_q_up_proj,
// linear_kv_down_proj and linear_kv_up_proj; with a
// "-moe-only" scheme only the routed experts' (…mlp.experts.local_experts.*). The embedding, the
// output layer, the router and MTP's eh_proj stay unquantised (parameter names decide: qat_selects).
// Blocks of `block` elements run along each weight row [out, in], i.e. along the input (reduction)
// dimension of this rank's shard, so the block size must divide every quantised weight's local
// input dimension (features/feature_qat.cc checks it from the flags; mark_qat_params checks it again).
//
// How: linear_weight (model/linear.h) calls qat_fake_quant_into for a marked parameter. It
// quantises the values the GEMM would read — the f32 master without --bf16, the bf16 GEMM copy
// with --bf16 (as MindSpeed, whose linear layers see Megatron's bf16 weights; the result is exact
// in bf16) — into a new tensor the LinearWeight owns, and points the GEMM at it. So forward,
// backward's input gradient and any recomputation use the same fake-quantised weight (a pure
// function of the master values), and the weight gradient dW = dyᵀ·x lands in the f32 master
// gradient unchanged: the straight-through estimator (d Q(W) / dW taken as the identity).
// Memory: one quantised copy per LinearWeight alive (a layer's linear at a time, plus the
// experts running concurrently and dW steps queued by --dualpipev-dw-detach), f32 (4 bytes per
// element) plus the bf16 copy (2) under --bf16, from the allocator (so in its peak figures).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "kernels/cpu/mx_quant.h"

namespace gale {

class ParamBuffer;
struct LinearWeight;

struct QatConfig {
  MxElement element = MxElement::kNone;  // kNone: no QAT
  int64_t block = 32;                    // --qat-quant-block-size
  bool moe_only = false;                 // "-moe-only": routed experts only
  bool enabled() const { return element != MxElement::kNone; }
};

// --qat-scheme ("" = none; w4a16-mxfp4, w4a16-mxfp4-moe-only, w8a16-mxfp8, w8a16-mxfp8-moe-only)
// and --qat-quant-block-size (32 or 128). Errors name the flag.
StatusOr<QatConfig> parse_qat_scheme(const std::string& scheme, int64_t block_size);

// Whether `name` is a transformer layer's linear weight (linear_qkv, linear_proj, linear_fc1,
// linear_fc2, MLA's five projections; dense, experts, shared experts, MTP layers): the weights of
// TE's Linear / LayerNormLinear modules (also --fp8-format's, model/fp8.h).
bool is_transformer_linear_weight(const std::string& name);
// Whether the parameter called `name` (its Megatron name, 2-D) is fake-quantised under `c`.
bool qat_selects(const QatConfig& c, const std::string& name);

// Marks every parameter of `pb` qat_selects picks (ParamSpec::qat_element, qat_block); fails a
// GALE_CHECK naming the weight when the block size does not divide its local input dimension.
// Before or after finalize.
void mark_qat_params(ParamBuffer& pb, const QatConfig& c);

// For a marked parameter `id`: quantises what `w`'s GEMMs would read into tensors `w` keeps, and
// points w.w (and w.w_bf16 under --bf16) at them. `w` must come from linear_weight(pb, id, ...).
void qat_fake_quant_into(const ParamBuffer& pb, int id, LinearWeight& w);

}  // namespace gale
