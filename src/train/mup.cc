// --use-mup: Megatron-Core's µP settings of the model (TransformerConfig) and of the optimizer's parameter groups.
#include "train/mup.h"

#include <cmath>

#include "core/log.h"

namespace gale {

MupConfig mup_config_from_args(const ModelArgs& m) {
  MupConfig u;
  if (!m.use_mup) return u;
  u.enabled = true;
  const int64_t base = m.mup_base_hidden_size == kUnset ? m.hidden_size : m.mup_base_hidden_size;
  u.width_mult = static_cast<double>(m.hidden_size) / static_cast<double>(base);
  const double base_head_scale = unset(m.mup_base_head_dim) ? 1.0 : std::sqrt(m.mup_base_head_dim);
  u.softmax_scale =
      static_cast<float>(base_head_scale / std::pow(static_cast<double>(m.kv_channels), m.mup_attn_scale_power));
  double output_mult = m.mup_output_mult;
  if (output_mult == 1.0 && u.width_mult != 1.0) output_mult = 1.0 / u.width_mult;
  u.output_mult = static_cast<float>(output_mult);
  u.embedding_mult = static_cast<float>(m.mup_embedding_mult);
  u.embedding_init_std = static_cast<float>(m.init_method_std);
  return u;
}

void apply_mup_to_model(const ModelArgs& m, ModelConfig* c) {
  c->mup = mup_config_from_args(m);
  if (!c->mup.enabled) return;
  // With --init-method-xavier-uniform Megatron's init_method is xavier_uniform_, not rescaled; the
  // N(0, σ) parameters left (none of the matrices) keep σ.
  if (!m.init_method_xavier_uniform)
    c->init_std = static_cast<float>(m.init_method_std / std::sqrt(c->mup.width_mult));
}

void warn_mup(const Arguments& a) {
  const ModelArgs& m = a.model;
  if (!m.use_mup) return;
  if (m.init_method_xavier_uniform)
    warn_rank0("use_mup is enabled, but custom init_method is set (--init-method-xavier-uniform). This may break "
               "MuP initialization assumptions.");
  if (m.is_hybrid_model)
    warn_rank0("MuP for HybridModel is experimental and not fully validated yet.");
  const std::string& opt = a.training.optimizer;
  if (!unset(a.training.decoupled_lr))
    warn_rank0(str_cat("Both decoupled_lr and MuP LR scaling are enabled. decoupled_lr sets an absolute LR for "
                       "embedding+output params, and MuP LR scaling will not override those parameters.",
                       opt.find("adam") != std::string::npos
                           ? " MuP Adam epsilon scaling remains applied to hidden matrix-like parameters."
                           : ""));
  if (opt.find("muon") != std::string::npos && a.training.muon_scale_mode == "spectral")
    warn_rank0("Both MuP and muon_scale_mode=spectral are enabled. Muon-managed matrix parameters will continue "
               "using spectral Muon scaling. Set --muon-scale-mode unit_rms_norm to use unit_rms_norm scaling for "
               "Muon-managed matrices with MuP.");
}

namespace {

// The µP group's learning-rate and Adam eps multipliers of optimizer `optimizer` at width multiplier m.
void mup_mults(const std::string& optimizer, double m, double* lr_mult, double* eps_mult) {
  *lr_mult = optimizer == "sgd" ? m : 1.0 / m;
  *eps_mult = optimizer.find("adam") != std::string::npos ? 1.0 / m : 1.0;
}

}  // namespace

void apply_mup_to_optimizer(const Arguments& a, OptimizerConfig* o) {
  if (!a.model.use_mup) return;
  const double m = mup_config_from_args(a.model).width_mult;
  if (m == 1.0) return;
  mup_mults(a.training.optimizer, m, &o->mup_lr_mult, &o->mup_eps_mult);
}

MupParamOverrides mup_param_overrides(const ParamBuffer& params, const std::string& optimizer, double width_mult,
                                      const std::vector<bool>& embedding_class, const std::vector<bool>& muon_managed,
                                      const std::vector<bool>& decoupled) {
  MupParamOverrides o;
  if (width_mult == 1.0) return o;  // Megatron: no overrides at the base width
  const bool sgd = optimizer == "sgd";
  const bool adam = optimizer.find("adam") != std::string::npos;
  const bool muon = optimizer.find("muon") != std::string::npos;
  const size_t n = static_cast<size_t>(params.size());
  auto at = [](const std::vector<bool>& v, size_t i) { return i < v.size() && v[i]; };
  o.lr.assign(n, false);
  o.eps.assign(n, false);
  mup_mults(optimizer, width_mult, &o.lr_mult, &o.eps_mult);
  for (size_t i = 0; i < n; ++i) {
    const bool embedding = at(embedding_class, i);
    const bool vector_like = embedding || params.spec(static_cast<int>(i)).global_shape.size() <= 1;
    const bool muon_matrix = muon && at(muon_managed, i);
    const bool keeps_decoupled = at(decoupled, i);  // Megatron's is_embedding_or_output_parameter
    if (sgd) {
      o.lr[i] = vector_like && !keeps_decoupled;
    } else {
      o.lr[i] = !vector_like && !muon_matrix && !keeps_decoupled;
      o.eps[i] = adam && !vector_like && !muon_matrix;
    }
  }
  return o;
}

}  // namespace gale
