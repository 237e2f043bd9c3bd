// Hot-expert choice, replica broadcast and gradient return of --balanced-moe-experts.
#include "model/moe_hot_experts.h"

#include <array>

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "model/moe_dispatch.h"
#include "model/moe_layer.h"

namespace gale {

namespace {

constexpr int kGradTag = 4711;  // the replicas' gradient transfers (point-to-point on the hot groups)

}  // namespace

std::vector<int64_t> select_hot_experts(const std::vector<int64_t>& counts, int64_t ep, int64_t num_experts,
                                        int64_t n) {
  const int64_t E = num_experts, El = E / ep;
  GALE_CHECK(ep >= 1 && E % ep == 0 && static_cast<int64_t>(counts.size()) == ep * E && n >= 0 && n <= E)
      << "hot experts: " << n << " of " << E << " over " << ep << " ranks, " << counts.size() << " counts";
  std::vector<int64_t> per_expert(static_cast<size_t>(E), 0);  // every rank's rows of expert e
  for (int64_t s = 0; s < ep; ++s)
    for (int64_t e = 0; e < E; ++e) per_expert[e] += counts[s * E + e];
  std::vector<int64_t> load(static_cast<size_t>(ep), 0);  // rows each rank computes
  for (int64_t e = 0; e < E; ++e) load[e / El] += per_expert[e];
  std::vector<bool> taken(static_cast<size_t>(E), false);
  std::vector<int64_t> hot;
  for (int64_t i = 0; i < n; ++i) {
    // the busiest rank (the first on ties), and its busiest expert not yet taken (the first on ties)
    const int64_t r = std::max_element(load.begin(), load.end()) - load.begin();
    int64_t best = -1;
    for (int64_t e = r * El; e < (r + 1) * El; ++e)
      if (!taken[e] && (best < 0 || per_expert[e] > per_expert[best])) best = e;
    if (best < 0) {  // every expert of the busiest rank is taken: the busiest expert anywhere
      for (int64_t e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || per_expert[e] > per_expert[best])) best = e;
    }
    taken[best] = true;
    hot.push_back(best);
    const int64_t owner = best / El;
    load[owner] -= per_expert[best];
    for (int64_t s = 0; s < ep; ++s) load[s] += counts[s * E + best];
  }
  std::sort(hot.begin(), hot.end());
  return hot;
}

std::vector<int64_t> expert_rows_per_rank(const std::vector<int64_t>& counts, int64_t ep, int64_t num_experts,
                                          const std::vector<int64_t>& hot) {
  const int64_t E = num_experts, El = E / ep;
  std::vector<bool> is_hot(static_cast<size_t>(E), false);
  for (int64_t e : hot) is_hot[e] = true;
  std::vector<int64_t> rows(static_cast<size_t>(ep), 0);
  for (int64_t s = 0; s < ep; ++s)
    for (int64_t e = 0; e < E; ++e) rows[is_hot[e] ? s : e / El] += counts[s * E + e];
  return rows;
}

namespace {

// Local expert j's parameter ids in the packed order (-1: absent): fc1_w, fc1_b, fc2_w, fc2_b and
// the LoRA factors of fc1 (A, B) and fc2 (A, B), found by name beside the weights.
std::array<int, 8> packed_ids(const ParamBuffer& pb, const MoeParamIds& w, size_t j) {
  const std::string& fc1 = pb.spec(w.fc1_w[j]).name;
  const std::string& fc2 = pb.spec(w.fc2_w[j]).name;
  return {w.fc1_w[j],          w.fc1_b[j],          w.fc2_w[j],          w.fc2_b[j],
          pb.find(lora_a_name(fc1)), pb.find(lora_b_name(fc1)), pb.find(lora_a_name(fc2)), pb.find(lora_b_name(fc2))};
}

}  // namespace

