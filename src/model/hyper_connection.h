// Megatron-Core's manifold-constrained hyper-connections (mHC, --enable-mhc-connections): one
// HyperConnectionModule around a sub-block (attention or MLP) of a transformer layer.
//
// The residual stream is n = --mhc-num-residual-streams copies of the hidden state: X [Tl, n·H],
// stream i at columns [i·H, (i+1)·H) (Megatron's [s, b, n·C]). Per token, with m = n² + 2n:
//   proj = X · Wᵀ                         mapping_proj.weight W [m, n·H], no bias
//   r    = 1 / (‖X‖₂ / √(n·H) + 1e-6)
//   h    = r · proj · α + bias             α = [alpha_pre ×n, alpha_post ×n, alpha_res ×n²], bias [m]
//   H_pre = σ(h[0:n]),  H_post = 2·σ(h[n:2n]),  H_res = Sinkhorn(h[2n:] as n×n, row-major)  (model/sinkhorn.h)
//   a    = Σ_i H_pre_i · X_i                 [Tl, H], the sub-block's input (its norm comes after)
//   X'_i = Σ_j H_res[i, j] · X_j + dropout(H_post_i · (y + b))   y + b: the sub-block's output with its bias
// (dropout over the n·H columns, --hidden-dropout). The decoder expands the embedding's output to n
// equal streams before the first layer and averages the streams before the final norm.
// Parameters (Megatron's names, each replicated over TP; their gradients are partial per TP rank
// under sequence parallelism and all-reduced over TP): {prefix}.mapping_proj.weight [m, n·H]
// (Xavier-uniform, bound √(6/(n·H + m)), weight decay), {prefix}.alpha_pre / alpha_post / alpha_res [1]
// (--mhc-init-gating-factor) and {prefix}.bias [m] (zeros), no decay for the 1-D ones.
// Everything here runs in f32 (under --bf16 too: Megatron's module has a "keep in fp32" TODO; Gale does).
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "kernels/op_table.h"
#include "model/config.h"
#include "model/params.h"

namespace gale {

struct HyperConnectionIds {
  int mapping_proj = -1, alpha_pre = -1, alpha_post = -1, alpha_res = -1, bias = -1;
  bool defined() const { return mapping_proj >= 0; }
};

// Registers one module's parameters under `prefix` (e.g. "decoder.layers.0.self_attention_hyper_connection").
HyperConnectionIds register_hyper_connection_params(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part,
                                                    const std::string& prefix);

// What one module keeps between its forward and backward.
struct HyperConnectionSaved {
  Tensor x;       // [Tl, n·H] the module's input (the residual streams)
  Tensor proj;    // [Tl, m]
  Tensor r;       // [Tl]
  Tensor h_pre;   // [Tl, n]
  Tensor h_post;  // [Tl, n]
  Tensor h_res;   // [Tl, n, n]
  Tensor m0;      // [Tl, n, n] Sinkhorn's starting matrix
  Tensor y;       // [Tl, H] the sub-block's output with its bias (set by hc_post_forward)
};

// The mappings and the aggregation: returns a [Tl, H]; fills s (which must outlive the post step).
Tensor hc_pre_forward(const ModelConfig& c, const OpTable& ops, const ParamBuffer& pb, const HyperConnectionIds& w,
                      const Tensor& x, HyperConnectionSaved* s);

// The residual merge: returns X' [Tl, n·H] from y [Tl, H] (the sub-block's output, bias added) and
// forward's mappings; `dropout` is over [Tl, n·H] (cols_total n·H).
Tensor hc_post_forward(const OpTable& ops, const Tensor& y, HyperConnectionSaved* s, const DropoutSpec& dropout);

// The two steps forward keeps no output of under --recompute-modules mhc (model/mhc_layer.h), rerun
// from s as the first forward left it (s.x put back): the aggregation a = Σ_i H_pre_i·X_i [Tl, H]
// (hc_pre_forward's result), and the merge X' [Tl, n·H] from s.x, s.y and the mappings
// (hc_post_forward's result; `dropout` as there, its masks drawn again). Bit-identical to forward's.
Tensor hc_aggregate(const HyperConnectionSaved& s);
Tensor hc_merge(const OpTable& ops, const HyperConnectionSaved& s, const DropoutSpec& dropout);

// Backward of hc_post_forward from dX' [Tl, n·H]: returns dy [Tl, H]; *d_x gets the residual
// path's gradient Σ_i H_res[i, j]·dX'_i (written), *d_h_post and *d_h_res the mappings' gradients.
Tensor hc_post_backward(const OpTable& ops, const HyperConnectionSaved& s, const Tensor& d_out,
                        const DropoutSpec& dropout, Tensor* d_x, Tensor* d_h_post, Tensor* d_h_res);

// Backward of hc_pre_forward: adds to d_x [Tl, n·H] the gradients through the aggregation and the
// mappings, given d_a [Tl, H] and the post step's d_h_post, d_h_res; accumulates the parameters'
// gradients. Releases s.
void hc_pre_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const HyperConnectionIds& w,
                     HyperConnectionSaved& s, const Tensor& d_a, const Tensor& d_h_post, const Tensor& d_h_res,
                     Tensor& d_x);

// The decoder's ends: [Tl, H] -> n equal streams [Tl, n·H]; and their mean [Tl, n·H] -> [Tl, H].
Tensor hc_expand_forward(const Tensor& x, int64_t n);
Tensor hc_expand_backward(const Tensor& d, int64_t n);  // Σ over the streams
Tensor hc_contract_forward(const Tensor& x, int64_t n);
Tensor hc_contract_backward(const Tensor& d, int64_t n);  // d / n to every stream

}  // namespace gale
