// Megatron's total_loss_dict: ordered sums of the loss entries over a log interval.
#include "train/total_loss_dict.h"

#include <algorithm>

#include "model/config.h"

namespace gale {

void TotalLossDict::add(const std::string& key, double value) {
  auto it = std::find_if(sums_.begin(), sums_.end(), [&](const auto& e) { return e.first == key; });
  if (it == sums_.end()) {
    sums_.emplace_back(key, value);
  } else {
    it->second += value;
  }
}

void TotalLossDict::add_loss_dict(const LossDict& losses, bool advanced) {
  if (!advanced) return;
  for (const auto& [key, value] : losses) add(key, value);
}

void TotalLossDict::add_tracked(const LossDict& values) {
  for (const auto& [key, value] : values) add(key, value);
}

LossDict TotalLossDict::averages(int64_t advanced) const {
  const double n = static_cast<double>(std::max<int64_t>(1, advanced));
  LossDict out;
  out.reserve(sums_.size());
  for (const auto& [key, sum] : sums_) out.emplace_back(key, sum / n);
  return out;
}

void TotalLossDict::reset() {
  for (auto& entry : sums_) entry.second = 0.0;
}

std::vector<int> moe_tracked_aux_kinds(const std::string& scalar_type, const std::vector<std::string>& list_types) {
  std::vector<int> kinds;
  for (int kind = 0; kind < kMoeAuxKinds; ++kind) {
    const std::string type = kMoeAuxTypes[kind];
    const bool tracked = list_types.empty() ? scalar_type.find(type) != std::string::npos
                                            : std::find(list_types.begin(), list_types.end(), type) != list_types.end();
    if (tracked) kinds.push_back(kind);
  }
  return kinds;
}

}  // namespace gale