MoeHotExperts::MoeHotExperts(const Comm& ep, const std::vector<Comm>& groups, const ParamBuffer& pb,
                             const MoeParamIds& w, const std::vector<int64_t>& counts, int64_t n)
    : ep_(ep), groups_(groups) {
  const int64_t P = ep->size(), me = ep->rank();
  num_experts_ = static_cast<int64_t>(counts.size());
  local_experts_ = num_experts_ / P;
  GALE_CHECK_EQ(static_cast<int64_t>(w.fc1_w.size()), local_experts_) << "local experts";
  if (groups_.empty()) groups_.push_back(ep);
  for (const Comm& g : groups_) GALE_CHECK(g && g->size() == P && g->rank() == me) << "hot-expert groups";
  // every rank's rows per expert (one all-gather of E int64)
  counts_.resize(static_cast<size_t>(P * num_experts_));
  ep->all_gather(counts.data(), counts_.data(), num_experts_, DType::kI64);
  hot_ = select_hot_experts(counts_, P, num_experts_, n);
  // the packed layout of one expert's parameters (the same on every rank: local expert 0's shapes)
  int64_t at = 0;
  for (int id : packed_ids(pb, w, 0)) {
    Part part;
    if (id >= 0) {
      const ParamSpec& s = pb.spec(id);
      part.trainable = s.trainable;
      GALE_CHECK(!pb.is_split(id) && s.qat_element == MxElement::kNone)
          << "--balanced-moe-experts with --reuse-fp32-param or --qat-scheme: " << s.name;
      const Shape shape = s.local_shape();
      part.numel = s.local_numel();
      part.rows = shape[0];
      part.cols = shape.size() > 1 ? shape[1] : 1;
    }
    part.offset = at;
    at += part.numel;
    layout_.push_back(part);
  }
  packed_numel_ = at;
  copy_dtype_ = pb.gemm_copy_dtype();
  // the replicas: the hot experts of other ranks, in expert order
  remote_slot_.assign(static_cast<size_t>(num_experts_), -1);
  for (int64_t e : hot_) {
    const int64_t owner = e / local_experts_;
    if (owner == me) continue;
    remote_slot_[e] = static_cast<int64_t>(replicas_.size());
    Replica r;
    r.expert = e;
    r.owner = owner;
    r.values = Tensor::empty({packed_numel_});
    r.grads = Tensor::zeros({packed_numel_});
    if (copy_dtype_ != DType::kF32) r.gemm_copy = Tensor::empty({packed_numel_}, copy_dtype_);
    replicas_.push_back(std::move(r));
  }
  moe_dispatch_counters().replicas += static_cast<long long>(replicas_.size());
  // the broadcasts: each hot expert from its owner, on the owner's group, all issued then waited for
  std::vector<Tensor> sent;  // the owners' packed copies, alive until the waits
  std::vector<WorkPtr> works;
  for (int64_t e : hot_) {
    const int64_t owner = e / local_experts_;
    const Comm& g = group_of(owner);
    Tensor values, copy;
    if (owner == me) {
      const int64_t j = e - me * local_experts_;
      const std::array<int, 8> ids = packed_ids(pb, w, static_cast<size_t>(j));
      values = Tensor::empty({packed_numel_});
      if (copy_dtype_ != DType::kF32) copy = Tensor::zeros({packed_numel_}, copy_dtype_);
      const size_t half = dtype_size(copy_dtype_);
      for (int p = 0; p < 8; ++p) {
        if (layout_[p].numel == 0) continue;
        std::memcpy(values.data<float>() + layout_[p].offset, pb.param_data(ids[p]),
                    static_cast<size_t>(layout_[p].numel) * sizeof(float));
        if (copy.defined() && p < 4) {  // the GEMM copies of the expert (the adapters run in f32)
          const void* src = copy_dtype_ == DType::kBF16 ? static_cast<const void*>(pb.param_bf16_data(ids[p]))
                                                        : static_cast<const void*>(pb.param_f16_data(ids[p]));
          std::memcpy(static_cast<char*>(copy.raw()) + layout_[p].offset * half, src,
                      static_cast<size_t>(layout_[p].numel) * half);
        }
      }
      sent.push_back(values);
      if (copy.defined()) sent.push_back(copy);
    } else {
      Replica& r = replicas_[static_cast<size_t>(remote_slot_[e])];
      values = r.values;
      copy = r.gemm_copy;
    }
    works.push_back(g->broadcast_async(values.raw(), packed_numel_, DType::kF32, static_cast<int>(owner)));
    if (copy.defined())
      works.push_back(g->broadcast_async(copy.raw(), packed_numel_, copy_dtype_, static_cast<int>(owner)));
  }
  for (const WorkPtr& work : works) work->wait();
}

const Comm& MoeHotExperts::group_of(int64_t owner) const {
  return groups_[static_cast<size_t>(owner % static_cast<int64_t>(groups_.size()))];
}

LinearWeight MoeHotExperts::weight(int64_t slot, int part, SgemmFn gemm, Bf16GemmFn bf16_gemm) const {
  const Replica& r = replicas_[static_cast<size_t>(slot)];
  const Part& p = layout_[static_cast<size_t>(part)];
  LinearWeight w;
  w.w = r.values.data<float>() + p.offset;
  if (copy_dtype_ == DType::kBF16) w.w_bf16 = r.gemm_copy.data<bf16>() + p.offset;
  if (copy_dtype_ == DType::kF16) w.w_f16 = r.gemm_copy.data<f16>() + p.offset;
  w.grad = p.trainable ? const_cast<float*>(r.grads.data<float>()) + p.offset : nullptr;
  w.out = p.rows;
  w.in = p.cols;
  w.gemm = gemm;
  w.bf16_gemm = bf16_gemm;
  return w;
}

