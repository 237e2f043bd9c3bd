// ZeRO-3: per-unit parameter all-gather and gradient reduce-scatter around forward and backward.
#include "optim/zero3_sync.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/optimizer.h"

namespace gale {

Zero3Sync::Zero3Sync(ParamBuffer* params, Comm dp, const std::vector<std::vector<int>>& groups, int pinned)
    : params_(params), dp_(std::move(dp)) {
  GALE_CHECK(params_ && params_->finalized() && !params_->sharded());
  GALE_CHECK(dp_) << "ZeRO-3 needs the data-parallel group";
  dp_size_ = dp_->size();
  dp_rank_ = dp_->rank();
  std::vector<ParamUnit> units;
  for (const std::vector<int>& g : groups) {
    if (g.empty()) continue;
    ParamUnit x;
    x.begin = params_->numel();
    for (int id : g) {
      const ParamSpec& s = params_->spec(id);
      x.begin = std::min(x.begin, s.offset);
      x.end = std::max(x.end, s.offset + s.local_numel());
    }
    units.push_back(x);
  }
  std::sort(units.begin(), units.end(), [](const ParamUnit& a, const ParamUnit& b) { return a.begin < b.begin; });
  for (ParamUnit& x : units) {
    const int64_t n = x.end - x.begin;
    x.padded = (n + dp_size_ - 1) / dp_size_ * dp_size_;
    const int64_t s = x.padded / dp_size_;
    x.own_begin = std::min(x.end, x.begin + dp_rank_ * s);
    x.own_end = std::min(x.end, x.begin + (dp_rank_ + 1) * s);
  }
  params_->shard_storage(std::move(units));
  if (pinned >= 0) pinned_unit_ = params_->unit_of(pinned);
}

std::vector<FlatRange> Zero3Sync::owned_ranges() const {
  std::vector<FlatRange> owned;
  for (int u = 0; u < params_->num_units(); ++u) {
    const ParamUnit& x = params_->unit(u);
    if (x.own_end > x.own_begin) owned.push_back({x.own_begin, x.own_end});
  }
  return owned;
}

int Zero3Sync::gathered_units() const {
  int n = 0;
  for (int u = 0; u < params_->num_units(); ++u) n += params_->unit_gathered(u) ? 1 : 0;
  return n;
}

void Zero3Sync::gather(int u) {
  if (params_->unit_gathered(u)) return;
  const ParamUnit& x = params_->unit(u);
  const int64_t s = x.padded / dp_size_, own = x.own_end - x.own_begin;
  Tensor values = Tensor::empty({x.padded});
  if (dp_size_ == 1) {
    std::memcpy(values.raw(), params_->shard_values(u), static_cast<size_t>(own) * sizeof(float));
  } else {
    Tensor mine = Tensor::zeros({s});  // the last ranks' shards may be short: padded with zeros
    std::memcpy(mine.raw(), params_->shard_values(u), static_cast<size_t>(own) * sizeof(float));
    dp_->all_gather(mine.raw(), values.raw(), s, DType::kF32);
  }
  params_->set_unit_storage(u, std::move(values), Tensor::zeros({x.padded}));
  max_gathered_ = std::max(max_gathered_, gathered_units());
}

void Zero3Sync::reduce_scatter_grads(int u) {
  const ParamUnit& x = params_->unit(u);
  const int64_t s = x.padded / dp_size_, own = x.own_end - x.own_begin;
  float* g = params_->unit_grads(u).data<float>();
  float* shard = params_->shard_grads(u);
  if (dp_size_ == 1) {
    for (int64_t i = 0; i < own; ++i) shard[i] += g[i];
    return;
  }
  // Megatron's gradient_scaling_factor 1/dp, then the sum; the padding is zero on every rank.
  scale_inplace(g, x.padded, 1.0f / static_cast<float>(dp_size_));
  Tensor mine = Tensor::empty({s});
  dp_->reduce_scatter(g, mine.raw(), s, DType::kF32, ReduceOp::kSum);
  const float* r = mine.data<float>();
  for (int64_t i = 0; i < own; ++i) shard[i] += r[i];
}

void Zero3Sync::start_iteration() {
  release_all(/*write_back=*/false);  // what an evaluation forward left gathered: each iteration starts clean
  params_->zero_grads();
}

void Zero3Sync::on_params_needed(const std::vector<int>& param_ids) {
  if (param_ids.empty()) return;
  const int u = params_->unit_of(param_ids.front());
  for (int v = 0; v < params_->num_units(); ++v)
    if (v != u && v != pinned_unit_ && params_->unit_gathered(v)) params_->release_unit(v);
  gather(u);
}

void Zero3Sync::on_grads_ready(const std::vector<int>& param_ids) {
  if (param_ids.empty()) return;
  const int u = params_->unit_of(param_ids.front());
  GALE_CHECK(params_->unit_gathered(u)) << "ZeRO-3 unit " << u << " reported its gradients while not gathered";
  reduce_scatter_grads(u);
  params_->release_unit(u);
  if (u > 0) gather(u - 1);  // backward goes down the buffer: the unit below is next
}

void Zero3Sync::gather_all() {
  for (int u = 0; u < params_->num_units(); ++u) gather(u);
}

void Zero3Sync::release_all(bool write_back) {
  for (int u = 0; u < params_->num_units(); ++u) {
    if (!params_->unit_gathered(u)) continue;
    if (write_back) {
      const ParamUnit& x = params_->unit(u);
      std::memcpy(params_->shard_values(u), params_->unit_values(u).data<float>() + (x.own_begin - x.begin),
                  static_cast<size_t>(x.own_end - x.own_begin) * sizeof(float));
    }
    params_->release_unit(u);
  }
}

}  // namespace gale
