// Clipping and AdamW / SGD updates over flat buffers.
#include "optim/optimizer.h"

#include <cmath>

namespace gale {

Optimizer::Optimizer(const OptimizerConfig& config, std::vector<OptimizedBuffer> buffers, const OpTable* ops,
                     Comm norm_group)
    : config_(config), ops_(ops), norm_group_(std::move(norm_group)) {
  GALE_CHECK(config_.type == "adam" || config_.type == "sgd") << "optimizer " << config_.type;
  for (OptimizedBuffer& b : buffers) {
    GALE_CHECK(b.params->finalized());
    if (b.counts_in_norm.empty()) b.counts_in_norm.assign(static_cast<size_t>(b.params->size()), true);
    GALE_CHECK_EQ(static_cast<int>(b.counts_in_norm.size()), b.params->size());
    BufferState s;
    s.buffer = std::move(b);
    const int64_t n = s.buffer.params->numel();
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
    : Optimizer(config, std::vector<OptimizedBuffer>{OptimizedBuffer{params, {}}}, ops, std::move(norm_group)) {}

double Optimizer::norm_of(bool grads) const {
  double sq = 0.0;
  for (const BufferState& b : buffers_) {
    const ParamBuffer& pb = *b.buffer.params;
    for (int id = 0; id < pb.size(); ++id)
      if (b.buffer.counts_in_norm[static_cast<size_t>(id)])
        sq += sum_of_squares(grads ? pb.grad_data(id) : pb.param_data(id), pb.spec(id).local_numel());
  }
  if (norm_group_ && norm_group_->size() > 1) sq = norm_group_->all_reduce_scalar(sq, ReduceOp::kSum);
  return std::sqrt(sq);
}

double Optimizer::grad_norm() const { return norm_of(true); }
double Optimizer::params_norm() const { return norm_of(false); }

StepResult Optimizer::step(double lr, double wd, bool want_zeros) {
  StepResult r;
  r.grad_norm = grad_norm();
  if (want_zeros) {
    int64_t zeros = 0;
    for (const BufferState& b : buffers_) {
      const ParamBuffer& pb = *b.buffer.params;
      for (int id = 0; id < pb.size(); ++id)
        if (b.buffer.counts_in_norm[static_cast<size_t>(id)]) zeros += count_zeros(pb.grad_data(id), pb.spec(id).local_numel());
    }
    if (norm_group_ && norm_group_->size() > 1) zeros = norm_group_->all_reduce_scalar(zeros, ReduceOp::kSum);
    r.num_zeros = zeros;
  }
  if (!std::isfinite(r.grad_norm)) return r;
  const double coeff = config_.clip_grad > 0.0 ? config_.clip_grad / (r.grad_norm + 1e-6) : 1.0;
  ++step_;
  for (BufferState& b : buffers_) {
    ParamBuffer& pb = *b.buffer.params;
    if (coeff < 1.0) scale_inplace(pb.flat_grads().data<float>(), pb.numel(), static_cast<float>(coeff));
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      const float param_wd = s.weight_decay ? static_cast<float>(wd) : 0.0f;
      float* p = pb.param_data(id);
      const float* g = pb.grad_data(id);
      const int64_t n = s.local_numel();
      if (config_.type == "adam") {
        AdamWHyper h;
        h.lr = static_cast<float>(lr);
        h.beta1 = static_cast<float>(config_.beta1);
        h.beta2 = static_cast<float>(config_.beta2);
        h.eps = static_cast<float>(config_.eps);
        h.weight_decay = param_wd;
        h.step = step_;
        ops_->adamw_step(p, g, b.exp_avg.data<float>() + s.offset, b.exp_avg_sq.data<float>() + s.offset, n, h);
      } else {
        sgd_step_ref(p, g, b.momentum.defined() ? b.momentum.data<float>() + s.offset : nullptr, n,
                     static_cast<float>(lr), static_cast<float>(config_.sgd_momentum), param_wd, step_ == 1);
      }
    }
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

}  // namespace gale
