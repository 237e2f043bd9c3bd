// MindSpeed's expert placement (--enable-expert-placement): per-layer load prediction and the greedy
// assignment of experts to expert-parallel ranks; the layer's routing follows the assignment.
//
// A MoE layer with E experts over P expert-parallel ranks has El = E/P slots per rank; physical
// expert p = r·El + j is slot j of rank r. The placement maps each global expert e (the router's
// index, the checkpoint's name) to its physical expert. Identity (the layout without placement):
// rank r holds experts r·El ... r·El + El − 1. Routing, the aux losses, the router's weight and
// the expert bias stay in global indices; moe_forward relabels the chosen experts to physical ones
// before the permutation, so each expert's rows, GEMMs and gradient sums are those of the run
// without placement (see model/moe_layer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace gale {

// The placement and load counters of one MoE layer (shared by the layer's MoeParamIds copies).
struct MoePlacement {
  std::vector<int32_t> physical;  // [E] global expert -> physical expert (a permutation)
  std::vector<int64_t> counts;    // [E] this rank's kept (token, expert) pairs per global expert since the last read
  std::vector<double> predicted;  // [E] the EMA load prediction (the EP group's tokens per expert and step)

  explicit MoePlacement(int64_t num_experts);
  // global expert of each physical expert (the inverse permutation)
  std::vector<int32_t> global_of_physical() const;
  bool identity() const;
};

// MindSpeed's EMA weight: predicted = 0.9·predicted + 0.1·load of the step.
inline constexpr double kExpertLoadEmaWeight = 0.9;

// MindSpeed's greedy placement (ExpertDynamicplacement.expert_placement_greedy): experts by
// decreasing load (ties: lower index first), each to the rank with the fewest tokens so far among
// those with fewer than El experts (ties: lower rank). Within a rank the experts take the slots in
// increasing global index. Returns [E] global expert -> physical expert.
std::vector<int32_t> greedy_expert_placement(const std::vector<double>& loads, int64_t ep_size);

// The per-rank loads [P] of `loads` [E] under `physical`.
std::vector<double> rank_loads(const std::vector<double>& loads, const std::vector<int32_t>& physical, int64_t ep_size);

// Coefficient of variation (population std / mean) of `v`; 0 for a zero mean.
double coefficient_of_variation(const std::vector<double>& v);

}  // namespace gale
