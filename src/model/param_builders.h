// Small builders for the ParamSpecs the model registers (name, shape, init, decay, TP split).
#pragma once

#include <string>
#include <vector>

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

// Split `s` across this partition's TP ranks along `dim`, whose global extent is made of sections of
// these extents, each split on its own (one section: an even split): rank r holds the r-th part of
// every section, in order (ParamSpec::split_block_extents; the Mamba and GDN mixers' in_proj and conv1d).
inline ParamSpec tp_split_sections(ParamSpec s, const ModelPartition& part, int dim, std::vector<int64_t> extents) {
  s = tp_split(std::move(s), part, dim, static_cast<int>(extents.size()));
  if (extents.size() > 1) s.split_block_extents = std::move(extents);
  return s;
}

// `s` marked as a linear layer's weight read only through the GEMM copy (ParamSpec::gemm_weight).
inline ParamSpec gemm_weight(ParamSpec s) {
  s.gemm_weight = true;
  return s;
}

}  // namespace gale
