// The dist-train rank map: sub-worlds, global pipeline stages and the peers of boundary transfers.
#include "parallel/dist_train_layout.h"

#include "core/check.h"

namespace gale {

int DistTrainLayout::world_size() const {
  int n = 0;
  for (const DistTrainSubWorld& s : subworlds) n += s.world_size;
  return n;
}

int DistTrainLayout::num_stages() const {
  int n = 0;
  for (const DistTrainSubWorld& s : subworlds) n += s.pp;
  return n;
}

int DistTrainLayout::subworld_of(int rank) const {
  for (size_t i = 0; i < subworlds.size(); ++i)
    if (rank >= subworlds[i].first_rank && rank < subworlds[i].first_rank + subworlds[i].world_size)
      return static_cast<int>(i);
  GALE_CHECK(false) << "rank " << rank << " is in no dist-train sub-world (job of " << world_size() << " ranks)";
  return -1;
}

int DistTrainLayout::tp_of(int rank) const {
  const DistTrainSubWorld& s = subworlds[static_cast<size_t>(subworld_of(rank))];
  return (rank - s.first_rank) % s.tp;
}

int DistTrainLayout::dp_of(int rank) const {
  const DistTrainSubWorld& s = subworlds[static_cast<size_t>(subworld_of(rank))];
  return (rank - s.first_rank) / s.tp % s.dp;
}

int DistTrainLayout::stage_of(int rank) const {
  const DistTrainSubWorld& s = subworlds[static_cast<size_t>(subworld_of(rank))];
  return s.first_stage + (rank - s.first_rank) / (s.tp * s.dp);
}

int DistTrainLayout::rank_at(int s, int tp, int dp, int pp) const {
  const DistTrainSubWorld& w = subworlds[static_cast<size_t>(s)];
  GALE_CHECK(tp >= 0 && tp < w.tp && dp >= 0 && dp < w.dp && pp >= 0 && pp < w.pp);
  return w.first_rank + tp + w.tp * (dp + w.dp * pp);
}

int DistTrainLayout::subworld_of_stage(int stage) const {
  for (size_t i = 0; i < subworlds.size(); ++i)
    if (stage >= subworlds[i].first_stage && stage < subworlds[i].first_stage + subworlds[i].pp)
      return static_cast<int>(i);
  GALE_CHECK(false) << "stage " << stage << " is in no dist-train sub-world (" << num_stages() << " stages)";
  return -1;
}

std::vector<int> DistTrainLayout::pipeline_ranks(int dp) const {
  std::vector<int> out;
  for (size_t i = 0; i < subworlds.size(); ++i)
    for (int p = 0; p < subworlds[i].pp; ++p)
      for (int t = 0; t < subworlds[i].tp; ++t) out.push_back(rank_at(static_cast<int>(i), t, dp, p));
  return out;
}

int DistTrainLayout::source_of(int rank, int from_stage) const {
  const int me = stage_of(rank);
  GALE_CHECK(from_stage == me - 1 || from_stage == me + 1) << "stage " << from_stage << " is not next to " << me;
  const int s_recv = subworld_of(rank), s_send = subworld_of_stage(from_stage);
  const DistTrainSubWorld& send = subworlds[static_cast<size_t>(s_send)];
  const DistTrainSubWorld& recv = subworlds[static_cast<size_t>(s_recv)];
  const int tp = s_send == s_recv ? tp_of(rank) : tp_of(rank) * send.tp / recv.tp;
  return rank_at(s_send, tp, dp_of(rank), from_stage - send.first_stage);
}

std::vector<int> DistTrainLayout::targets_of(int rank, int to_stage) const {
  const int me = stage_of(rank);
  const int s = subworld_of_stage(to_stage);
  const DistTrainSubWorld& w = subworlds[static_cast<size_t>(s)];
  std::vector<int> out;
  for (int t = 0; t < w.tp; ++t) {
    const int r = rank_at(s, t, dp_of(rank), to_stage - w.first_stage);
    if (source_of(r, me) == rank) out.push_back(r);
  }
  return out;
}

std::vector<int64_t> DistTrainLayout::stage_layers() const {
  std::vector<int64_t> out;
  for (const DistTrainSubWorld& s : subworlds)
    for (int p = 0; p < s.pp; ++p) out.push_back(s.num_layers / s.pp);
  return out;
}

}  // namespace gale
