// MindSpeed's adaptive context parallelism (--context-parallel-algo adaptive_cp_algo | hybrid_adaptive_cp_algo): a layout of the sequence over the cp ranks chosen from the attention mask, so that ring attention can skip empty blocks.
//
// Ring attention computes, on every cp rank q, one attention call per key block k (the positions
// of rank k). When the mask hides every (query, key) pair of block (q, k) the call is wasted work.
// The adaptive layout (MindSpeed's AdaptiveContextParallelFeature, re-designed for Gale's ring):
//
//  1. The block structure. The mask is Gale's: causal, per document (--reset-attention-mask: the
//     document ids of the micro-batch's samples) and banded (--sliding-window), so query q sees an
//     interval of keys; the sequence is cut into G units of S/G positions and w[a][b] counts the
//     visible pairs between query unit a and key unit b, summed over the samples. By default a
//     unit holds at least S/1024 positions (MindSpeed coarsens the mask to 1024 × 1024) and a
//     flash-attention tile (64 positions, or S/(4N) when a rank holds fewer than 4 tiles), so a
//     remapped rank holds whole tiles; G = S with --adaptive-cp-without-coarse (single positions).
//  2. The remap (skipped with --adaptive-cp-only-reschedule, which keeps the sequence in order,
//     rank r holding positions r·S/N … (r+1)·S/N − 1, as MindSpeed's identity order). Each rank
//     holds G/N units. Starting from the better of the contiguous order and Megatron's
//     load-balanced split (when G is a multiple of 2N), pairs of units on different ranks are
//     swapped while that lowers, in this order, (i) the largest number of non-empty blocks in a
//     rank's row (attention calls per ring pass), (ii) the largest number of visible pairs in a
//     row (work; a gain within 1/32 does not pay for an extra non-empty block), (iii) the number
//     of non-empty blocks (at most 2^18 candidate swaps). This greedy search is Gale's own; MindSpeed
//     clusters the coarsened mask's rows (PCA + k-means) instead. Positions are kept ascending
//     within a rank.
//  3. The schedule. Gale keeps the ring: every block still travels around it (a later rank may
//     need it), and a rank skips the attention of an empty block in forward and in backward (the
//     block's gradient passes through unchanged). MindSpeed's scheduler also moves queries to idle
//     ranks and sends only the blocks a round needs; Gale does not.
//
// The result is exact: an empty block contributes nothing to any output, lse or gradient.
// hybrid_adaptive_cp_algo runs the same over the ring of its R = N/U Ulysses groups
// (hybrid_cp_layout below).
#pragma once

#include <cstdint>
#include <memory>

#include "parallel/cp_layout.h"

namespace gale {

// The mask of one micro-batch: causal, optionally per document and banded.
struct CpMaskSpec {
  int64_t B = 1, S = 0;
  const int32_t* document_ids = nullptr;  // [B, S] (--reset-attention-mask), or null: one document
  int64_t window = 0;                     // --sliding-window W (0: none)
};

struct AdaptiveCpOptions {
  bool remap = true;   // false: --adaptive-cp-only-reschedule (the sequence in order)
  bool coarse = true;  // false: --adaptive-cp-without-coarse (units of one position)
};

// Units the sequence is cut into: S without coarsening, else the largest divisor of S that is a
// multiple of N and at most S / max(S/1024, min(64, S/(4N)), 1).
int64_t adaptive_cp_units(int64_t S, int64_t N, bool coarse);

// Megatron's load-balanced split (parallel/context_split.h) and the contiguous split (rank r holds
// positions r·S/N …), with the block counts of `mask`; for comparisons and as starting points.
CpLayout load_balanced_cp_layout(const CpMaskSpec& mask, int64_t N);
CpLayout contiguous_cp_layout(const CpMaskSpec& mask, int64_t N);

// The adaptive layout of `mask` over N ranks (S a multiple of 2N).
CpLayout adaptive_cp_layout(const CpMaskSpec& mask, int64_t N, const AdaptiveCpOptions& options);

// hybrid_adaptive_cp_algo: the layout of the N = R·U cp ranks for `ring`, an adaptive layout over
// the R ring sub-groups. As under hybrid_cp_algo (parallel/hybrid_cp_groups.h), Ulysses rank k of
// group g holds the block-local indices of Megatron's split of ring rank g's S/R positions over U
// ranks (ContextSplit{S/R, U, k}), so the Ulysses all-to-all delivers ring rank g's positions in its
// layout's order; position s of cp rank c = g·U + k is ring.position(g, ContextSplit{S/R, U, k}
// .global_position(s)). The result carries `ring` (CpLayout::ring).
CpLayout hybrid_cp_layout(std::shared_ptr<const CpLayout> ring, int64_t ulysses_degree);

// The layouts of a run: computed for every micro-batch with --adaptive-cp-dynamic-attn-mask, else
// once, for the first micro-batch, and reused (MindSpeed's cached grid mask; the flags' validation
// requires the dynamic mode when document masks change between micro-batches).
class AdaptiveCpPlanner {
 public:
  AdaptiveCpPlanner(int64_t cp_size, const AdaptiveCpOptions& options, bool dynamic)
      : N_(cp_size), options_(options), dynamic_(dynamic) {}
  std::shared_ptr<const CpLayout> layout_for(const CpMaskSpec& mask);
  int64_t layouts_computed() const { return computed_; }
  int64_t ring_size() const { return N_; }

 private:
  int64_t N_;
  AdaptiveCpOptions options_;
  bool dynamic_;
  std::shared_ptr<const CpLayout> cached_;
  int64_t computed_ = 0;
};

}  // namespace gale
