// The Mamba layers' decoding state slots.
#include "model/mamba_state.h"

#include <algorithm>

#include "core/check.h"
#include "model/mamba_mixer.h"

namespace gale {

MambaStatePool::MambaStatePool(const ModelConfig& c, const ModelPartition& part, int64_t slots) : slots_(slots) {
  GALE_CHECK(slots >= 0) << "mamba state pool of " << slots << " slots";
  const MambaDims d = MambaDims::of(c);
  conv_numel_ = std::max<int64_t>(d.K - 1, 1) * d.conv_dim();  // K = 1: no history (one unused row)
  ssm_numel_ = d.NH * d.P * d.N;
  for (int64_t i = 0; i < part.num_layers; ++i) {
    const int64_t layer = part.first_layer + i;
    if (!c.hybrid.enabled || c.is_noop_layer(layer) || !c.hybrid.is_mamba_layer(layer)) {
      index_.push_back(-1);
      continue;
    }
    index_.push_back(static_cast<int64_t>(conv_.size()));
    conv_.push_back(Tensor::zeros({std::max<int64_t>(slots, 1), conv_numel_}));
    ssm_.push_back(Tensor::zeros({std::max<int64_t>(slots, 1), ssm_numel_}));
  }
  slot_bytes_ = static_cast<int64_t>(conv_.size()) * (conv_numel_ + ssm_numel_) * static_cast<int64_t>(sizeof(float));
  for (int64_t s = slots - 1; s >= 0; --s) free_.push_back(s);
  taken_.assign(static_cast<size_t>(slots), 0);
}

int64_t MambaStatePool::index(int64_t layer) const {
  const int64_t k = layer >= 0 && layer < static_cast<int64_t>(index_.size()) ? index_[static_cast<size_t>(layer)] : -1;
  GALE_CHECK(k >= 0) << "mamba state pool: local layer " << layer << " is not a Mamba layer";
  return k;
}

float* MambaStatePool::conv(int64_t layer, int64_t slot) {
  GALE_CHECK(slot >= 0 && slot < slots_) << "mamba state pool: slot " << slot << " of " << slots_;
  return conv_[static_cast<size_t>(index(layer))].data<float>() + slot * conv_numel_;
}

float* MambaStatePool::ssm(int64_t layer, int64_t slot) {
  GALE_CHECK(slot >= 0 && slot < slots_) << "mamba state pool: slot " << slot << " of " << slots_;
  return ssm_[static_cast<size_t>(index(layer))].data<float>() + slot * ssm_numel_;
}

int64_t MambaStatePool::allocate() {
  GALE_CHECK(!free_.empty()) << "mamba state pool: all " << slots_ << " slots are taken";
  const int64_t s = free_.back();
  free_.pop_back();
  taken_[static_cast<size_t>(s)] = 1;
  for (size_t k = 0; k < conv_.size(); ++k) {
    std::fill_n(conv_[k].data<float>() + s * conv_numel_, conv_numel_, 0.0f);
    std::fill_n(ssm_[k].data<float>() + s * ssm_numel_, ssm_numel_, 0.0f);
  }
  return s;
}

void MambaStatePool::release(int64_t s) {
  GALE_CHECK(s >= 0 && s < slots_ && taken_[static_cast<size_t>(s)]) << "mamba state pool: slot " << s
                                                                     << " released but not allocated";
  taken_[static_cast<size_t>(s)] = 0;
  free_.push_back(s);
}

void MambaStatePool::copy(int64_t from, int64_t to) {
  GALE_CHECK(from >= 0 && from < slots_ && to >= 0 && to < slots_) << "mamba state pool: copy " << from << " -> " << to;
  if (from == to) return;
  for (size_t k = 0; k < conv_.size(); ++k) {
    float* cv = conv_[k].data<float>();
    std::copy_n(cv + from * conv_numel_, conv_numel_, cv + to * conv_numel_);
    float* sv = ssm_[k].data<float>();
    std::copy_n(sv + from * ssm_numel_, ssm_numel_, sv + to * ssm_numel_);
  }
}

MambaStatePool MambaStatePool::clone() const {
  MambaStatePool p = *this;
  for (Tensor& t : p.conv_) t = t.clone();
  for (Tensor& t : p.ssm_) t = t.clone();
  return p;
}

}  // namespace gale
