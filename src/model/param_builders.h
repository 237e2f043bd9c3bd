// Small builders for the ParamSpecs the model registers (name, shape, init, decay, TP split).
#pragma once

#include <string>

#include "model/config.h"
#include "model/params.h"

namespace gale {

inline ParamSpec make_param_spec(std::string name, Shape global_shape, InitKind init, float init_std,
                                 bool weight_decay) {
  ParamSpec s;
  s.name = std::move(name);
  s.global_shape = std::move(global_shape);
  s.init = init;
  s.init_std = init_std;
  s.weight_decay = weight_decay;
  return s;
}

// Split `s` across this partition's TP ranks along `dim` (`blocks` equal blocks, each split into
// whole units of `unit` rows, dealt out by parallel/tp_share.h).
inline ParamSpec tp_split(ParamSpec s, const ModelPartition& part, int dim, int blocks = 1, int64_t unit = 1) {
  s.split_dim = dim;
  s.split_blocks = blocks;
  s.split_unit = unit;
  s.split_parts = part.tp_size();
  s.split_rank = part.tp_rank();
  return s;
}

// `s` marked as a linear layer's weight read only through the GEMM copy (ParamSpec::gemm_weight).
inline ParamSpec gemm_weight(ParamSpec s) {
  s.gemm_weight = true;
  return s;
}

}  // namespace gale
