// --quant-grads: a chunk's main gradients as FP16 codes with per-parameter scales, f32 storage per
// drain unit (optim/quant_grads.h).
#include "optim/quant_grads.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "kernels/cpu/fused_ops.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/quant_grads.h"

namespace gale {

namespace {

// Slots start on 64-byte boundaries (16 floats), as the flat buffer's vector loops like them.
int64_t aligned(int64_t n) { return (n + 15) / 16 * 16; }

}  // namespace

QuantGradStore::QuantGradStore(ParamBuffer* params, const DataParallelSync* sync,
                               const std::vector<std::vector<int>>& units, const std::vector<int>& resident,
                               double sum_factor)
    : params_(params), sync_(sync) {
  GALE_CHECK(sync_) << "--quant-grads reduces through the chunk's data-parallel sync";
  dp_ = sync_->group();
  const double n = static_cast<double>(sync_->dp_size());
  const double h = sum_factor > 0.0 ? n * sum_factor : 1.0;
  if (h > 1.0) headroom_ = static_cast<float>(h);
  GALE_CHECK(params_->flat_grads().defined()) << "--quant-grads needs the flat f32 gradient buffer to replace";
  const size_t np = static_cast<size_t>(params_->size());
  codes_ = Tensor::zeros({std::max<int64_t>(params_->trainable_numel(), 1)}, DType::kF16);
  scales_.assign(np, 0.0f);
  for (int id = 0; id < params_->size(); ++id)
    if (holds(id)) scales_[static_cast<size_t>(id)] = 1.0f;
  // Resident: named, in no unit, or in more than one.
  resident_.assign(np, false);
  for (int id : resident) resident_.at(static_cast<size_t>(id)) = true;
  std::vector<int> seen(np, 0);
  for (const std::vector<int>& u : units)
    for (int id : u) ++seen.at(static_cast<size_t>(id));
  for (size_t id = 0; id < np; ++id)
    if (seen[id] != 1) resident_[id] = true;
  slot_.assign(np, 0);
  int64_t at = 0;
  for (int id = 0; id < params_->size(); ++id)
    if (params_->spec(id).trainable && resident_[static_cast<size_t>(id)]) {
      slot_[static_cast<size_t>(id)] = at;
      at += aligned(params_->spec(id).local_numel());
    }
  scratch_begin_ = at;
  // Each unit's other parameters packed from the scratch's start; the scratch is the largest unit,
  // at least dp + 1 elements (one reduce-scatter piece and its result).
  int64_t scratch = sync_->dp_size() + 1;
  for (const std::vector<int>& u : units) {
    int64_t off = 0;
    for (int id : u) {
      if (!params_->spec(id).trainable || resident_[static_cast<size_t>(id)]) continue;
      slot_[static_cast<size_t>(id)] = scratch_begin_ + off;
      off += aligned(params_->spec(id).local_numel());
    }
    scratch = std::max(scratch, off);
  }
  storage_ = Tensor::zeros({scratch_begin_ + scratch});
  params_->alias_grads(slot_, storage_);
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
  storage_.zero();
  factors_.clear();
}

void QuantGradStore::accumulate(const std::vector<int>& param_ids) {
  for (int id : param_ids) {
    if (!holds(id)) continue;
    quant_grad_accumulate(codes_of(id), params_->grad_data(id), params_->spec(id).local_numel(),
                          &scales_[static_cast<size_t>(id)]);
  }
}

void QuantGradStore::accumulate_pending() {
  std::vector<int> pending;
  for (int id = 0; id < params_->size(); ++id) {
    if (!holds(id) || !resident_[static_cast<size_t>(id)]) continue;
    const float* x = params_->grad_data(id);
    if (std::any_of(x, x + params_->spec(id).local_numel(), [](float v) { return v != 0.0f; })) pending.push_back(id);
  }
  accumulate(pending);
  const float* s = scratch();
  GALE_CHECK(std::all_of(s, s + scratch_numel(), [](float v) { return v == 0.0f; }))
      << "--quant-grads: a gradient was written outside its layer's backward (after the grad-ready hook that "
         "drains it); such a parameter must be resident (optim/quant_grads.h)";
}

void QuantGradStore::align_scales() {
  if (!dp_ || dp_->size() == 1) return;
  std::vector<float> aligned_scales = scales_;
  dp_->all_reduce(aligned_scales.data(), static_cast<int64_t>(aligned_scales.size()), DType::kF32, ReduceOp::kMin);
  if (headroom_ != 1.0f)
    for (float& a : aligned_scales) a /= headroom_;
  for (int id = 0; id < params_->size(); ++id) {
    if (!holds(id)) continue;
    float& s = scales_[static_cast<size_t>(id)];
    quant_grad_rescale(codes_of(id), params_->spec(id).local_numel(), s, aligned_scales[static_cast<size_t>(id)]);
    s = aligned_scales[static_cast<size_t>(id)];
  }
}

void QuantGradStore::finish_piece(const GradBucket& bucket, int64_t lo, int64_t hi, float* x) {
  float* slots = storage_.data<float>();
  for (int id : bucket.param_ids) {
    if (!holds(id)) continue;
    const ParamSpec& s = params_->spec(id);
    const int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.local_numel());
    if (a >= b) continue;
    quant_grad_round_and_decode(x + (a - lo), b - a, scales_[static_cast<size_t>(id)], codes_of(id) + (a - s.offset));
    if (resident_[static_cast<size_t>(id)])
      std::memcpy(slots + slot_[static_cast<size_t>(id)] + (a - s.offset), x + (a - lo),
                  static_cast<size_t>(b - a) * sizeof(float));
  }
}

