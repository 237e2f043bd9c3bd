// Building the communicators of every group of a rank layout.
#include "parallel/parallel_state.h"

#include "core/check.h"

namespace gale {

ParallelState::ParallelState() {
  ParallelSizes one;
  StatusOr<RankLayout> layout = compute_rank_layout(one);
  GALE_CHECK_OK(layout.status());
  layout_ = std::make_shared<const RankLayout>(std::move(layout).value());
  world_ = make_self_communicator("world");
  for (int g = 0; g < kNumGroups; ++g) groups_[g] = make_self_communicator(group_name(static_cast<Group>(g)));
}

ParallelState ParallelState::create(const Comm& world, const RankLayout& layout) {
  GALE_CHECK_EQ(layout.sizes.world_size, world->size()) << "rank layout for another world size";
  ParallelState ps{Uninitialised{}};
  ps.layout_ = std::make_shared<const RankLayout>(layout);
  ps.world_ = world;
  const int me = world->world_ranks()[world->rank()];
  ps.coords_ = layout.coords(me);
  for (int g = 0; g < kNumGroups; ++g) {
    Group kind = static_cast<Group>(g);
    ps.groups_[g] = world->make_group(layout.group_of(kind, me), group_name(kind));
  }
  return ps;
}

CommStats ParallelState::total_stats() const {
  CommStats total;
  for (const Comm& c : groups_) {
    if (!c) continue;
    const CommStats& s = c->stats();
    for (size_t i = 0; i < total.calls.size(); ++i) {
      total.calls[i] += s.calls[i];
      total.bytes[i] += s.bytes[i];
    }
    total.wait_seconds += s.wait_seconds;
  }
  return total;
}

void ParallelState::reset_stats() const {
  for (const Comm& c : groups_)
    if (c) c->reset_stats();
}

}  // namespace gale
