// The dist-train rank map: sub-worlds, global pipeline stages and the peers of boundary transfers.
#include "parallel/dist_train_layout.h"

#include <algorithm>

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

int DistTrainLayout::cp_of(int rank) const {
  const DistTrainSubWorld& s = subworlds[static_cast<size_t>(subworld_of(rank))];
  return (rank - s.first_rank) / s.tp % s.cp;
}

int DistTrainLayout::dp_of(int rank) const {
  const DistTrainSubWorld& s = subworlds[static_cast<size_t>(subworld_of(rank))];
  return (rank - s.first_rank) / (s.tp * s.cp) % s.dp;
}

int DistTrainLayout::stage_of(int rank) const {
  const DistTrainSubWorld& s = subworlds[static_cast<size_t>(subworld_of(rank))];
  return s.first_stage + (rank - s.first_rank) / (s.tp * s.cp * s.dp);
}

int DistTrainLayout::rank_at(int s, int tp, int dp, int pp, int cp) const {
  const DistTrainSubWorld& w = subworlds[static_cast<size_t>(s)];
  GALE_CHECK(tp >= 0 && tp < w.tp && dp >= 0 && dp < w.dp && pp >= 0 && pp < w.pp && cp >= 0 && cp < w.cp);
  return w.first_rank + tp + w.tp * (cp + w.cp * (dp + w.dp * pp));
}

int DistTrainLayout::subworld_of_stage(int stage) const {
  for (size_t i = 0; i < subworlds.size(); ++i)
    if (stage >= subworlds[i].first_stage && stage < subworlds[i].first_stage + subworlds[i].pp)
      return static_cast<int>(i);
  GALE_CHECK(false) << "stage " << stage << " is in no dist-train sub-world (" << num_stages() << " stages)";
  return -1;
}

int DistTrainLayout::dp() const {
  int d = 0;
  for (const DistTrainSubWorld& s : subworlds) d = d == 0 ? s.dp : std::min(d, s.dp);
  return std::max(d, 1);
}

std::vector<int> DistTrainLayout::pipeline_ranks(int dp) const {
  std::vector<int> out;
  for (size_t i = 0; i < subworlds.size(); ++i) {
    const int k = dp_ratio(static_cast<int>(i));
    for (int p = 0; p < subworlds[i].pp; ++p)
      for (int d = dp * k; d < (dp + 1) * k; ++d)
        for (int c = 0; c < subworlds[i].cp; ++c)
          for (int t = 0; t < subworlds[i].tp; ++t) out.push_back(rank_at(static_cast<int>(i), t, d, p, c));
  }
  return out;
}

std::vector<DistTrainLayout::Peer> DistTrainLayout::sources_of(int rank, int from_stage) const {
  const int me = stage_of(rank);
  GALE_CHECK(from_stage == me - 1 || from_stage == me + 1) << "stage " << from_stage << " is not next to " << me;
  const int b = subworld_of(rank), a = subworld_of_stage(from_stage);
  const DistTrainSubWorld& send = subworlds[static_cast<size_t>(a)];
  const DistTrainSubWorld& recv = subworlds[static_cast<size_t>(b)];
  const int local = from_stage - send.first_stage, dp = dp_of(rank), cp = cp_of(rank);
  if (a == b) return {Peer{rank_at(a, tp_of(rank), dp, local, cp), 0, 1}};
  if (sequence_parallel && (send.tp > 1 || recv.tp > 1)) {  // sequence slices (equal DP: validated)
    const int j = tp_of(rank);
    if (send.tp <= recv.tp) return {Peer{rank_at(a, j / (recv.tp / send.tp), dp, local, cp), 0, 1}};
    const int q = send.tp / recv.tp;
    std::vector<Peer> out;
    for (int r = 0; r < q; ++r) out.push_back(Peer{rank_at(a, j * q + r, dp, local, cp), r, q, true});
    return out;
  }
  const int tp = tp_of(rank) * send.tp / recv.tp;
  const int ka = dp_ratio(a), kb = dp_ratio(b);
  if (ka <= kb) return {Peer{rank_at(a, tp, dp / (kb / ka), local, cp), 0, 1}};
  const int q = ka / kb;
  std::vector<Peer> out;
  for (int r = 0; r < q; ++r) out.push_back(Peer{rank_at(a, tp, dp * q + r, local, cp), r, q});
  return out;
}

std::vector<DistTrainLayout::Peer> DistTrainLayout::targets_of(int rank, int to_stage) const {
  const int me = stage_of(rank);
  if (to_stage < me && forward_only_stage(to_stage)) return {};  // no gradient for a frozen sub-world
  const int a = subworld_of(rank), b = subworld_of_stage(to_stage);
  const DistTrainSubWorld& w = subworlds[static_cast<size_t>(b)];
  const int ka = dp_ratio(a), kb = dp_ratio(b), main = main_dp_of(rank);
  std::vector<Peer> out;
  for (int d = main * kb; d < (main + 1) * kb; ++d)
    for (int t = 0; t < w.tp; ++t) {
      const int r = rank_at(b, t, d, to_stage - w.first_stage, cp_of(rank));
      for (const Peer& p : sources_of(r, me)) {
        if (p.rank != rank) continue;
        const DistTrainSubWorld& v = subworlds[static_cast<size_t>(a)];
        if (a != b && sequence_parallel && (v.tp > 1 || w.tp > 1) && v.tp < w.tp)
          out.push_back(Peer{r, t % (w.tp / v.tp), w.tp / v.tp, true});
        else if (a != b && ka < kb)
          out.push_back(Peer{r, d % (kb / ka), kb / ka});
        else
          out.push_back(Peer{r, 0, 1});
      }
    }
  return out;
}

int64_t DistTrainLayout::frozen_layers() const {
  int64_t n = 0;
  for (const DistTrainSubWorld& s : subworlds) {
    if (!s.forward_only) break;
    n += s.num_layers;
  }
  return n;
}

std::vector<int64_t> DistTrainLayout::stage_layers() const {
  std::vector<int64_t> out;
  for (const DistTrainSubWorld& s : subworlds)
    for (int p = 0; p < s.pp; ++p) out.push_back(s.num_layers / s.pp);
  return out;
}

}  // namespace gale
