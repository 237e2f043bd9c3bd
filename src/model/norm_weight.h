// A norm layer's scale: its weight, or 1 + weight with --apply-layernorm-1p (zero-centred weights) or
// MindSpeed-LLM's --add-rmsnorm-offset (Gemma's RMSNorm).
#pragma once

#include <vector>

#include "model/config.h"
#include "model/params.h"

namespace gale {

// A norm weight's initial value: 1, or 0 when it is stored zero-centred (--apply-layernorm-1p).
// --add-rmsnorm-offset keeps 1: MindSpeed-LLM patches only RMSNorm's forward, not its ones init.
inline InitKind norm_weight_init(const ModelConfig& c) { return c.norm_weight_1p ? InitKind::kZeros : InitKind::kOnes; }

// What the norm kernels receive as their scale γ for norm weight `id`: the parameter itself, or,
// with --apply-layernorm-1p (Megatron's apply_layernorm_1p) or --add-rmsnorm-offset, a copy holding γ = 1 + w, computed in
// fp32 at every use as Megatron does. ∂loss/∂w = ∂loss/∂γ, so the kernels' γ gradient accumulates
// straight into w's gradient either way.
class NormScale {
 public:
  NormScale(const ModelConfig& c, const ParamBuffer& pb, int id) : w_(pb.param_data(id)) {
    if (!c.norm_weight_1p && !c.rmsnorm_offset) return;
    const int64_t n = pb.spec(id).local_numel();
    shifted_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) shifted_[static_cast<size_t>(i)] = 1.0f + w_[i];
  }
  const float* data() const { return shifted_.empty() ? w_ : shifted_.data(); }

 private:
  const float* w_;
  std::vector<float> shifted_;
};

}  // namespace gale
