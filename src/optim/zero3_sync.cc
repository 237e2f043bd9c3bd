// ZeRO-3: per-unit parameter all-gather and gradient reduce-scatter around forward and backward.
#include "optim/zero3_sync.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/optimizer.h"

namespace gale {

Zero3Sync::Zero3Sync(ParamBuffer* params, Comm dp, const std::vector<std::vector<int>>& groups, int pinned,
                     Zero3Options options)
    : params_(params), dp_(std::move(dp)), options_(std::move(options)) {
  GALE_CHECK(params_ && params_->finalized() && !params_->sharded());
  GALE_CHECK(dp_) << "ZeRO-3 needs the data-parallel group";
  GALE_CHECK(!options_.replicas || options_.shard_params) << "LayerZeRO shards the parameters";
  dp_size_ = dp_->size();
  dp_rank_ = dp_->rank();
  if (options_.replicas) {
    replica_count_ = options_.replicas->size();
    replica_rank_ = options_.replicas->rank();
  }
  // Every unit splits into this many equal pieces (HSDP: shards only).
  const int64_t total = dp_size_ * (options_.shard_optimizer_over_replicas ? replica_count_ : 1);
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
    x.padded = (n + total - 1) / total * total;
    const int64_t s = x.padded / dp_size_;
    x.own_begin = std::min(x.end, x.begin + dp_rank_ * s);
    x.own_end = std::min(x.end, x.begin + (dp_rank_ + 1) * s);
  }
  params_->shard_storage(std::move(units), options_.shard_params);
  if (pinned >= 0) pinned_unit_ = params_->unit_of(pinned);
  root_.assign(static_cast<size_t>(params_->num_units()), 0);
  root_grads_pending_ = root_;
  for (int id : options_.root_params) root_[static_cast<size_t>(params_->unit_of(id))] = 1;
  GALE_CHECK(options_.forward_prefetch >= 0);
  if (params_->gathers_bf16()) {  // FSDP2 param_dtype bf16: what each rank sends of each unit
    const int n = params_->num_units();
    pieces_.assign(static_cast<size_t>(n), std::vector<Piece>(static_cast<size_t>(dp_size_)));
    payload_words_.assign(static_cast<size_t>(n), 0);
    unit_f32_numel_.assign(static_cast<size_t>(n), 0);
    unit_bf16_numel_.assign(static_cast<size_t>(n), 0);
    std::vector<std::vector<int>>& members = unit_members_;
    members.assign(static_cast<size_t>(n), {});
    for (int id = 0; id < params_->size(); ++id) members[static_cast<size_t>(params_->unit_of(id))].push_back(id);
    for (std::vector<int>& m : members)
      std::sort(m.begin(), m.end(), [this](int a, int b) { return params_->spec(a).offset < params_->spec(b).offset; });
    for (int u = 0; u < n; ++u) {
      const ParamUnit& x = params_->unit(u);
      const int64_t s = x.padded / dp_size_;
      for (int64_t r = 0; r < dp_size_; ++r) {
        const int64_t a = std::min(x.end, x.begin + r * s), b = std::min(x.end, x.begin + (r + 1) * s);
        Piece& p = pieces_[static_cast<size_t>(u)][static_cast<size_t>(r)];
        for (int id : members[static_cast<size_t>(u)]) {  // each parameter's elements before, and inside, [a, b)
          const ParamSpec& sp = params_->spec(id);
          const int64_t lo = sp.offset, hi = sp.offset + sp.local_numel();
          const int64_t before = std::max<int64_t>(0, std::min(hi, a) - lo);
          const int64_t inside = std::max<int64_t>(0, std::min(hi, b) - std::max(lo, a));
          (sp.gemm_weight ? p.bf16_at : p.f32_at) += before;
          (sp.gemm_weight ? p.bf16_count : p.f32_count) += inside;
        }
        payload_words_[static_cast<size_t>(u)] =
            std::max(payload_words_[static_cast<size_t>(u)], 2 * p.f32_count + p.bf16_count);
        unit_f32_numel_[static_cast<size_t>(u)] += p.f32_count;
        unit_bf16_numel_[static_cast<size_t>(u)] += p.bf16_count;
      }
    }
  }
}

