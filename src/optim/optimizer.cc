// Clipping and AdamW / SGD updates over the owned pieces of flat buffers.
#include "optim/optimizer.h"

#include <cmath>

namespace gale {

namespace {

// The pieces of `pb`'s parameters inside `ranges`, with state packed in range order.
std::vector<Optimizer::Segment> segments_of(const ParamBuffer& pb, const std::vector<FlatRange>& ranges) {
  std::vector<Optimizer::Segment> out;
  int64_t state = 0;
  for (const FlatRange& r : ranges) {
    GALE_CHECK(r.begin >= 0 && r.end <= pb.trainable_numel())
        << "owned range [" << r.begin << ", " << r.end << ") outside the trainable buffer of " << pb.trainable_numel();
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      const int64_t lo = std::max(r.begin, s.offset), hi = std::min(r.end, s.offset + s.local_numel());
      if (hi <= lo) continue;
      out.push_back(Optimizer::Segment{id, lo, hi - lo, state + (lo - r.begin)});
    }
    state += std::max<int64_t>(0, r.size());
  }
  return out;
}

}  // namespace

Optimizer::Optimizer(const OptimizerConfig& config, std::vector<OptimizedBuffer> buffers, const OpTable* ops,
                     Comm norm_group, Comm shard_group, ExpertNormGroups expert_groups)
    : config_(config),
      ops_(ops),
      norm_group_(std::move(norm_group)),
      shard_group_(std::move(shard_group)),
      expert_groups_(std::move(expert_groups)) {
  GALE_CHECK(config_.type == "adam" || config_.type == "sgd") << "optimizer " << config_.type;
  for (OptimizedBuffer& b : buffers) {
    GALE_CHECK(b.params->finalized());
    if (b.counts_in_norm.empty()) b.counts_in_norm.assign(static_cast<size_t>(b.params->size()), true);
    GALE_CHECK_EQ(static_cast<int>(b.counts_in_norm.size()), b.params->size());
    BufferState s;
    s.sharded = b.owned.has_value();
    // Frozen parameters (LoRA's base) sit after trainable_numel(): no segment, no state.
    const std::vector<FlatRange> ranges =
        s.sharded ? *b.owned : std::vector<FlatRange>{{0, b.params->trainable_numel()}};
    s.segments = segments_of(*b.params, ranges);
    int64_t n = 0;
    for (const FlatRange& r : ranges) n += std::max<int64_t>(0, r.size());
    s.buffer = std::move(b);
    if (config_.type == "adam") {
      s.exp_avg = Tensor::zeros({n});
      s.exp_avg_sq = Tensor::zeros({n});
    } else if (config_.sgd_momentum != 0.0) {
      s.momentum = Tensor::zeros({n});
    }
    buffers_.push_back(std::move(s));
  }
}

Optimizer::Optimizer(const OptimizerConfig& config, ParamBuffer* params, const OpTable* ops, Comm norm_group)
    : Optimizer(config, std::vector<OptimizedBuffer>{OptimizedBuffer{params, {}, std::nullopt}}, ops,
                std::move(norm_group)) {}

double Optimizer::sum_over_groups(double dense, double expert) const {
  auto sum = [](const Comm& g, double v) { return g && g->size() > 1 ? g->all_reduce_scalar(v, ReduceOp::kSum) : v; };
  dense = sum(norm_group_, sum(shard_group_, dense));
  if (!expert_groups_.norm_group) return dense + expert;  // no expert parallelism: expert is 0
  return dense + sum(expert_groups_.norm_group, sum(expert_groups_.shard_group, expert));
}

double Optimizer::norm_of(bool grads) const {
  double sq = 0.0, expert_sq = 0.0;
  for (const BufferState& b : buffers_) {
    const ParamBuffer& pb = *b.buffer.params;
    const float* base = grads ? pb.flat_grads().data<float>() : pb.flat_params().data<float>();
    for (const Segment& seg : b.segments)
      if (b.buffer.counts_in_norm[static_cast<size_t>(seg.param_id)])
        (pb.spec(seg.param_id).expert_parallel ? expert_sq : sq) += ops_->sum_of_squares(base + seg.begin, seg.numel);
  }
  return std::sqrt(sum_over_groups(sq, expert_sq));
}

double Optimizer::grad_norm() const { return norm_of(true); }
double Optimizer::params_norm() const { return norm_of(false); }

