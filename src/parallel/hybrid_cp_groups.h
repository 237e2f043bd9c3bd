// The sub-groups of MindSpeed's hybrid context parallelism (hybrid_cp_algo, Ulysses x ring, "USP").
//
// The cp group of N ranks is factored into N/U Ulysses sub-groups of U = --ulysses-degree-in-cp
// ranks and U ring sub-groups of R = N/U ranks. As in MindSpeed, a Ulysses sub-group is U
// consecutive cp ranks: cp rank c is Ulysses rank k = c mod U of group g = c / U, i.e. the cp
// ranks {gU, ..., gU + U − 1}; ring sub-group k is the cp ranks {k, k + U, ..., k + (R − 1)U}, in
// which cp rank c is ring rank g. E.g. N = 4, U = 2: Ulysses {0, 1}, {2, 3}; ring {0, 2}, {1, 3}.
//
// Positions under Gale's load-balanced split (parallel/context_split.h, 2N chunks of C positions,
// cp rank c holding chunks c and 2N − 1 − c): Ulysses group g holds chunks gU .. gU + U − 1 and
// 2N − (g+1)U .. 2N − 1 − gU, which are exactly the two halves of ring rank g under the
// load-balanced split of the whole sequence over R ranks with chunks of U·C positions
// (ContextSplit{S, R, g}). Inside that block of S/R positions, Ulysses rank k holds chunks k and
// 2U − 1 − k of 2U chunks, i.e. ContextSplit{S/R, U, k}. So the Ulysses all-to-all over
// ContextSplit{S/R, U, k} (model/context_parallel.h) puts the group's rows in the ring rank's
// local position order, and ring attention over ContextSplit{S, R, g} sees key blocks whose union
// is the whole sequence.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "parallel/context_split.h"

namespace gale {

struct HybridCpGroups {
  Comm ulysses;  // the U consecutive cp ranks of this rank's Ulysses sub-group (null without hybrid CP)
  Comm ring;     // the R = N/U cp ranks with the same Ulysses rank

  int64_t ulysses_degree() const { return ulysses ? ulysses->size() : 1; }
  int64_t ring_degree() const { return ring ? ring->size() : 1; }
};

// Creates both sub-groups of `cp` (N ranks) for Ulysses degree `ulysses_degree` (which must divide
// N). Collective over `cp`: every member calls it with the same degree.
HybridCpGroups make_hybrid_cp_groups(const Comm& cp, int64_t ulysses_degree);

// The split of the Ulysses all-to-all: the ring block of S_global / R positions over the U
// Ulysses ranks (ContextSplit{S_global / R, U, k}), for cp rank `cp_rank`.
ContextSplit hybrid_ulysses_split(int64_t seq_length, int64_t cp_size, int64_t ulysses_degree, int64_t cp_rank);
// The split of the ring: the whole sequence over R ring ranks (ContextSplit{S_global, R, g}).
ContextSplit hybrid_ring_split(int64_t seq_length, int64_t cp_size, int64_t ulysses_degree, int64_t cp_rank);

}  // namespace gale
