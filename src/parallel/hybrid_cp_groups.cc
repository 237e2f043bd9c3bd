// Hybrid context parallelism's Ulysses and ring sub-groups of the cp group, and their splits.
#include "parallel/hybrid_cp_groups.h"

#include <vector>

#include "core/check.h"

namespace gale {

HybridCpGroups make_hybrid_cp_groups(const Comm& cp, int64_t ulysses_degree) {
  GALE_CHECK(cp != nullptr) << "hybrid context parallelism needs a cp group";
  const int64_t N = cp->size(), U = ulysses_degree;
  GALE_CHECK(U >= 1 && N % U == 0) << "--ulysses-degree-in-cp " << U << " must divide the cp size " << N;
  const int64_t c = cp->rank(), k = c % U, g = c / U, R = N / U;
  const std::vector<int>& world = cp->world_ranks();
  std::vector<int> ulysses, ring;
  for (int64_t j = 0; j < U; ++j) ulysses.push_back(world[static_cast<size_t>(g * U + j)]);
  for (int64_t j = 0; j < R; ++j) ring.push_back(world[static_cast<size_t>(j * U + k)]);
  HybridCpGroups groups;
  groups.ulysses = cp->make_group(ulysses, "cp-ulysses");
  groups.ring = cp->make_group(ring, "cp-ring");
  return groups;
}

ContextSplit hybrid_ulysses_split(int64_t seq_length, int64_t cp_size, int64_t ulysses_degree, int64_t cp_rank) {
  return ContextSplit{seq_length / (cp_size / ulysses_degree), ulysses_degree, cp_rank % ulysses_degree, {}};
}

ContextSplit hybrid_ring_split(int64_t seq_length, int64_t cp_size, int64_t ulysses_degree, int64_t cp_rank) {
  return ContextSplit{seq_length, cp_size / ulysses_degree, cp_rank / ulysses_degree, {}};
}

}  // namespace gale