Tensor Zero3Sync::pack_bf16_payload(int u) const {
  const Piece& p = pieces_[static_cast<size_t>(u)][static_cast<size_t>(dp_rank_)];
  const ParamUnit& x = params_->unit(u);
  Tensor mine = Tensor::zeros({std::max<int64_t>(payload_words(u), 1)}, DType::kBF16);
  float* f32 = reinterpret_cast<float*>(mine.raw());  // f32_count f32 elements, then bf16_count bf16 ones
  bf16* half = mine.data<bf16>() + 2 * p.f32_count;
  const float* shard = params_->shard_values(u);
  int64_t nf = 0, nb = 0;
  for (int id : unit_members_[static_cast<size_t>(u)]) {  // flat order: each kind's elements in flat order
    const ParamSpec& sp = params_->spec(id);
    const int64_t lo = std::max(sp.offset, x.own_begin), hi = std::min(sp.offset + sp.local_numel(), x.own_end);
    if (hi <= lo) continue;
    if (sp.gemm_weight) {
      convert_f32_to_bf16(shard + (lo - x.own_begin), half + nb, hi - lo);
      nb += hi - lo;
    } else {
      std::memcpy(f32 + nf, shard + (lo - x.own_begin), static_cast<size_t>(hi - lo) * sizeof(float));
      nf += hi - lo;
    }
  }
  GALE_CHECK(nf == p.f32_count && nb == p.bf16_count) << "unit " << u << ": the bf16 payload does not match its plan";
  return mine;
}

void Zero3Sync::unpack_bf16_payloads(int u, const Tensor& all) {
  const ParamUnit& x = params_->unit(u);
  Tensor values = Tensor::empty({std::max<int64_t>(unit_f32_numel_[static_cast<size_t>(u)], 1)});
  Tensor values_bf16 = Tensor::empty({std::max<int64_t>(unit_bf16_numel_[static_cast<size_t>(u)], 1)}, DType::kBF16);
  const int64_t w = payload_words(u);
  for (int64_t r = 0; r < dp_size_; ++r) {
    const Piece& p = pieces_[static_cast<size_t>(u)][static_cast<size_t>(r)];
    const bf16* payload = all.data<bf16>() + r * w;
    std::memcpy(values.data<float>() + p.f32_at, payload, static_cast<size_t>(p.f32_count) * sizeof(float));
    std::memcpy(values_bf16.data<bf16>() + p.bf16_at, payload + 2 * p.f32_count,
                static_cast<size_t>(p.bf16_count) * sizeof(bf16));
  }
  params_->set_unit_storage_bf16(u, std::move(values), std::move(values_bf16), Tensor::zeros({x.padded}));
}

std::pair<int64_t, int64_t> Zero3Sync::piece(int u) const {
  const ParamUnit& x = params_->unit(u);
  const int64_t own = x.own_end - x.own_begin;
  if (!options_.shard_optimizer_over_replicas) return {0, own};  // HSDP: the whole shard
  const int64_t p = x.padded / dp_size_ / replica_count_;
  return {std::min(own, replica_rank_ * p), std::min(own, (replica_rank_ + 1) * p)};
}

std::vector<FlatRange> Zero3Sync::owned_ranges() const {
  std::vector<FlatRange> owned;
  for (int u = 0; u < params_->num_units(); ++u) {
    const ParamUnit& x = params_->unit(u);
    const auto [a, b] = piece(u);  // the whole shard without replicas
    if (b > a) owned.push_back({x.own_begin + a, x.own_begin + b});
  }
  return owned;
}

void Zero3Sync::finish_grad_sync() {
  if (!options_.replicas || replica_count_ == 1) return;
  int64_t n = 0;  // the compact gradient shards: the same layout on every replica
  for (int u = 0; u < params_->num_units(); ++u) n += params_->unit(u).own_end - params_->unit(u).own_begin;
  if (n <= 0 || params_->num_units() == 0) return;
  if (options_.reduce_bf16) {  // reduce_dtype bf16: the replicas' sum in bf16 too
    Tensor half = Tensor::empty({n}, DType::kBF16);
    convert_f32_to_bf16(params_->shard_grads(0), half.data<bf16>(), n);
    options_.replicas->all_reduce(half.raw(), n, DType::kBF16, ReduceOp::kSum);
    convert_bf16_to_f32(half.data<bf16>(), params_->shard_grads(0), n);
    return;
  }
  options_.replicas->all_reduce(params_->shard_grads(0), n, DType::kF32, ReduceOp::kSum);
}

