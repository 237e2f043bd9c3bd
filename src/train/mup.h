// --use-mup (Megatron-Core's µP): the resolved model settings and the optimizer's per-parameter overrides.
//
// Megatron-LM main, TransformerConfig.__post_init__ with use_mup:
//   m = hidden_size / mup_base_hidden_size            (base default: hidden_size, so m = 1)
//   softmax_scale = (√mup_base_head_dim or 1) / kv_channels^mup_attn_scale_power   (MLA keeps its own)
//   mup_output_mult: 1.0 (the default) becomes 1/m when m ≠ 1
//   init: hidden weights N(0, σ/√m); output projections (linear_proj, linear_fc2, ...) N(0, σ/√(2L)/√m);
//         word / position embeddings and an untied output layer N(0, σ) (the embedding init method)
//   forward: embeddings × mup_embedding_mult (before dropout), logits × mup_output_mult
// Megatron-LM main, get_mup_config_overrides (training.py merges them with the standard overrides),
// when m ≠ 1; "vector-like": a parameter of at most one dimension or of the embedding class (the
// embedding module's parameters and the output layer's weight):
//   Adam (an optimizer name containing "adam"): every other parameter ("hidden") gets max_lr·1/m,
//     min_lr·1/m and eps·1/m;
//   SGD: the vector-like parameters get max_lr·m and min_lr·m (with --decoupled-lr not the
//     embedding / output layer, which keep the decoupled rate);
//   other optimizers (Lion, Muon): the hidden parameters get max_lr·1/m, min_lr·1/m, no eps; Muon's
//     own matrices are left out (so with Muon nothing is scaled: the rest is vector-like).
// The scaled parameters' rate follows the schedule between the scaled bounds (LrScheduler::lr(max,
// min): from --lr-warmup-init, which is not scaled, during warmup).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/params.h"
#include "optim/optimizer.h"
#include "train/arguments.h"

namespace gale {

// Megatron's use_mup resolution of validated flags `m` (disabled without --use-mup). `init_std`
// is --init-method-std; with --init-method-xavier-uniform the matrices are not N(0, σ) and are not
// rescaled (Megatron: a custom init_method wins, with a warning).
MupConfig mup_config_from_args(const ModelArgs& m);

// Applies --use-mup to a model configuration built from `m`: c->mup, and c->init_std = σ/√m
// (the hidden weights' std; the embeddings keep σ through MupConfig::embedding_init_std).
void apply_mup_to_model(const ModelArgs& m, ModelConfig* c);

// Megatron's start-up warnings for --use-mup (rank 0, stderr): a custom init method
// (--init-method-xavier-uniform), the hybrid model being experimental, --decoupled-lr together with
// the µP learning rates, Muon's spectral scale mode.
void warn_mup(const Arguments& a);

// Sets o->mup_lr_mult and o->mup_eps_mult for --optimizer `a.training.optimizer` (1 without
// --use-mup or at m = 1).
void apply_mup_to_optimizer(const Arguments& a, OptimizerConfig* o);

// The optimizer's µP overrides of one model chunk's parameters.
struct MupParamOverrides {
  double lr_mult = 1.0;   // the scaled parameters' max_lr and min_lr multiplier
  double eps_mult = 1.0;  // Adam's eps multiplier of the eps-scaled parameters
  std::vector<bool> lr;   // per parameter: its rate is the µP group's (empty: none)
  std::vector<bool> eps;  // per parameter: its Adam eps is scaled (empty: none)
};

// get_mup_config_overrides for `params`: `optimizer` is the --optimizer name, `embedding_class`
// marks the embedding module's parameters and the output layer weight, `muon_managed` the
// parameters Muon updates (OptimizedBuffer::muon with --optimizer muon; empty: none),
// `decoupled` the parameters --decoupled-lr applies to (OptimizedBuffer::decoupled_lr: the word
// embedding and the output layer; empty without it), which keep the decoupled rate.
MupParamOverrides mup_param_overrides(const ParamBuffer& params, const std::string& optimizer, double width_mult,
                                      const std::vector<bool>& embedding_class, const std::vector<bool>& muon_managed,
                                      const std::vector<bool>& decoupled);

}  // namespace gale
