// GRPO's training rows: this data-parallel rank's rollouts as padded rows, or packed into bins (Megatron-LM main's --rl-use-sequence-packing).
//
// Unpacked (Megatron's default): data-parallel rank r of DP trains rows [r·R/DP, (r+1)·R/DP) of the
// collection's R rollouts, each its own row of --seq-length positions.
//
// Packed (megatron/rl/sequence_packing_utils.py): every rank packs the whole collection the same way,
//  - each rollout's length is its tokens up to its last non-pad one (get_actual_sequence_lengths);
//  - the rollouts in decreasing length (a stable sort: equal lengths keep collection order) go into
//    bins of --seq-length positions next-fit: a rollout joins the open bin when its slot (its length
//    rounded up to `seq_length_multiple`, 2·CP at CP > 1) still fits and the bin holds fewer than
//    --rl-sequence-packing-max-sequences-per-bin rollouts, else it opens a new bin;
//  - in a bin each rollout starts at its slot's start, with position ids 0, 1, ... and its own
//    document id over its slot (attention stays inside it); the rest of the bin is pad tokens,
//    loss mask 0, position id 0 (Megatron's), a document of its own;
//  - the bins go to the data-parallel ranks by --rl-sequence-packing-algo: `fifo` gives rank r the
//    r-th of DP consecutive runs (the first num_bins mod DP ranks one bin more), `round-robin` bins
//    r, r + DP, r + 2·DP, ...; every rank is then padded with empty bins (all pad, no loss) to
//    ceil(num_bins / DP).
// The loss mask, inference log-probabilities and advantages of each position are its rollout's
// (the advantage per position: the rollout's).
//
// Training over the rows (train/grpo.h): micro-batches of --micro-batch-size rows (1 when packing,
// Megatron's requirement) cycle over this rank's rows; an iteration takes
// unpacked: --global-batch-size / (mbs·DP) micro-batches,
// packed:   ceil(gbs / R · bins on this rank) bins (Megatron's update_microbatch_calculator).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/micro_batch.h"
#include "train/grpo_rollouts.h"

namespace gale {

struct GrpoPackingOptions {
  bool enabled = false;                // --rl-use-sequence-packing
  int64_t max_sequences_per_bin = 50;  // --rl-sequence-packing-max-sequences-per-bin
  std::string algo = "fifo";           // --rl-sequence-packing-algo: fifo | round-robin
  int64_t seq_length_multiple = 1;     // each rollout's slot a multiple of this (2·CP at CP > 1)
};

// This rank's training rows, [rows, S] sample-major.
struct GrpoTrainingRows {
  int64_t rows = 0, S = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> position_ids;
  std::vector<int32_t> document_ids;        // packed: the rollout's index in its bin; empty unpacked
  std::vector<float> loss_mask;             // position s predicts token s + 1 (grpo_rollouts.h)
  std::vector<double> inference_logprobs;   // empty when the collection has none
  std::vector<double> advantages;           // each position's rollout's
  std::vector<std::vector<int64_t>> members;  // [rows]: the collection rows in each row (empty bin: none)
  // Packed: every rank's bins before the empty ones, and the rollouts per bin over them.
  int64_t total_bins = 0, min_per_bin = 0, max_per_bin = 0;
  double mean_per_bin = 0.0;
  // Packed: the rollouts' lengths summed over this rank's bins and over the whole collection
  // (Megatron's actual tokens and packing-efficiency numerator).
  int64_t rank_tokens = 0, collection_tokens = 0;
};

// Each rollout's length: its positions up to and including its last non-`pad` token (0: all pad).
std::vector<int64_t> grpo_sequence_lengths(const GrpoRollouts& r, int32_t pad);

// The unpacked rows of data-parallel rank `dp_rank` of `dp` (R divisible by dp).
GrpoTrainingRows grpo_unpacked_rows(const GrpoRollouts& r, int64_t dp, int64_t dp_rank);

// The packed bins of data-parallel rank `dp_rank` of `dp` (header comment). InvalidArgument when a
// rollout's slot is longer than --seq-length or the options are out of range.
StatusOr<GrpoTrainingRows> grpo_packed_rows(const GrpoRollouts& r, int32_t pad, const GrpoPackingOptions& o, int64_t dp,
                                            int64_t dp_rank);

// Rows [first, first + n) of `t` as one micro-batch: tokens, next-token labels within the row (the
// last position's label `pad`, masked), the loss mask, position and document ids, sample ids id0 + i.
MicroBatch grpo_rows_micro_batch(const GrpoTrainingRows& t, int64_t first, int64_t n, int32_t pad, int64_t id0);

}  // namespace gale
