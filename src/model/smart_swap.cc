// --smart-swap's sampling, greedy policy search and per-iteration state.
#include "model/smart_swap.h"

#include <algorithm>

#include "core/allocator.h"
#include "core/check.h"
#include "core/status.h"

namespace gale {

namespace {

// Each segment's value with the layers `swap` swapped.
std::vector<int64_t> segment_values(const SmartSwapProfile& p, const std::vector<bool>& swap) {
  std::vector<int64_t> v = p.segment_peaks;
  for (const SmartSwapProfile::Window& w : p.windows)
    if (swap[static_cast<size_t>(w.layer)])
      for (int64_t s = w.first; s <= w.last; ++s) v[static_cast<size_t>(s)] -= w.bytes;
  return v;
}

std::string layer_list(const std::vector<bool>& swap) {
  std::string out;
  for (size_t j = 0; j < swap.size(); ++j)
    if (swap[j]) out += (out.empty() ? "" : ",") + std::to_string(j + 1);
  return out.empty() ? "none" : out;
}

}  // namespace

std::string SmartSwapPolicy::describe() const {
  return str_cat("--smart-swap: sampled peak ", sampled_peak, " bytes, target ", target, " bytes; swapping layers [",
                 layer_list(swap), "] (", swapped_bytes, " bytes per iteration to the file); predicted peak ",
                 predicted_peak, " bytes", reached ? "" : " (target not reachable by swapping more layers)");
}

int64_t smart_swap_predicted_peak(const SmartSwapProfile& profile, const std::vector<bool>& swap) {
  const std::vector<int64_t> v = segment_values(profile, swap);
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

SmartSwapPolicy plan_smart_swap(const SmartSwapProfile& profile, int64_t target) {
  const size_t L = static_cast<size_t>(profile.num_layers);
  SmartSwapPolicy policy;
  policy.swap.assign(L, false);
  policy.target = target;
  policy.sampled_peak = smart_swap_predicted_peak(profile, policy.swap);
  // Per layer: the segments its windows cover (for the tie-break).
  std::vector<int64_t> covered(L, 0);
  for (const SmartSwapProfile::Window& w : profile.windows)
    if (w.bytes > 0) covered[static_cast<size_t>(w.layer)] += w.last - w.first + 1;
  while (true) {
    const std::vector<int64_t> v = segment_values(profile, policy.swap);
    if (v.empty()) break;
    const size_t top = static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
    policy.predicted_peak = v[top];
    if (v[top] <= target) break;
    // What swapping each unswapped layer takes off the highest segment.
    std::vector<int64_t> gain(L, 0);
    for (const SmartSwapProfile::Window& w : profile.windows)
      if (!policy.swap[static_cast<size_t>(w.layer)] && w.first <= static_cast<int64_t>(top) &&
          static_cast<int64_t>(top) <= w.last)
        gain[static_cast<size_t>(w.layer)] += w.bytes;
    size_t best = L;
    for (size_t j = 0; j < L; ++j) {
      if (gain[j] <= 0) continue;
      if (best == L || gain[j] > gain[best] || (gain[j] == gain[best] && covered[j] > covered[best])) best = j;
    }
    if (best == L) break;  // nothing lowers the highest segment
    policy.swap[best] = true;
  }
  policy.reached = policy.predicted_peak <= target;
  for (const SmartSwapProfile::Window& w : profile.windows)
    if (policy.swap[static_cast<size_t>(w.layer)]) policy.swapped_bytes += w.bytes;
  return policy;
}

SmartSwap::SmartSwap(const SmartSwapConfig& config, int64_t num_layers) : config_(config), num_layers_(num_layers) {
  GALE_CHECK_GE(config.warmup_iters, 1);
  swap_.enabled = true;
  swap_.input_norm = swap_.self_attention = swap_.post_attention_norm = true;
  swap_.layer_input = true;
  swap_.mlp = true;
  swap_.sole_owners_only = true;
  swap_.dir = config.dir;
  profile_.num_layers = num_layers;
}

void SmartSwap::begin_iteration() {
  ++iteration_;
  sampling_ = !planned_ && iteration_ == config_.warmup_iters;
  if (planned_ && !stable_) {
    stable_ = true;
    host_allocator().reset_window_peak();
  }
  if (!sampling_) return;
  profile_.segment_peaks.clear();
  profile_.windows.clear();
  forward_end_.clear();
  backward_start_.clear();
  bytes_.clear();
  host_allocator().reset_window_peak();
}

void SmartSwap::event() {
  Allocator& a = host_allocator();
  profile_.segment_peaks.push_back(a.window_peak_bytes());
  a.reset_window_peak();
}

int64_t SmartSwap::stable_peak() const { return stable_ ? host_allocator().window_peak_bytes() : 0; }

bool SmartSwap::after_forward(int64_t mb, int64_t layer, const LayerSaved& saved) {
  if (sampling_) {
    event();  // the segment that ends here still holds the layer's activations
    const std::pair<int64_t, int64_t> key{mb, layer};
    forward_end_[key] = static_cast<int64_t>(profile_.segment_peaks.size()) - 1;
    bytes_[key] = ActivationSwap::releasable_bytes(swap_, saved);
  }
  return planned_ && policy_.swap[static_cast<size_t>(layer)];
}

void SmartSwap::before_backward(int64_t mb, int64_t layer) {
  if (!sampling_) return;
  event();  // the swapped-in (prefetched) activations come back in the segment that starts here
  backward_start_[{mb, layer}] = static_cast<int64_t>(profile_.segment_peaks.size()) - 1;
}

bool SmartSwap::end_iteration() {
  if (!sampling_) return false;
  event();  // the last segment: to the end of the iteration (optimizer step included)
  sampling_ = false;
  for (const auto& [key, f] : forward_end_) {
    const auto [mb, layer] = key;
    // Read back at the start of the next layer's backward (the prefetch), the last layer's at its own.
    const int64_t back_layer = layer + 1 < num_layers_ ? layer + 1 : layer;
    auto b = backward_start_.find({mb, back_layer});
    GALE_CHECK(b != backward_start_.end())
        << "--smart-swap: micro-batch " << mb << " layer " << back_layer << " had no backward in the sampled iteration";
    SmartSwapProfile::Window w;
    w.layer = layer;
    w.bytes = bytes_.at(key);
    w.first = f + 1;  // event e ends segment e
    w.last = b->second;
    profile_.windows.push_back(w);
  }
  const int64_t sampled = smart_swap_predicted_peak(profile_, std::vector<bool>(static_cast<size_t>(num_layers_), false));
  const int64_t target =
      config_.target_bytes > 0 ? config_.target_bytes : std::max<int64_t>(0, sampled - config_.reduction_bytes);
  policy_ = plan_smart_swap(profile_, target);
  planned_ = true;
  return true;
}

}  // namespace gale