void Zero3Sync::after_optimizer_step() {
  if (!options_.shard_params) {  // ZeRO-2: the updated shards into every rank's whole values
    for (int u = 0; u < params_->num_units(); ++u) {
      const ParamUnit& x = params_->unit(u);
      const int64_t s = x.padded / dp_size_, own = x.own_end - x.own_begin;
      if (dp_size_ == 1) continue;
      Tensor mine = Tensor::zeros({s}), all = Tensor::empty({x.padded});
      std::memcpy(mine.raw(), params_->master_data(x.own_begin), static_cast<size_t>(own) * sizeof(float));
      dp_->all_gather(mine.raw(), all.raw(), s, DType::kF32);
      std::memcpy(params_->master_data(x.begin), all.raw(), static_cast<size_t>(x.end - x.begin) * sizeof(float));
    }
    return;
  }
  if (!options_.replicas || replica_count_ == 1 || !options_.shard_optimizer_over_replicas) return;
  for (int u = 0; u < params_->num_units(); ++u) {  // LayerZeRO: the updated pieces into the shard
    const ParamUnit& x = params_->unit(u);
    const int64_t own = x.own_end - x.own_begin, p = x.padded / dp_size_ / replica_count_;
    const auto [a, b] = piece(u);
    Tensor mine = Tensor::zeros({p}), all = Tensor::empty({p * replica_count_});
    std::memcpy(mine.raw(), params_->shard_values(u) + a, static_cast<size_t>(b - a) * sizeof(float));
    options_.replicas->all_gather(mine.raw(), all.raw(), p, DType::kF32);
    std::memcpy(params_->shard_values(u), all.raw(), static_cast<size_t>(own) * sizeof(float));
  }
}

int Zero3Sync::gathered_units() const {
  int n = 0;
  for (int u = 0; u < params_->num_units(); ++u) n += params_->unit_gathered(u) ? 1 : 0;
  return n;
}

bool Zero3Sync::pending(int u) const {
  for (const Pending& p : pending_)
    if (p.unit == u) return true;
  return false;
}

void Zero3Sync::note_peak() {
  int64_t bytes = params_->gathered_bytes();
  for (const Pending& p : pending_) bytes += static_cast<int64_t>(p.values.nbytes());
  max_gathered_bytes_ = std::max(max_gathered_bytes_, bytes);
  max_gathered_ = std::max(max_gathered_, gathered_units());
}

void Zero3Sync::start_gather(int u) {
  if (params_->unit_gathered(u) || pending(u)) return;
  const ParamUnit& x = params_->unit(u);
  const int64_t s = x.padded / dp_size_, own = x.own_end - x.own_begin;
  Pending p;
  p.unit = u;
  if (bf16_gather(u)) {  // param_dtype bf16: the packed payloads
    p.mine = pack_bf16_payload(u);
    p.values = Tensor::empty({p.mine.numel() * dp_size_}, DType::kBF16);
    p.work = dp_->all_gather_async(p.mine.raw(), p.values.raw(), p.mine.numel(), DType::kBF16);
    pending_.push_back(std::move(p));
    ++prefetched_;
    note_peak();
    return;
  }
  p.values = Tensor::empty({x.padded});
  p.mine = Tensor::zeros({s});  // the last ranks' shards may be short: padded with zeros
  std::memcpy(p.mine.raw(), params_->shard_values(u), static_cast<size_t>(own) * sizeof(float));
  p.work = dp_->all_gather_async(p.mine.raw(), p.values.raw(), s, DType::kF32);
  pending_.push_back(std::move(p));
  ++prefetched_;
  note_peak();
}

void Zero3Sync::gather(int u, bool full) {
  if (params_->unit_gathered(u)) return;
  const ParamUnit& x = params_->unit(u);
  for (size_t i = 0; i < pending_.size(); ++i) {  // prefetched: wait for it
    if (pending_[i].unit != u) continue;
    Pending p = std::move(pending_[i]);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    p.work->wait();
    if (bf16_gather(u)) {
      p.mine = Tensor();
      unpack_bf16_payloads(u, p.values);
    } else {
      params_->set_unit_storage(u, std::move(p.values), Tensor::zeros({x.padded}));
    }
    note_peak();
    return;
  }
  if (!full && bf16_gather(u)) {  // param_dtype bf16: one all-gather of the packed payloads
    Tensor mine = pack_bf16_payload(u);
    Tensor all = Tensor::empty({mine.numel() * dp_size_}, DType::kBF16);
    if (dp_size_ == 1)
      std::memcpy(all.raw(), mine.raw(), mine.nbytes());
    else
      dp_->all_gather(mine.raw(), all.raw(), mine.numel(), DType::kBF16);
    mine = Tensor();
    unpack_bf16_payloads(u, all);
    all = Tensor();
    note_peak();
    return;
  }
  if (!options_.shard_params) {  // ZeRO-2: the values are whole; only the gradient buffer
    params_->set_unit_storage(u, Tensor(), Tensor::zeros({x.padded}));
    note_peak();
    return;
  }
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
  note_peak();
}

