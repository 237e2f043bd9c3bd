// The X- and Y-axis sub-groups of the tensor-parallel group under --tp-2d.
#include "parallel/tp2d_groups.h"

#include <cstdio>
#include <sstream>

#include "core/check.h"

namespace gale {

std::vector<int64_t> tp2d_x_members(int64_t tp_size, int64_t tp_x, int64_t tp_rank) {
  GALE_CHECK(tp_x >= 1 && tp_size % tp_x == 0 && tp_rank >= 0 && tp_rank < tp_size)
      << "tp-2d: X " << tp_x << " of TP " << tp_size << ", rank " << tp_rank;
  std::vector<int64_t> m;
  const int64_t y = tp_rank / tp_x;
  for (int64_t x = 0; x < tp_x; ++x) m.push_back(y * tp_x + x);
  return m;
}

std::vector<int64_t> tp2d_y_members(int64_t tp_size, int64_t tp_x, int64_t tp_rank) {
  GALE_CHECK(tp_x >= 1 && tp_size % tp_x == 0 && tp_rank >= 0 && tp_rank < tp_size)
      << "tp-2d: X " << tp_x << " of TP " << tp_size << ", rank " << tp_rank;
  std::vector<int64_t> m;
  const int64_t x = tp_rank % tp_x;
  for (int64_t y = 0; y < tp_size / tp_x; ++y) m.push_back(y * tp_x + x);
  return m;
}

std::string render_tp2d_groups(const RankLayout& layout, int64_t tp_x) {
  const int64_t tp = layout.sizes.tp;
  std::ostringstream os;
  os << "tp-2d: TP " << tp << " = X " << tp_x << " x Y " << tp / tp_x << ", tp rank = x + " << tp_x << "*y\n";
  for (const bool x_axis : {true, false}) {
    char head[32];
    std::snprintf(head, sizeof head, "  %-19s", x_axis ? "tp-x" : "tp-y");
    os << head;
    for (const std::vector<int>& group : layout.of(Group::kTensor))
      for (int64_t r = 0; r < tp; ++r) {
        const std::vector<int64_t> m = x_axis ? tp2d_x_members(tp, tp_x, r) : tp2d_y_members(tp, tp_x, r);
        if (m.front() != r) continue;  // each group once, from its first member
        os << " [";
        for (size_t i = 0; i < m.size(); ++i) os << (i ? "," : "") << group[static_cast<size_t>(m[i])];
        os << "]";
      }
    os << "\n";
  }
  return os.str();
}

Tp2dGroups make_tp2d_groups(const Comm& tp, int64_t tp_x) {
  GALE_CHECK(tp != nullptr) << "tp-2d needs a tensor-parallel group";
  const std::vector<int>& world = tp->world_ranks();
  auto to_world = [&](const std::vector<int64_t>& tp_ranks) {
    std::vector<int> w;
    for (int64_t r : tp_ranks) w.push_back(world[static_cast<size_t>(r)]);
    return w;
  };
  Tp2dGroups g;
  g.x = tp->make_group(to_world(tp2d_x_members(tp->size(), tp_x, tp->rank())), "tp-x");
  g.y = tp->make_group(to_world(tp2d_y_members(tp->size(), tp_x, tp->rank())), "tp-y");
  return g;
}

}  // namespace gale
