// Context parallelism inside the model: a micro-batch cut to one cp rank's positions, the
// key/value exchange of attention over the cp group (Megatron-Core's all-gather CP), and
// DeepSpeed-Ulysses' all-to-alls between sequence and head splits.
//
// Forward: every cp rank computes keys and values of its own positions; all_gather_context_kv
// gathers them from the whole group into global position order, and the local queries attend to
// all of them (their global positions drive the causal mask and dropout). Backward: attention
// produces dK, dV for every position of the sequence; reduce_scatter_context_kv_grad sums them
// over the group and hands each rank the rows of the positions it owns.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/cpu/head_layout.h"
#include "model/micro_batch.h"
#include "parallel/context_split.h"

namespace gale {

// The part of `full` (a micro-batch of whole sequences, S = split.seq_length) that cp rank
// split.cp_rank holds: tokens, labels, loss mask, position and document ids sliced to its
// positions; seq_positions and S_global set; key_document_ids = the whole sequences' document ids
// (when `full` has document ids). With cp_size 1 returns `full` unchanged.
MicroBatch slice_micro_batch(const MicroBatch& full, const ContextSplit& split);

// Layout of the gathered key/value rows: [S_global·B, 2·KV·HD], the KV key heads then the KV value heads.
inline HeadLayout context_key_layout(int64_t KV, int64_t HD) { return HeadLayout{2 * KV * HD, 0, 1, HD, 0}; }
inline HeadLayout context_value_layout(int64_t KV, int64_t HD) { return HeadLayout{2 * KV * HD, KV * HD, 1, HD, 0}; }

// The KV key and value heads of T tokens, read from `qkv` through kl / vl, as [T, 2·KV·HD] rows
// (context_key_layout / context_value_layout).
Tensor pack_context_kv(int64_t T, const float* qkv, const HeadLayout& kl, const HeadLayout& vl, int64_t KV, int64_t HD);

// Its reverse for gradients: the [T, 2·KV·HD] rows of `dkv` WRITTEN into dqkv's key and value heads.
void unpack_context_kv_grad(int64_t T, const float* dkv, float* dqkv, const HeadLayout& kl, const HeadLayout& vl,
                            int64_t KV, int64_t HD);

// Forward: the KV key and value heads of this rank's S_local·B tokens, read from `qkv` through
// kl / vl, gathered over `cp` into [S_global·B, 2·KV·HD] rows in global position order.
Tensor all_gather_context_kv(Communicator& cp, const ContextSplit& split, int64_t B, const float* qkv,
                             const HeadLayout& kl, const HeadLayout& vl, int64_t KV, int64_t HD);

// Backward: `dkv` [S_global·B, 2·KV·HD] (this rank's gradient of every gathered row) summed over
// `cp`; this rank's rows are WRITTEN into dqkv's key and value heads through kl / vl.
void reduce_scatter_context_kv_grad(Communicator& cp, const ContextSplit& split, int64_t B, const Tensor& dkv,
                                    float* dqkv, const HeadLayout& kl, const HeadLayout& vl, int64_t KV, int64_t HD);

// DeepSpeed-Ulysses (--context-parallel-algo ulysses_cp_algo): all-to-alls over the cp group that
// trade the sequence split for a split of the columns. The columns of `x` are cp equal blocks
// (whole KV groups of a packed QKV row, or whole heads of attention's output).
//
// ulysses_seq_to_heads: x [S_local·B, W] of this rank's positions -> [S_global·B, W/cp], block
// cp_rank of the columns for every position of the sequence, in global position order (each rank's
// positions from `split`: Megatron's chunks, or an adaptive layout's, as the Mamba mixer's uses).
// ulysses_heads_to_seq: its inverse, [S_global·B, W/cp] -> [S_local·B, W]. Both are
// permutations, so each is the other's backward.
Tensor ulysses_seq_to_heads(Communicator& cp, const ContextSplit& split, int64_t B, const Tensor& x);
Tensor ulysses_heads_to_seq(Communicator& cp, const ContextSplit& split, int64_t B, const Tensor& x);

// Ulysses with fewer query groups than ranks (KV < D, D a multiple of KV; MindSpeed's repeat
// all-to-all): every group's key and value are repeated D/KV times so that each of the D column
// blocks is a packed QKV row of its own, NH/D query heads (all of one group) with that group's key
// and value. packed_qkv [T, (NH + 2·KV)·HD] -> [T, D·(NH/D + 2)·HD]: block j = query heads
// j·NH/D .. (j+1)·NH/D − 1, then key and value head j·KV/D. ulysses_seq_to_heads then hands block j
// to rank j.
Tensor repeat_kv_groups(const Tensor& packed_qkv, int64_t NH, int64_t KV, int64_t HD, int64_t D);
// Its backward: d_blocks [T, D·(NH/D + 2)·HD] -> dQKV [T, (NH + 2·KV)·HD], the key and value
// gradients of each group's D/KV copies summed.
Tensor sum_repeated_kv_groups(const Tensor& d_blocks, int64_t NH, int64_t KV, int64_t HD, int64_t D);

// --use-ulysses-allgather-kv: the query heads of packed QKV rows as [T, NH·HD] (queries travel by
// all-to-all, keys and values by all_gather_context_kv), and the reverse for their gradients:
// d_query [T, NH·HD] WRITTEN into dqkv's query heads.
Tensor pack_query_heads(const Tensor& packed_qkv, int64_t NH, int64_t KV, int64_t HD);
void unpack_query_heads_grad(const Tensor& d_query, float* dqkv, int64_t NH, int64_t KV, int64_t HD);

}  // namespace gale
