// Megatron's total_loss_dict: ordered sums of the loss entries over a log interval.
#include "train/total_loss_dict.h"

#include <algorithm>

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

}  // namespace gale
