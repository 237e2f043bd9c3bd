// Expert placement: the greedy assignment of experts to expert-parallel ranks and load statistics.
#include "model/expert_placement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"

namespace gale {

MoePlacement::MoePlacement(int64_t num_experts)
    : physical(static_cast<size_t>(num_experts)), counts(static_cast<size_t>(num_experts), 0),
      predicted(static_cast<size_t>(num_experts), 0.0) {
  std::iota(physical.begin(), physical.end(), 0);
}

std::vector<int32_t> MoePlacement::global_of_physical() const {
  std::vector<int32_t> g(physical.size());
  for (size_t e = 0; e < physical.size(); ++e) g[static_cast<size_t>(physical[e])] = static_cast<int32_t>(e);
  return g;
}

bool MoePlacement::identity() const {
  for (size_t e = 0; e < physical.size(); ++e)
    if (physical[e] != static_cast<int32_t>(e)) return false;
  return true;
}

std::vector<int32_t> greedy_expert_placement(const std::vector<double>& loads, int64_t ep_size) {
  const int64_t E = static_cast<int64_t>(loads.size());
  GALE_CHECK(ep_size >= 1 && E % ep_size == 0) << E << " experts over " << ep_size << " ranks";
  const int64_t El = E / ep_size;
  std::vector<int64_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return loads[a] > loads[b]; });
  std::vector<double> tokens(static_cast<size_t>(ep_size), 0.0);
  std::vector<int64_t> held(static_cast<size_t>(ep_size), 0);
  std::vector<int64_t> rank_of(static_cast<size_t>(E), -1);
  for (int64_t e : order) {
    int64_t best = -1;
    double least = std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < ep_size; ++r)
      if (held[r] < El && tokens[r] < least) {
        least = tokens[r];
        best = r;
      }
    GALE_CHECK(best >= 0) << "no rank with a free slot";
    rank_of[e] = best;
    tokens[best] += loads[e];
    ++held[best];
  }
  std::vector<int32_t> physical(static_cast<size_t>(E));
  std::vector<int64_t> next_slot(static_cast<size_t>(ep_size), 0);
  for (int64_t e = 0; e < E; ++e) {  // increasing global index within a rank
    const int64_t r = rank_of[e];
    physical[e] = static_cast<int32_t>(r * El + next_slot[r]++);
  }
  return physical;
}

std::vector<double> rank_loads(const std::vector<double>& loads, const std::vector<int32_t>& physical, int64_t ep_size) {
  const int64_t El = static_cast<int64_t>(loads.size()) / ep_size;
  std::vector<double> r(static_cast<size_t>(ep_size), 0.0);
  for (size_t e = 0; e < loads.size(); ++e) r[static_cast<size_t>(physical[e] / El)] += loads[e];
  return r;
}

double coefficient_of_variation(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  if (mean == 0.0) return 0.0;
  double var = 0.0;
  for (double x : v) var += (x - mean) * (x - mean);
  return std::sqrt(var / static_cast<double>(v.size())) / mean;
}

}  // namespace gale
