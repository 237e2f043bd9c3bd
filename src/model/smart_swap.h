// --smart-swap: an activation-swap policy chosen from a sampled training iteration — which layers'
// saved activations go to a file after their forward — applied, unchanged, for the rest of training.
//
// MindSpeed's SmartSwapFeature samples the NPU memory of warm-up steps, searches a swap policy that
// lowers the peak (by 3 GiB by default, or to a target), then applies it as a stable schedule.
// Gale's, on top of --swap-attention's machinery (model/activation_swap.h):
//
//  1. Warm-up: iterations 1 .. W (--smart-swap-warmup-iters, default 2 as MindSpeed's warm-up steps)
//     run without swapping. The last of them is sampled with the allocator's exact accounting
//     (core/allocator.h): the iteration is cut at every layer's forward end and backward start
//     into segments, each with its peak of live bytes, and each (micro-batch, layer) has the bytes
//     swapping it would free (its saved tensors that are the sole holders of their storage: the
//     attention block's, the layer input and the dense MLP's; ActivationSwap::releasable_bytes).
//  2. Policy: swapped out after layer j's forward, those bytes are out of memory from there until
//     the start of layer j + 1's backward (when the one-layer-ahead prefetch reads them back; for
//     the last layer, its own backward): every segment in between is lower by them, the others
//     unchanged. The search is greedy, as MindSpeed's: take the highest segment, swap the layer
//     that lowers it most (ties: the longer window, then the lower layer), until the predicted peak
//     is at most the target (sampled peak − --smart-swap-reduction-mb, or --smart-swap-target-mb) or
//     no unswapped layer lowers the highest segment. Fewest layers swapped for the target, so the
//     least file traffic.
//  3. Stable: every later iteration swaps the chosen layers of every micro-batch. The peak is the
//     predicted one to the byte when the iterations repeat their allocations (same shapes; MoE's
//     token counts vary, so there it is an estimate); training is bit-identical (lossless swap).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/activation_swap.h"
#include "model/transformer_layer.h"

namespace gale {

struct SmartSwapConfig {
  bool enabled = false;
  int64_t warmup_iters = 2;                       // the last one is sampled
  int64_t reduction_bytes = int64_t{3} << 30;    // target = sampled peak − this (MindSpeed's default 3 GiB)
  int64_t target_bytes = 0;                      // > 0: the target itself (MindSpeed's target mode)
  std::string dir;                               // the swap files' directory ("" = $TMPDIR or /tmp)
};

// One sampled iteration.
struct SmartSwapProfile {
  int64_t num_layers = 0;
  // The allocator's peak of live bytes in each segment of the iteration: segment s runs from event
  // s − 1 to event s (segment 0 from the iteration's start, the last one to its end).
  std::vector<int64_t> segment_peaks;
  // A (micro-batch, layer) pair: swapping `layer` lowers segments [first, last] by `bytes`.
  struct Window {
    int64_t layer = 0;
    int64_t bytes = 0;
    int64_t first = 0, last = -1;
  };
  std::vector<Window> windows;
};

struct SmartSwapPolicy {
  std::vector<bool> swap;            // per layer of the model chunk
  int64_t sampled_peak = 0;          // the sampled iteration's peak (live allocator bytes)
  int64_t target = 0;
  int64_t predicted_peak = 0;        // of every later iteration
  int64_t swapped_bytes = 0;         // written to (and read from) the files per iteration
  bool reached = true;               // predicted_peak <= target
  // One line: "--smart-swap: ... swapping layers [..] ...".
  std::string describe() const;
};

// The peak `profile` predicts with the layers `swap` swapped.
int64_t smart_swap_predicted_peak(const SmartSwapProfile& profile, const std::vector<bool>& swap);
// The greedy search of the policy for `target` (the header's step 2).
SmartSwapPolicy plan_smart_swap(const SmartSwapProfile& profile, int64_t target);

// The state machine of one model chunk's training iterations: warm-up, sampling, stable.
class SmartSwap {
 public:
  SmartSwap(const SmartSwapConfig& config, int64_t num_layers);

  // The trainer, around each training iteration (the optimizer step included). end_iteration
  // chooses the policy after the sampled iteration and then returns true.
  void begin_iteration();
  bool end_iteration();
  // The model, after layer `layer`'s training forward of micro-batch `mb` (before anything is
  // released): whether to swap its activations out (swap_config()).
  bool after_forward(int64_t mb, int64_t layer, const LayerSaved& saved);
  // The model, before layer `layer`'s backward of micro-batch `mb` (before it swaps anything in).
  void before_backward(int64_t mb, int64_t layer);

  // The allocator's peak of live bytes since the first iteration with the policy began (0 before):
  // what the run reports beside the prediction. It reads the allocator's window peak, which
  // nothing else uses once the sampling is over.
  int64_t stable_peak() const;

  // The ActivationSwap config of the swapped layers.
  const SwapAttentionConfig& swap_config() const { return swap_; }
  // Null until the policy is chosen.
  const SmartSwapPolicy* policy() const { return planned_ ? &policy_ : nullptr; }
  const SmartSwapProfile& profile() const { return profile_; }
  const SmartSwapConfig& config() const { return config_; }

 private:
  void event();  // closes the current segment (sampling)

  SmartSwapConfig config_;
  SwapAttentionConfig swap_;
  int64_t num_layers_;
  int64_t iteration_ = 0;  // training iterations begun
  bool sampling_ = false;
  bool planned_ = false;
  bool stable_ = false;  // an iteration with the policy has begun
  SmartSwapProfile profile_;
  SmartSwapPolicy policy_;
  // Sampling: the event indices of each (micro-batch, layer)'s forward end and backward start,
  // and the bytes swapping it would free.
  std::map<std::pair<int64_t, int64_t>, int64_t> forward_end_, backward_start_, bytes_;
};

}  // namespace gale
