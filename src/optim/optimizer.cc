// Clipping and AdamW / SGD updates over flat buffers.
#include "optim/optimizer.h"

#include <cmath>

namespace gale {

Optimizer::Optimizer(const OptimizerConfig& config, ParamBuffer* params, const OpTable* ops, Comm norm_group,
                     std::vector<bool> counts_in_norm)
    : config_(config), params_(params), ops_(ops), norm_group_(std::move(norm_group)),
      counts_in_norm_(std::move(counts_in_norm)) {
  GALE_CHECK(params_->finalized());
  if (counts_in_norm_.empty()) counts_in_norm_.assign(static_cast<size_t>(params_->size()), true);
  GALE_CHECK_EQ(static_cast<int>(counts_in_norm_.size()), params_->size());
  if (config_.type == "adam") {
    exp_avg_ = Tensor::zeros({params_->numel()});
    exp_avg_sq_ = Tensor::zeros({params_->numel()});
  } else {
    GALE_CHECK(config_.type == "sgd") << "optimizer " << config_.type;
    if (config_.sgd_momentum != 0.0) momentum_ = Tensor::zeros({params_->numel()});
  }
}

double Optimizer::grad_norm() const {
  double sq = 0.0;
  for (int id = 0; id < params_->size(); ++id)
    if (counts_in_norm_[static_cast<size_t>(id)]) sq += sum_of_squares(params_->grad_data(id), params_->spec(id).local_numel());
  if (norm_group_ && norm_group_->size() > 1) sq = norm_group_->all_reduce_scalar(sq, ReduceOp::kSum);
  return std::sqrt(sq);
}

StepResult Optimizer::step(double lr, double wd, bool want_zeros) {
  StepResult r;
  r.grad_norm = grad_norm();
  if (want_zeros) {
    int64_t zeros = 0;
    for (int id = 0; id < params_->size(); ++id)
      if (counts_in_norm_[static_cast<size_t>(id)]) zeros += count_zeros(params_->grad_data(id), params_->spec(id).local_numel());
    if (norm_group_ && norm_group_->size() > 1) zeros = norm_group_->all_reduce_scalar(zeros, ReduceOp::kSum);
    r.num_zeros = zeros;
  }
  if (!std::isfinite(r.grad_norm)) return r;
  if (config_.clip_grad > 0.0) {
    double coeff = config_.clip_grad / (r.grad_norm + 1e-6);
    if (coeff < 1.0) scale_inplace(params_->flat_grads().data<float>(), params_->numel(), static_cast<float>(coeff));
  }
  ++step_;
  for (int id = 0; id < params_->size(); ++id) {
    const ParamSpec& s = params_->spec(id);
    const float param_wd = s.weight_decay ? static_cast<float>(wd) : 0.0f;
    float* p = params_->param_data(id);
    const float* g = params_->grad_data(id);
    int64_t n = s.local_numel();
    if (config_.type == "adam") {
      AdamWHyper h;
      h.lr = static_cast<float>(lr);
      h.beta1 = static_cast<float>(config_.beta1);
      h.beta2 = static_cast<float>(config_.beta2);
      h.eps = static_cast<float>(config_.eps);
      h.weight_decay = param_wd;
      h.step = step_;
      ops_->adamw_step(p, g, exp_avg_.data<float>() + s.offset, exp_avg_sq_.data<float>() + s.offset, n, h);
    } else {
      sgd_step_ref(p, g, momentum_.defined() ? momentum_.data<float>() + s.offset : nullptr, n, static_cast<float>(lr),
                   static_cast<float>(config_.sgd_momentum), param_wd, step_ == 1);
    }
  }
  r.applied = true;
  return r;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  if (config_.type == "adam") return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  if (momentum_.defined()) return {{"momentum_buffer", momentum_}};
  return {};
}

}  // namespace gale