void Zero3Sync::reduce_scatter_grads(int u) {
  const ParamUnit& x = params_->unit(u);
  const int64_t s = x.padded / dp_size_, own = x.own_end - x.own_begin;
  float* g = params_->unit_grads(u).data<float>();
  float* shard = params_->shard_grads(u);
  if (options_.reduce_bf16) {  // reduce_dtype bf16: the scaled gradient as bf16, summed as bf16
    scale_inplace(g, x.padded, 1.0f / static_cast<float>(dp_size_ * replica_count_));
    Tensor half = Tensor::empty({x.padded}, DType::kBF16);
    convert_f32_to_bf16(g, half.data<bf16>(), x.padded);
    Tensor mine = Tensor::empty({s}, DType::kBF16);
    if (dp_size_ == 1)
      std::memcpy(mine.raw(), half.raw(), static_cast<size_t>(s) * sizeof(bf16));
    else
      dp_->reduce_scatter(half.raw(), mine.raw(), s, DType::kBF16, ReduceOp::kSum);
    const bf16* r = mine.data<bf16>();
    for (int64_t i = 0; i < own; ++i) shard[i] += bf16_to_float(r[i]);
    return;
  }
  if (dp_size_ == 1) {
    const float scale = 1.0f / static_cast<float>(replica_count_);
    for (int64_t i = 0; i < own; ++i) shard[i] += g[i] * scale;
    return;
  }
  // Megatron's gradient_scaling_factor 1/dp (LayerZeRO: over the whole DP group, whose replicas
  // finish_grad_sync sums), then the sum; the padding is zero on every rank.
  scale_inplace(g, x.padded, 1.0f / static_cast<float>(dp_size_ * replica_count_));
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
  const int n = params_->num_units();
  if (options_.reshard_after_forward)
    for (int v = 0; v < n; ++v)
      if (v != u && v != pinned_unit_ && !root_[static_cast<size_t>(v)] && params_->unit_gathered(v))
        params_->release_unit(v);
  for (int v = 0; v < n; ++v)  // FSDP2's root: before the first unit's forward, in unit order
    if (root_[static_cast<size_t>(v)]) gather(v);
  gather(u);
  if (options_.forward_prefetch > 0 && options_.shard_params && dp_size_ > 1 && !root_[static_cast<size_t>(u)]) {
    int started = 0;  // the next wrapped units, in forward (buffer) order
    for (int v = u + 1; v < n && started < options_.forward_prefetch; ++v) {
      if (root_[static_cast<size_t>(v)]) continue;
      start_gather(v);
      ++started;
    }
  }
}

void Zero3Sync::on_grads_ready(const std::vector<int>& param_ids) {
  if (param_ids.empty()) return;
  const int u = params_->unit_of(param_ids.front());
  GALE_CHECK(params_->unit_gathered(u)) << "ZeRO-3 unit " << u << " reported its gradients while not gathered";
  if (root_[static_cast<size_t>(u)]) {
    root_grads_pending_[static_cast<size_t>(u)] = 1;  // FSDP2's root: reduce-scattered at the end
  } else {
    reduce_scatter_grads(u);
    params_->release_unit(u);
  }
  if (u > 0) {
    gather(u - 1);  // backward goes down the buffer: the unit below is next
    return;
  }
  for (int v = 0; v < params_->num_units(); ++v) {  // the lowest unit's backward ends the backward
    if (!root_grads_pending_[static_cast<size_t>(v)]) continue;
    root_grads_pending_[static_cast<size_t>(v)] = 0;
    reduce_scatter_grads(v);
    params_->release_unit(v);
  }
}

void Zero3Sync::gather_all() {
  if (!options_.shard_params) return;  // ZeRO-2: the values are whole
  for (int u = 0; u < params_->num_units(); ++u) gather(u, /*full=*/true);  // f32 (param_dtype bf16 too)
}

void Zero3Sync::release_all(bool write_back) {
  for (Pending& p : pending_) p.work->wait();  // an unused prefetch (an evaluation's forward)
  pending_.clear();
  std::fill(root_grads_pending_.begin(), root_grads_pending_.end(), 0);
  for (int u = 0; u < params_->num_units(); ++u) {
    if (!params_->unit_gathered(u)) continue;
    if (write_back && options_.shard_params) {
      GALE_CHECK(!params_->gathers_bf16() || !params_->unit_values_bf16(u).defined())
          << "ZeRO-3 unit " << u << " is gathered in bf16: no f32 values to write back (gather_all gathers f32)";
      const ParamUnit& x = params_->unit(u);
      std::memcpy(params_->shard_values(u), params_->unit_values(u).data<float>() + (x.own_begin - x.begin),
                  static_cast<size_t>(x.own_end - x.own_begin) * sizeof(float));
    }
    params_->release_unit(u);
  }
}

}  // namespace gale