StepResult Optimizer::step(double lr, double wd, bool want_zeros, float inv_grad_scale, Timers* timers,
                           std::optional<double> decoupled_lr) {
  StepResult r;
  if (inv_grad_scale != 1.0f) {
    // Megatron's unscale-and-check-inf; the check for non-finite values is the norm's below.
    ScopedTimer timer = ScopedTimer::level1(timers, "optimizer-unscale-and-check-inf");
    for (BufferState& b : buffers_) {
      float* g = b.buffer.params->flat_grads().data<float>();
      for (const Segment& seg : b.segments) scale_inplace(g + seg.begin, seg.numel, inv_grad_scale);
    }
  }
  {
    ScopedTimer timer = ScopedTimer::level1(timers, "optimizer-clip-main-grad");
    r.grad_norm = grad_norm();
  }
  ScopedTimer count_timer = ScopedTimer::level1(timers, "optimizer-count-zeros");
  if (want_zeros) {
    int64_t zeros = 0, expert_zeros = 0;
    for (const BufferState& b : buffers_) {
      const ParamBuffer& pb = *b.buffer.params;
      const float* g = pb.flat_grads().data<float>();
      for (const Segment& seg : b.segments)
        if (b.buffer.counts_in_norm[static_cast<size_t>(seg.param_id)])
          (pb.spec(seg.param_id).expert_parallel ? expert_zeros : zeros) += count_zeros(g + seg.begin, seg.numel);
    }
    // Counts below 2^53 add exactly in doubles.
    r.num_zeros = static_cast<int64_t>(sum_over_groups(static_cast<double>(zeros), static_cast<double>(expert_zeros)));
  }
  count_timer.stop();
  if (!std::isfinite(r.grad_norm)) return r;
  ScopedTimer step_timer = ScopedTimer::level1(timers, "optimizer-inner-step");
  const double coeff = config_.clip_grad > 0.0 ? config_.clip_grad / (r.grad_norm + 1e-6) : 1.0;
  ++step_;
  AdamWHyper h;
  h.beta1 = static_cast<float>(config_.beta1);
  h.beta2 = static_cast<float>(config_.beta2);
  h.eps = static_cast<float>(config_.eps);
  h.step = step_;
  for (size_t bi = 0; bi < buffers_.size(); ++bi) {
    BufferState& b = buffers_[bi];
    ParamBuffer& pb = *b.buffer.params;
    float* params = pb.flat_params().data<float>();
    float* grads = pb.flat_grads().data<float>();
    for (const Segment& seg : b.segments) {
      float* p = params + seg.begin;
      float* g = grads + seg.begin;
      const float param_wd = pb.spec(seg.param_id).weight_decay ? static_cast<float>(wd) : 0.0f;
      const bool decoupled = decoupled_lr && !b.buffer.decoupled_lr.empty() &&
                             b.buffer.decoupled_lr[static_cast<size_t>(seg.param_id)];
      const double seg_lr = decoupled ? *decoupled_lr : lr;
      if (config_.type == "adam") {
        h.lr = static_cast<float>(seg_lr);
        h.weight_decay = param_wd;
        h.grad_scale = coeff < 1.0 ? static_cast<float>(coeff) : 1.0f;  // clipping folded into the update
        ops_->adamw_step(p, g, b.exp_avg.data<float>() + seg.state_offset,
                         b.exp_avg_sq.data<float>() + seg.state_offset, seg.numel, h);
      } else {
        if (coeff < 1.0) scale_inplace(g, seg.numel, static_cast<float>(coeff));
        sgd_step_ref(p, g, b.momentum.defined() ? b.momentum.data<float>() + seg.state_offset : nullptr, seg.numel,
                     static_cast<float>(seg_lr), static_cast<float>(config_.sgd_momentum), param_wd, step_ == 1);
      }
    }
    if (after_buffer_step_) after_buffer_step_(bi);
  }
  r.applied = true;
  return r;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state(size_t b) const {
  const BufferState& s = buffers_.at(b);
  if (config_.type == "adam") return {{"exp_avg", s.exp_avg}, {"exp_avg_sq", s.exp_avg_sq}};
  if (s.momentum.defined()) return {{"momentum_buffer", s.momentum}};
  return {};
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (size_t b = 0; b < buffers_.size(); ++b)
    for (const auto& [name, t] : state(b)) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

}  // namespace gale
