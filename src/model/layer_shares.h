// This tensor-parallel rank's share of a transformer layer: its query groups and heads, its FFN columns.
//
// Attention is split by whole query groups (each with its NH/KV query heads; with MHA a group is
// one head), so a head never straddles two ranks and every rank's packed QKV rows are Megatron's
// layout for its own groups. The FFN is split by columns. Both follow parallel/tp_share.h: even
// shares when TP divides the counts, else (--unaligned-linear) one extra group / column on each of
// the first ranks (6 heads over TP 4: 2, 2, 1, 1; 10 heads in 5 groups over TP 3: 4, 4, 2; ffn 100
// over TP 3: 34, 33, 33). Fewer groups than ranks (10 heads in 2 groups over TP 3: 5, 5, 0) would
// leave a rank without heads: validation refuses it (train/arguments_parallel.cc).
#pragma once

#include <cstdint>

#include "model/config.h"
#include "parallel/tp_share.h"

namespace gale {

struct LayerShares {
  int64_t groups = 0, group_offset = 0;  // query groups (KV heads) [group_offset, + groups)
  int64_t heads = 0, head_offset = 0;    // query heads [head_offset, + heads)
  int64_t ffn = 0, ffn_offset = 0;       // FFN columns [ffn_offset, + ffn)
  // Rows of linear_qkv per query group, (NH/KV + 2)·HD (with the output gate (2·NH/KV + 2)·HD): the
  // unit its TP split deals out.
  int64_t qkv_rows_per_group = 0;
  // Columns of linear_proj per query group, NH/KV·HD.
  int64_t proj_cols_per_group = 0;
};

// The shares of TP rank `rank` of `tp` for the attention kernels' heads (ModelConfig::
// attention_kv_heads: MLA gives every head its own group) and the dense FFN.
inline LayerShares layer_shares(const ModelConfig& c, int64_t tp, int64_t rank) {
  LayerShares s;
  const int64_t kv = c.attention_kv_heads();
  GALE_CHECK(tp == 1 || (kv > 0 && c.heads % kv == 0)) << c.heads << " heads in " << kv << " query groups";
  const int64_t per_group = kv > 0 ? c.heads / kv : 0;
  const TpShare g = tp_share(kv, tp, rank), f = tp_share(c.ffn, tp, rank);
  s.groups = g.count;
  s.group_offset = g.offset;
  s.heads = tp == 1 ? c.heads : g.count * per_group;  // TP 1: every head, whatever the grouping
  s.head_offset = g.offset * per_group;
  s.ffn = f.count;
  s.ffn_offset = f.offset;
  // --attention-output-gate: each group's rows also hold its heads' gates (model/attention_output_gate.h).
  s.qkv_rows_per_group = ((c.attention_output_gate ? 2 : 1) * per_group + 2) * c.head_dim;
  s.proj_cols_per_group = per_group * c.head_dim;
  return s;
}

inline LayerShares layer_shares(const ModelConfig& c, const ModelPartition& part) {
  return layer_shares(c, part.tp_size(), part.tp_rank());
}

}  // namespace gale
