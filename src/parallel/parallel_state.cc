// Building the communicators of every group of a rank layout.
#include "parallel/parallel_state.h"

#include "core/check.h"
#include "parallel/dist_train_pipeline_comm.h"

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
  // The layout numbers the members of `world` 0..size-1 (`world` may itself be a sub-group);
  // make_group takes global ranks.
  const int me = world->rank();
  ps.coords_ = layout.coords(me);
  for (int g = 0; g < kNumGroups; ++g) {
    Group kind = static_cast<Group>(g);
    std::vector<int> members = layout.group_of(kind, me);
    for (int& r : members) r = world->world_ranks()[static_cast<size_t>(r)];
    ps.groups_[g] = world->make_group(members, group_name(kind));
  }
  return ps;
}

ParallelState ParallelState::create_dist_train(const Comm& world, const DistTrainLayout& dt, int64_t hidden,
                                               int64_t micro_batch) {
  GALE_CHECK_EQ(dt.world_size(), world->size()) << "dist-train sub-worlds for another world size";
  const int me = world->rank();
  const auto global = [&](std::vector<int> ranks) {
    for (int& r : ranks) r = world->world_ranks()[static_cast<size_t>(r)];
    return ranks;
  };
  const DistTrainSubWorld& w = dt.subworlds[static_cast<size_t>(dt.subworld_of(me))];
  std::vector<int> members;
  for (int r = w.first_rank; r < w.first_rank + w.world_size; ++r) members.push_back(r);
  Comm sub = world->make_group(global(members), "subworld-" + w.name);
  ParallelSizes sizes;
  sizes.world_size = w.world_size;
  sizes.tp = w.tp;
  sizes.pp = w.pp;
  sizes.cp = w.cp;
  StatusOr<RankLayout> layout = compute_rank_layout(sizes);
  GALE_CHECK_OK(layout.status());
  ParallelState ps = create(sub, layout.value());
  ps.world_ = world;
  ps.dist_train_ = std::make_shared<const DistTrainLayout>(dt);
  ps.pipeline_stages_ = dt.num_stages();
  ps.coords_.pp = dt.stage_of(me);
  const std::vector<int> pipeline = dt.pipeline_ranks(dt.main_dp_of(me));
  ps.groups_[static_cast<int>(Group::kModel)] =
      std::make_shared<DistTrainModelComm>(world->make_group(global(pipeline), "model"), dt.first_replica(me));
  Comm transport = world->make_group(global(pipeline), "pp-dist-train");
  ps.groups_[static_cast<int>(Group::kPipeline)] =
      std::make_shared<DistTrainPipelineComm>(transport, ps.dist_train_, me, hidden, micro_batch);
  // Tied embeddings: the first and the last stage of this main replica, every TP rank and replica
  // of both (their shards of the vocabulary differ; allreduce_embedding_grads sums whole tensors).
  std::vector<int> ends;
  for (int r : pipeline)
    if (dt.stage_of(r) == 0 || dt.stage_of(r) == dt.num_stages() - 1) ends.push_back(r);
  const bool at_end = ps.coords_.pp == 0 || ps.coords_.pp == dt.num_stages() - 1;
  ps.groups_[static_cast<int>(Group::kEmbedding)] = world->make_group(at_end ? global(ends) : std::vector<int>{},
                                                                      "embedding");
  ps.groups_[static_cast<int>(Group::kPositionEmbedding)] = nullptr;
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