void QuantGradStore::reduce() {
  const int64_t dp = sync_->dp_size(), rank = sync_->dp_rank(), cap = scratch_numel();
  const bool scaled = sync_->scales_buckets();
  const float factor = sync_->bucket_scale();
  const f16* q = codes_.data<f16>();
  float* x = scratch();
  // float(code) (scale 1: the scaled domain) of flat elements [lo, lo + c) times the factor.
  auto stage = [&](int64_t lo, int64_t c, float* out) {
    quant_grad_decode(q + lo, c, 1.0f, out);
    if (scaled) scale_inplace(out, c, factor);
  };
  for (const GradBucket& bucket : sync_->buckets()) {
    const int64_t begin = bucket.range.begin, n = bucket.numel();
    if (!sync_->sharded()) {  // all-reduce, a scratch at a time
      for (int64_t at = 0; at < n; at += cap) {
        const int64_t c = std::min(cap, n - at);
        stage(begin + at, c, x);
        if (dp > 1) dp_->all_reduce(x, c, DType::kF32, ReduceOp::kSum);
        finish_piece(bucket, begin + at, begin + at + c, x);
      }
      continue;
    }
    // Reduce-scatter: piece [at, at + c) of every rank's shard (the bucket padded with zeros to
    // dp·shard), rank r's part at x[r·c], this rank's sums at x[dp·c].
    const int64_t shard = bucket.shard_numel(dp), piece = std::max<int64_t>(1, cap / (dp + 1));
    for (int64_t at = 0; at < shard; at += piece) {
      const int64_t c = std::min(piece, shard - at);
      for (int64_t r = 0; r < dp; ++r) {
        const int64_t lo = begin + r * shard + at;
        const int64_t valid = std::clamp<int64_t>(begin + n - lo, 0, c);
        if (valid > 0) stage(lo, valid, x + r * c);
        std::fill(x + r * c + valid, x + (r + 1) * c, 0.0f);
      }
      float* sums = x + dp * c;
      if (dp > 1) dp_->reduce_scatter(x, sums, c, DType::kF32, ReduceOp::kSum);
      else std::memcpy(sums, x, static_cast<size_t>(c) * sizeof(float));
      const int64_t lo = begin + rank * shard + at;
      const int64_t valid = std::clamp<int64_t>(begin + n - lo, 0, c);
      if (valid > 0) finish_piece(bucket, lo, lo + valid, sums);
    }
  }
}

void QuantGradStore::scale(float f) {
  for (int id = 0; id < params_->size(); ++id)
    if (holds(id) && resident_[static_cast<size_t>(id)])
      scale_inplace(params_->grad_data(id), params_->spec(id).local_numel(), f);
  factors_.push_back(f);
}

float* QuantGradStore::main_grad(int id, int64_t begin, int64_t n) {
  const ParamSpec& s = params_->spec(id);
  const int64_t off = begin - s.offset;
  GALE_CHECK(holds(id) && off >= 0 && off + n <= s.local_numel()) << s.name << ": no main gradient there";
  if (resident_[static_cast<size_t>(id)]) return params_->grad_data(id) + off;
  GALE_CHECK_LE(n, scratch_numel());
  float* x = scratch();
  quant_grad_decode(codes_of(id) + off, n, scales_[static_cast<size_t>(id)], x);
  for (float f : factors_) scale_inplace(x, n, f);
  return x;
}

double QuantGradStore::local_sum_of_squares() {
  double sum = 0.0;
  for (const FlatRange& r : sync_->owned_ranges())
    for (int id = 0; id < params_->size(); ++id) {
      if (!holds(id)) continue;
      const ParamSpec& s = params_->spec(id);
      const int64_t a = std::max(r.begin, s.offset), b = std::min(r.end, s.offset + s.local_numel());
      if (a < b) sum += fused_sum_of_squares(main_grad(id, a, b - a), b - a);
    }
  return sum;
}

std::vector<float> QuantGradStore::main_grad_copy(int id) {
  const ParamSpec& s = params_->spec(id);
  const float* x = main_grad(id, s.offset, s.local_numel());
  return std::vector<float>(x, x + s.local_numel());
}

}  // namespace gale
