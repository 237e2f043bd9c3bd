// Ring attention over the context-parallel group (Megatron-Core's --cp-comm-type p2p, MindSpeed's megatron_cp_algo ring).
//
// Every cp rank keeps the keys and values of its own positions. Forward runs N = cp_size steps: at
// step i this rank holds the key/value block of rank (r − i) mod N, starts sending it to rank r + 1
// and receiving the next one from rank r − 1 (non-blocking point-to-point, so the transfer overlaps
// this step's attention), attends its local queries to the block (the block's global key positions
// and document ids drive the causal and document masks and dropout's global indexing) and merges
// the partial output into the running one exactly (merge_attention_partial). Only the local block
// is kept for backward: activation memory is S_local·B·2·KV·HD per layer, not S_global·B·2·KV·HD.
//
// Backward runs the ring again. For each visiting block, attention's backward with the merged
// (global) output and lse gives exactly that block's share of dQ (accumulated here) and the
// block's dK, dV. The gradient of a block travels one hop behind it, each rank adding its share;
// after N hops it is back at the owner, which writes it into its dQKV rows. The send of one step's
// gradient overlaps the next step's attention.
//
// Per layer and rank, forward sends N − 1 blocks of S_local·B·2·KV·HD floats; backward sends N − 1
// key/value blocks and N gradient blocks (docs/parallelism.md §11).
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/op_table.h"
#include "parallel/context_split.h"

namespace gale {

// Online-softmax merge of a partial attention result into a running one, in place:
// lse = log(e^lse + e^lse_b), out = e^(lse_old − lse)·out + e^(lse_b − lse)·out_b.
// out / out_b are [Sq·B, NH·HD] (row s·B + b, head h at columns h·HD), lse / lse_b are
// [B, NH, Sq]. A query that sees no key of a block has lse −inf there and that block adds nothing
// (its out rows are ignored); a query that sees no key in either keeps lse −inf and out 0.
void merge_attention_partial(int64_t B, int64_t NH, int64_t Sq, int64_t HD, float* out, float* lse,
                             const float* out_b, const float* lse_b);

// Forward of this rank's queries (read from `qkv` through ql) against the keys and values of the
// whole sequence, fetched block by block around `cp`. `ap` is the all-gather problem of this rank:
// Sq = S_local, Sk = S_global, q_positions the local global positions, k_doc_ids (when set) the
// document ids of the whole sequences [B, S_global]. WRITES out [S_local·B, NH·HD] and lse
// [B, NH, S_local]. Returns this rank's key/value block [S_local·B, 2·KV·HD]
// (context_key_layout / context_value_layout), which backward needs.
Tensor ring_attention_forward(Communicator& cp, const ContextSplit& split, AttentionForwardFn forward,
                              const AttentionProblem& ap, const float* qkv, const HeadLayout& ql,
                              const HeadLayout& kl, const HeadLayout& vl, float* out, float* lse);

// Backward of ring_attention_forward: `local_kv` is what forward returned, out / lse its merged
// output and lse, dout the output's gradient. WRITES dq into dqkv through ql and this rank's dK,
// dV (summed over every rank's queries) into dqkv through kl / vl.
void ring_attention_backward(Communicator& cp, const ContextSplit& split, AttentionBackwardFn backward,
                             const AttentionProblem& ap, const float* qkv, const HeadLayout& ql,
                             const Tensor& local_kv, const float* out, const float* lse, const float* dout,
                             float* dqkv, const HeadLayout& kl, const HeadLayout& vl);

}  // namespace gale
