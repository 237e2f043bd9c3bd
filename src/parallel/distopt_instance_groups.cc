// The intra- and inter-instance sub-groups of the dp-cp group for the partial distributed optimizer.
#include "parallel/distopt_instance_groups.h"

#include <vector>

#include "core/check.h"

namespace gale {

DistOptInstanceGroups make_distopt_instance_groups(const Comm& dp_cp, int64_t instances) {
  DistOptInstanceGroups groups;
  if (instances == 1) return groups;
  GALE_CHECK(dp_cp != nullptr) << "the partial distributed optimizer needs the dp-cp group";
  const int64_t M = dp_cp->size(), N = instances;
  GALE_CHECK(N >= 1 && M % N == 0) << "--num-distributed-optimizer-instances " << N << " must divide the dp-cp size "
                                   << M;
  const int64_t I = M / N, r = dp_cp->rank(), g = r / I, k = r % I;
  const std::vector<int>& world = dp_cp->world_ranks();
  std::vector<int> intra, inter;
  for (int64_t j = 0; j < I; ++j) intra.push_back(world[static_cast<size_t>(g * I + j)]);
  for (int64_t j = 0; j < N; ++j) inter.push_back(world[static_cast<size_t>(j * I + k)]);
  groups.intra = dp_cp->make_group(intra, "dp-cp-intra-instance");
  groups.inter = dp_cp->make_group(inter, "dp-cp-inter-instance");
  return groups;
}

}  // namespace gale
