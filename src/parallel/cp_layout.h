// An explicit context-parallel layout: which global positions each cp rank holds and which (query rank, key rank) blocks of attention are empty (adaptive_cp_algo).
//
// Megatron's load-balanced split (parallel/context_split.h) is a formula; MindSpeed's adaptive CP
// (parallel/adaptive_cp.h) chooses the positions of every rank from the attention mask of the
// micro-batch, so the choice travels as data: `positions` lists, rank after rank, the S/N global
// positions each rank holds (ascending within a rank for a ring's layout), and `block_pairs` counts, for every pair of
// ranks (q, k), the visible (query, key) pairs between rank q's queries and rank k's keys, summed
// over the samples of the micro-batch. A block with no visible pair is skipped by ring attention
// (model/ring_attention.h): no attention is computed for it, in forward or backward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace gale {

struct CpLayout {
  int64_t cp_size = 1;
  int64_t seq_length = 0;           // S_global
  std::vector<int32_t> positions;   // [cp_size, S_global / cp_size], ascending within each rank
  std::vector<int64_t> block_pairs; // [cp_size, cp_size]: visible pairs of (query rank, key rank)
  // hybrid_adaptive_cp_algo: the layout of the ring sub-groups (R = CP/U ranks, parallel/adaptive_cp.h),
  // whose blocks the ring skips; this layout then only places the cp ranks' positions (no block_pairs).
  std::shared_ptr<const CpLayout> ring;

  int64_t local_length() const { return seq_length / cp_size; }
  int32_t position(int64_t rank, int64_t s) const { return positions[static_cast<size_t>(rank * local_length() + s)]; }
  int64_t pairs(int64_t q_rank, int64_t k_rank) const { return block_pairs[static_cast<size_t>(q_rank * cp_size + k_rank)]; }
  bool nonempty(int64_t q_rank, int64_t k_rank) const { return pairs(q_rank, k_rank) > 0; }
  // Non-empty blocks in rank r's row (the attention calls rank r runs per ring pass), and in all rows.
  int64_t nonempty_in_row(int64_t r) const;
  int64_t nonempty_blocks() const;
};

inline int64_t CpLayout::nonempty_in_row(int64_t r) const {
  int64_t n = 0;
  for (int64_t k = 0; k < cp_size; ++k) n += nonempty(r, k) ? 1 : 0;
  return n;
}

inline int64_t CpLayout::nonempty_blocks() const {
  int64_t n = 0;
  for (int64_t r = 0; r < cp_size; ++r) n += nonempty_in_row(r);
  return n;
}

}  // namespace gale
