// The sub-groups of Megatron's partial distributed optimizer (--num-distributed-optimizer-instances).
//
// The dp-cp group of M = DP·CP ranks (in its own rank order, as Megatron's ranks_with_cp) is cut
// into N instances of I = M/N consecutive ranks: dp-cp rank r belongs to the intra-instance group
// of ranks {gI, ..., gI + I − 1} (g = r / I), inside which it is rank r mod I, and to the
// inter-instance group of ranks {k, k + I, ..., k + (N − 1)I} (k = r mod I), inside which it is
// rank g, the instance id. E.g. M = 4, N = 2: intra {0, 1}, {2, 3}; inter {0, 2}, {1, 3}.
//
// The optimizer state is sharded over the intra group (each instance is one distributed
// optimizer) and replicated across instances: gradients are reduce-scattered inside the instance
// and the shards all-reduced across instances; parameters are all-gathered inside the instance.
#pragma once

#include <cstdint>

#include "comm/communicator.h"

namespace gale {

struct DistOptInstanceGroups {
  Comm intra;  // the I consecutive dp-cp ranks of this rank's instance (null with one instance)
  Comm inter;  // the N dp-cp ranks at this rank's position in every instance

  int64_t instance_id() const { return inter ? inter->rank() : 0; }
};

// Creates both sub-groups of `dp_cp` for `instances` instances (which must divide its size).
// Collective over `dp_cp`: every member calls it with the same count. One instance: both null.
DistOptInstanceGroups make_distopt_instance_groups(const Comm& dp_cp, int64_t instances);

}  // namespace gale
