// Where each attention head of each token lives inside a buffer of per-token rows.
//
// Token t = s·B + b (activations are [S, B, ...]). Head h of token t starts at
//   base + t·row_stride + (h / group_size)·group_stride + (h % group_size)·head_stride
// and spans HD contiguous floats. This one description covers Megatron's packed QKV rows
// (q, k and v read in place, no split copies) and plain [tokens, heads, HD] buffers.
#pragma once

#include <cstdint>

namespace gale {

struct HeadLayout {
  int64_t row_stride = 0;
  int64_t base = 0;
  int64_t group_size = 1;
  int64_t group_stride = 0;
  int64_t head_stride = 0;

  int64_t offset(int64_t token, int64_t head) const {
    return base + token * row_stride + (head / group_size) * group_stride + (head % group_size) * head_stride;
  }
};

// Megatron's packed QKV row of (NH + 2·KV)·HD floats: for each KV group g, the NH/KV query heads
// of the group, then key head g, then value head g (HD floats each). See docs/model.md.
inline HeadLayout qkv_query_layout(int64_t NH, int64_t KV, int64_t HD) {
  int64_t per_group = NH / KV;
  return HeadLayout{(NH + 2 * KV) * HD, 0, per_group, (per_group + 2) * HD, HD};
}
inline HeadLayout qkv_key_layout(int64_t NH, int64_t KV, int64_t HD) {
  int64_t per_group = NH / KV;
  return HeadLayout{(NH + 2 * KV) * HD, per_group * HD, 1, (per_group + 2) * HD, 0};
}
inline HeadLayout qkv_value_layout(int64_t NH, int64_t KV, int64_t HD) {
  int64_t per_group = NH / KV;
  return HeadLayout{(NH + 2 * KV) * HD, (per_group + 1) * HD, 1, (per_group + 2) * HD, 0};
}
// A plain [tokens, heads, HD] buffer.
inline HeadLayout contiguous_heads_layout(int64_t heads, int64_t HD) { return HeadLayout{heads * HD, 0, 1, HD, 0}; }

}  // namespace gale