LinearWeight MoeHotExperts::fc1(int64_t slot, SgemmFn gemm, Bf16GemmFn bf16_gemm) const {
  return weight(slot, 0, gemm, bf16_gemm);
}
LinearWeight MoeHotExperts::fc2(int64_t slot, SgemmFn gemm, Bf16GemmFn bf16_gemm) const {
  return weight(slot, 2, gemm, bf16_gemm);
}
const float* MoeHotExperts::fc1_bias(int64_t slot) const {
  return layout_[1].numel ? replicas_[static_cast<size_t>(slot)].values.data<float>() + layout_[1].offset : nullptr;
}
const float* MoeHotExperts::fc2_bias(int64_t slot) const {
  return layout_[3].numel ? replicas_[static_cast<size_t>(slot)].values.data<float>() + layout_[3].offset : nullptr;
}
float* MoeHotExperts::fc1_bias_grad(int64_t slot) {
  return layout_[1].numel ? replicas_[static_cast<size_t>(slot)].grads.data<float>() + layout_[1].offset : nullptr;
}
float* MoeHotExperts::fc2_bias_grad(int64_t slot) {
  return layout_[3].numel ? replicas_[static_cast<size_t>(slot)].grads.data<float>() + layout_[3].offset : nullptr;
}

LoraWeights MoeHotExperts::lora(int64_t slot, int a_part, float scaling, SgemmFn gemm) const {
  const Part& a = layout_[static_cast<size_t>(a_part)];
  const Part& b = layout_[static_cast<size_t>(a_part + 1)];
  if (a.numel == 0) return LoraWeights{};
  const Replica& r = replicas_[static_cast<size_t>(slot)];
  float* grads = const_cast<float*>(r.grads.data<float>());
  return LoraWeights{r.values.data<float>() + a.offset, r.values.data<float>() + b.offset, grads + a.offset,
                     grads + b.offset, a.rows, b.rows, a.cols, scaling, gemm};
}
LoraWeights MoeHotExperts::fc1_lora(int64_t slot, float scaling, SgemmFn gemm) const {
  return lora(slot, 4, scaling, gemm);
}
LoraWeights MoeHotExperts::fc2_lora(int64_t slot, float scaling, SgemmFn gemm) const {
  return lora(slot, 6, scaling, gemm);
}

void MoeHotExperts::reduce_grads_to_owners(ParamBuffer& pb, const MoeParamIds& w) {
  const int64_t P = ep_->size(), me = ep_->rank(), E = num_experts_;
  struct Incoming {
    int64_t expert, source;
    Tensor grads;
  };
  std::vector<Incoming> incoming;
  std::vector<WorkPtr> works;
  for (int64_t e : hot_) {
    const int64_t owner = e / local_experts_;
    const Comm& g = group_of(owner);
    if (owner == me) {
      for (int64_t s = 0; s < P; ++s) {
        if (s == me || counts_[s * E + e] == 0) continue;
        incoming.push_back({e, s, Tensor::empty({packed_numel_})});
        works.push_back(g->recv_async(incoming.back().grads.raw(), packed_numel_, DType::kF32, static_cast<int>(s),
                                      kGradTag));
      }
    } else if (counts_[me * E + e] > 0) {
      const Replica& r = replicas_[static_cast<size_t>(remote_slot_[e])];
      works.push_back(g->send_async(r.grads.raw(), packed_numel_, DType::kF32, static_cast<int>(owner), kGradTag));
    }
  }
  for (const WorkPtr& work : works) work->wait();
  // the owner adds them to its expert's gradients in (expert, source rank) order
  for (const Incoming& in : incoming) {
    const int64_t j = in.expert - me * local_experts_;
    const std::array<int, 8> ids = packed_ids(pb, w, static_cast<size_t>(j));
    for (int p = 0; p < 8; ++p) {
      if (layout_[p].numel == 0 || !layout_[p].trainable) continue;  // LoRA's frozen expert: no gradient
      float* dst = pb.grad_data(ids[p]);
      const float* src = in.grads.data<float>() + layout_[p].offset;
      for (int64_t i = 0; i < layout_[p].numel; ++i) dst[i] += src[i];
    }
  }
}

}  // namespace gale
