// The recurrent (Mamba and Gated DeltaNet) layers' decoding state slots.
#include "model/mamba_state.h"

#include <algorithm>

#include "core/check.h"
#include "model/gated_delta_net.h"
#include "model/mamba_mixer.h"

namespace gale {

MambaStatePool::MambaStatePool(const ModelConfig& c, const ModelPartition& part, int64_t slots, int64_t steps)
    : slots_(slots), steps_(steps) {
  GALE_CHECK(slots >= 0 && steps >= 0) << "mamba state pool of " << slots << " slots, " << steps << " steps";
  int64_t numel = 0;
  for (int64_t i = 0; i < part.num_layers; ++i) {
    const int64_t layer = part.first_layer + i;
    int64_t conv = 0, ssm = 0;  // one slot's floats (K = 1: no history, one unused row)
    if (c.is_noop_layer(layer)) {
    } else if (c.hybrid.enabled && c.hybrid.is_mamba_layer(layer)) {
      const MambaDims d = MambaDims::of(c);
      conv = std::max<int64_t>(d.K - 1, 1) * d.conv_dim();
      ssm = d.NH * d.P * d.N;
    } else if (c.gdn.is_gdn_layer(layer)) {
      const GdnDims d = GdnDims::of(c);
      conv = std::max<int64_t>(d.K - 1, 1) * d.conv_dim();
      ssm = d.NV * d.DK * d.DV;
    }
    if (conv == 0) {
      index_.push_back(-1);
      continue;
    }
    index_.push_back(static_cast<int64_t>(conv_.size()));
    conv_.push_back(Tensor::zeros({std::max<int64_t>(slots, 1), conv}));
    ssm_.push_back(Tensor::zeros({std::max<int64_t>(slots, 1), ssm}));
    if (steps > 0) {
      conv_steps_.push_back(Tensor::zeros({std::max<int64_t>(slots, 1), steps * conv}));
      ssm_steps_.push_back(Tensor::zeros({std::max<int64_t>(slots, 1), steps * ssm}));
    }
    numel += (1 + steps) * (conv + ssm);
  }
  slot_bytes_ = numel * static_cast<int64_t>(sizeof(float));
  for (int64_t s = slots - 1; s >= 0; --s) free_.push_back(s);
  taken_.assign(static_cast<size_t>(slots), 0);
}

int64_t MambaStatePool::index(int64_t layer) const {
  const int64_t k = layer >= 0 && layer < static_cast<int64_t>(index_.size()) ? index_[static_cast<size_t>(layer)] : -1;
  GALE_CHECK(k >= 0) << "mamba state pool: local layer " << layer << " is not a Mamba or GDN layer";
  return k;
}

float* MambaStatePool::conv(int64_t layer, int64_t slot) {
  GALE_CHECK(slot >= 0 && slot < slots_) << "mamba state pool: slot " << slot << " of " << slots_;
  const Tensor& t = conv_[static_cast<size_t>(index(layer))];
  return t.data<float>() + slot * t.size(1);
}

float* MambaStatePool::ssm(int64_t layer, int64_t slot) {
  GALE_CHECK(slot >= 0 && slot < slots_) << "mamba state pool: slot " << slot << " of " << slots_;
  const Tensor& t = ssm_[static_cast<size_t>(index(layer))];
  return t.data<float>() + slot * t.size(1);
}

float* MambaStatePool::conv_step(int64_t layer, int64_t slot, int64_t j) {
  GALE_CHECK(slot >= 0 && slot < slots_ && j >= 0 && j < steps_)
      << "mamba state pool: slot " << slot << " of " << slots_ << ", step " << j << " of " << steps_;
  const int64_t k = index(layer);
  const int64_t one = conv_[static_cast<size_t>(k)].size(1);
  const Tensor& t = conv_steps_[static_cast<size_t>(k)];
  return t.data<float>() + slot * t.size(1) + j * one;
}

float* MambaStatePool::ssm_step(int64_t layer, int64_t slot, int64_t j) {
  GALE_CHECK(slot >= 0 && slot < slots_ && j >= 0 && j < steps_)
      << "mamba state pool: slot " << slot << " of " << slots_ << ", step " << j << " of " << steps_;
  const int64_t k = index(layer);
  const int64_t one = ssm_[static_cast<size_t>(k)].size(1);
  const Tensor& t = ssm_steps_[static_cast<size_t>(k)];
  return t.data<float>() + slot * t.size(1) + j * one;
}

void MambaStatePool::keep_step(int64_t slot, int64_t j) {
  GALE_CHECK(slot >= 0 && slot < slots_ && j >= 0 && j < steps_)
      << "mamba state pool: keep step " << j << " of " << steps_ << " in slot " << slot << " of " << slots_;
  for (size_t k = 0; k < conv_.size(); ++k) {
    const int64_t c = conv_[k].size(1), s = ssm_[k].size(1);
    std::copy_n(conv_steps_[k].data<float>() + slot * conv_steps_[k].size(1) + j * c, c, conv_[k].data<float>() + slot * c);
    std::copy_n(ssm_steps_[k].data<float>() + slot * ssm_steps_[k].size(1) + j * s, s, ssm_[k].data<float>() + slot * s);
  }
}

int64_t MambaStatePool::allocate() {
  GALE_CHECK(!free_.empty()) << "mamba state pool: all " << slots_ << " slots are taken";
  const int64_t s = free_.back();
  free_.pop_back();
  taken_[static_cast<size_t>(s)] = 1;
  for (std::vector<Tensor>* states : {&conv_, &ssm_})
    for (Tensor& t : *states) std::fill_n(t.data<float>() + s * t.size(1), t.size(1), 0.0f);
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
  for (std::vector<Tensor>* states : {&conv_, &ssm_})
    for (Tensor& t : *states) {
      float* v = t.data<float>();
      std::copy_n(v + from * t.size(1), t.size(1), v + to * t.size(1));
    }
}

MambaStatePool MambaStatePool::clone() const {
  MambaStatePool p = *this;
  for (Tensor& t : p.conv_) t = t.clone();
  for (Tensor& t : p.ssm_) t = t.clone();
  for (Tensor& t : p.conv_steps_) t = t.clone();
  for (Tensor& t : p.ssm_steps_) t = t.clone();
  return p;
}

}  // namespace gale
