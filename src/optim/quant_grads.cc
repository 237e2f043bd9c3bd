// --quant-grads: a chunk's main gradients as FP16 codes with per-parameter scales (optim/quant_grads.h).
#include "optim/quant_grads.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "kernels/cpu/quant_grads.h"

namespace gale {

QuantGradStore::QuantGradStore(ParamBuffer* params, Comm dp, std::vector<FlatRange> owned, double sum_factor)
    : params_(params), dp_(std::move(dp)), owned_(std::move(owned)) {
  const double n = dp_ ? static_cast<double>(dp_->size()) : 1.0;
  const double h = sum_factor > 0.0 ? n * sum_factor : 1.0;
  if (h > 1.0) headroom_ = static_cast<float>(h);
  GALE_CHECK(params_->flat_grads().defined()) << "--quant-grads needs the flat f32 gradient buffer";
  if (owned_.empty()) owned_.push_back(FlatRange{0, params_->trainable_numel()});
  codes_ = Tensor::zeros({std::max<int64_t>(params_->trainable_numel(), 1)}, DType::kF16);
  scales_.assign(static_cast<size_t>(params_->size()), 0.0f);
  for (int id = 0; id < params_->size(); ++id)
    if (holds(id)) scales_[static_cast<size_t>(id)] = 1.0f;
}

bool QuantGradStore::holds(int id) const {
  const ParamSpec& s = params_->spec(id);
  return s.trainable && !s.buffer && s.local_numel() > 0;
}

f16* QuantGradStore::codes_of(int id) { return codes_.data<f16>() + params_->spec(id).offset; }

const f16* QuantGradStore::codes(int id) const {
  return holds(id) ? codes_.data<f16>() + params_->spec(id).offset : nullptr;
}

int64_t QuantGradStore::bytes() const {
  int64_t n = 0;
  for (int id = 0; id < params_->size(); ++id)
    if (holds(id)) n += 2 * params_->spec(id).local_numel() + 4;
  return n;
}

void QuantGradStore::zero() {
  std::memset(codes_.raw(), 0, static_cast<size_t>(codes_.nbytes()));
}

void QuantGradStore::accumulate(const std::vector<int>& param_ids) {
  float* g = params_->flat_grads().data<float>();
  for (int id : param_ids) {
    if (!holds(id)) continue;
    const ParamSpec& s = params_->spec(id);
    quant_grad_accumulate(codes_of(id), g + s.offset, s.local_numel(), &scales_[static_cast<size_t>(id)]);
  }
}

void QuantGradStore::accumulate_pending() {
  const float* g = params_->flat_grads().data<float>();
  std::vector<int> pending;
  for (int id = 0; id < params_->size(); ++id) {
    if (!holds(id)) continue;
    const ParamSpec& s = params_->spec(id);
    const float* x = g + s.offset;
    if (std::any_of(x, x + s.local_numel(), [](float v) { return v != 0.0f; })) pending.push_back(id);
  }
  accumulate(pending);
}

void QuantGradStore::align_scales() {
  if (!dp_ || dp_->size() == 1) return;
  std::vector<float> aligned = scales_;
  dp_->all_reduce(aligned.data(), static_cast<int64_t>(aligned.size()), DType::kF32, ReduceOp::kMin);
  if (headroom_ != 1.0f)
    for (float& a : aligned) a /= headroom_;
  for (int id = 0; id < params_->size(); ++id) {
    if (!holds(id)) continue;
    float& s = scales_[static_cast<size_t>(id)];
    quant_grad_rescale(codes_of(id), params_->spec(id).local_numel(), s, aligned[static_cast<size_t>(id)]);
    s = aligned[static_cast<size_t>(id)];
  }
}

void QuantGradStore::stage_for_reduction() {
  float* g = params_->flat_grads().data<float>();
  for (int id = 0; id < params_->size(); ++id) {
    if (!holds(id)) continue;
    const ParamSpec& s = params_->spec(id);
    quant_grad_decode(codes_of(id), s.local_numel(), 1.0f, g + s.offset);  // float(code): scale 1
  }
}

void QuantGradStore::finish_reduction() {
  float* g = params_->flat_grads().data<float>();
  for (int id = 0; id < params_->size(); ++id) {
    if (!holds(id)) continue;
    const ParamSpec& s = params_->spec(id);
    const int64_t begin = s.offset, end = s.offset + s.local_numel();
    for (const FlatRange& r : owned_) {
      const int64_t lo = std::max(begin, r.begin), hi = std::min(end, r.end);
      if (lo < hi) quant_grad_round_and_decode(g + lo, hi - lo, scales_[static_cast<size_t>(id)], codes_of(id) + (lo - begin));
    }
  }
}

}  // namespace gale
