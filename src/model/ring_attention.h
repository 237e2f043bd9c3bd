// Ring attention over the context-parallel group (Megatron-Core's --cp-comm-type p2p, MindSpeed's megatron_cp_algo ring).
//
// Every cp rank keeps the keys and values of its own positions. Forward runs N = cp_size steps: at
// each step this rank holds the key/value block of one rank, starts passing it on and receiving
// the next one (non-blocking point-to-point, so the transfer overlaps this step's attention),
// attends its local queries to the block (the block's global key positions and document ids drive
// the causal and document masks and dropout's global indexing) and merges the partial output into
// the running one exactly (merge_attention_partial). Sink logits (--softmax-type,
// AttentionProblem::softmax_offset) are left out of the blocks and folded into the merged result
// once per row at the end (attention_softmax_offset_merge); backward needs only the merged lse. Without a cache only the local block is kept
// for backward: activation memory is S_local·B·2·KV·HD per layer, not S_global·B·2·KV·HD.
//
// The single ring: at step i rank r holds the block of rank (r − i) mod N, received from r − 1.
// The double ring (--cp-window-size W, LoongTrain / MindSpeed): the N ranks form N/W windows of W
// consecutive ranks; rank r = w·W + k is inner rank k of window w. Round j = 0 .. N/W − 1 starts
// with the block of rank (w − j, k) and runs W inner steps, the blocks moving one rank along the
// window each step, so at round j, inner step i the rank holds the block of rank (w − j, k − i)
// (indices mod N/W and W). Meanwhile the round's first block travels to the same inner rank of the
// next window (the outer ring), overlapping the whole inner round. The blocks are the single
// ring's in another order: the same N − 1 transfers per rank, most of them inside a window.
//
// Backward runs the same schedule again. For each visiting block, attention's backward with the
// merged (global) output and lse gives exactly that block's share of dQ (accumulated here) and the
// block's dK, dV. The gradient of a block travels one hop behind it, each rank adding its share:
// along the window within a round, and at a round's end from (w, k) to (w + 1, k + 1), the rank
// that holds the block first in the next round; after N hops it is back at the owner, which
// writes it into its dQKV rows. The send of one step's gradient overlaps the next step's attention.
//
// --context-parallel-kv-cache-policy (RingOptions::cache): forward keeps the N − 1 blocks it
// received (full) or their keys (half), and backward takes them from there instead of passing
// them around again (half: only the values travel). Memory per layer grows to S_global·B·2·KV·HD
// (full) or S_local·B·2·KV·HD + (S_global − S_local)·B·KV·HD (half).
//
// Under adaptive_cp_algo the split carries an explicit layout (parallel/cp_layout.h): the ranks'
// positions come from it, and a visiting block none of whose keys this rank's queries see is not
// attended to (forward) and adds nothing to dQ or to its travelling gradient (backward); it still
// travels, since later ranks of the ring may need it.
//
// Per layer and rank, forward sends N − 1 blocks of S_local·B·2·KV·HD floats; backward sends N − 1
// key/value blocks (none with the full cache, N − 1 value halves with the half cache) and N
// gradient blocks (docs/parallelism.md §11).
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/op_table.h"
#include "model/ring_options.h"
#include "parallel/context_split.h"

namespace gale {

// Online-softmax merge of a partial attention result into a running one, in place:
// lse = log(e^lse + e^lse_b), out = e^(lse_old − lse)·out + e^(lse_b − lse)·out_b.
// out / out_b are [Sq·B, NH·HD] (row s·B + b, head h at columns h·HD), lse / lse_b are
// [B, NH, Sq]. A query that sees no key of a block has lse −inf there and that block adds nothing
// (its out rows are ignored); a query that sees no key in either keeps lse −inf and out 0.
void merge_attention_partial(int64_t B, int64_t NH, int64_t Sq, int64_t HD, float* out, float* lse,
                             const float* out_b, const float* lse_b);

// What ring_attention_forward keeps for backward.
struct RingSaved {
  Tensor local_kv;  // this rank's key/value block [S_local·B, 2·KV·HD] (context_key_layout / context_value_layout)
  // RingKvCache::kFull: the N − 1 blocks received, in step order [N − 1, S_local·B, 2·KV·HD];
  // kHalf: their keys [N − 1, S_local·B, KV·HD]; kNone: undefined.
  Tensor cache;
  // adaptive_cp_algo (split.layout): the visiting blocks whose attention forward skipped, because
  // none of this rank's queries sees any of their keys (parallel/cp_layout.h). The blocks still
  // travel around the ring; backward skips the same ones.
  int64_t skipped_blocks = 0;
};

// Forward of this rank's queries (read from `qkv` through ql) against the keys and values of the
// whole sequence, fetched block by block around `cp` (one ring, or windows of opts.window ranks).
// `ap` is the all-gather problem of this rank: Sq = S_local, Sk = S_global, q_positions the local
// global positions, k_doc_ids (when set) the document ids of the whole sequences [B, S_global].
// WRITES out [S_local·B, NH·HD] and lse [B, NH, S_local]. Returns what backward needs (with
// opts.cache the blocks received).
RingSaved ring_attention_forward(Communicator& cp, const ContextSplit& split, const RingOptions& opts,
                                 AttentionForwardFn forward, const AttentionProblem& ap, const float* qkv,
                                 const HeadLayout& ql, const HeadLayout& kl, const HeadLayout& vl, float* out,
                                 float* lse);

// Backward of ring_attention_forward (the same opts.window; the cache is what `saved` holds):
// out / lse its merged output and lse, dout the output's gradient. WRITES dq into dqkv through ql
// and this rank's dK, dV (summed over every rank's queries) into dqkv through kl / vl.
void ring_attention_backward(Communicator& cp, const ContextSplit& split, const RingOptions& opts,
                             AttentionBackwardFn backward, const AttentionProblem& ap, const float* qkv,
                             const HeadLayout& ql, const RingSaved& saved, const float* out, const float* lse,
                             const float* dout, float* dqkv, const HeadLayout& kl, const HeadLayout& vl);

}  // namespace gale
