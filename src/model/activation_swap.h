// --swap-attention: a transformer layer's attention activations kept for backward moved to a file
// after the layer's forward and read back, one layer ahead on a thread, during backward.
//
// MindSpeed's SwapAttentionFeature moves the attention block's saved tensors (--swap-modules:
// input_norm, self_attention, post_attention_norm) from the NPU to host memory after each layer's
// forward and prefetches them back on a copy stream during backward. On a CPU host memory is the
// device's, so, as --swap-optimizer (optim/state_swap.h), Gale's lower tier is an anonymous file
// (core/swap_file.h) in --swap-attention-dir (default $TMPDIR or /tmp; unlinked at once): one per
// micro-batch in flight, appended to in forward. In backward, before layer i's backward, layer i's
// tensors are waited for (read on a thread started before layer i + 1's backward) and layer i − 1's
// read is started, so the reads overlap the compute. The tensors come back byte for byte: training
// is bit-identical.
//
// Swapped (each only where the layer kept it): input_norm → LayerSaved::norm1_out; self_attention →
// attention.qkv, attention.lse and ctx; post_attention_norm → norm2_out; and with --swap-layer-input
// (MindSpeed's SwapLayerInputFeature) the layer's input x_in, through the same file and prefetch.
// --smart-swap (model/smart_swap.h) uses the same class for the layers its policy picks, with all
// of those plus the dense MLP's x_mid, fc1_out and act, each only where it is the sole holder of its
// storage (so that the allocator's bytes move exactly as its sampling predicts).
#pragma once

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/swap_file.h"
#include "model/transformer_layer.h"

namespace gale {

struct SwapAttentionConfig {
  bool enabled = false;  // anything swapped (--swap-attention or --swap-layer-input)
  bool input_norm = true, self_attention = true, post_attention_norm = true;  // --swap-modules
  bool layer_input = false;  // --swap-layer-input: LayerSaved::x_in
  bool mlp = false;  // --smart-swap: also the dense MLP's x_mid, fc1_out and act
  // --smart-swap (model/smart_swap.h): swap only a tensor that is the sole holder of its storage
  // (Tensor::sole_owner), so that swapping it out frees exactly its bytes and reading it back
  // allocates exactly as many; a tensor sharing its storage stays in memory.
  bool sole_owners_only = false;
  std::string dir;  // "" = $TMPDIR or /tmp
};

// --swap-modules' values (each may be a comma-separated list, as MindSpeed's one string), split.
std::vector<std::string> split_swap_modules(const std::vector<std::string>& values);
// The config of a module list; error for a name that is not input_norm, self_attention or
// post_attention_norm.
StatusOr<SwapAttentionConfig> swap_attention_config(const std::vector<std::string>& swap_modules, const std::string& dir);

// The directory a config's files go to.
std::string swap_attention_dir(const SwapAttentionConfig& c);

// One micro-batch's swapped activations.
class ActivationSwap {
 public:
  static StatusOr<std::unique_ptr<ActivationSwap>> create(const SwapAttentionConfig& config);
  ~ActivationSwap();  // waits for a read in flight

  // Writes layer `layer`'s selected tensors of `saved` to the file and releases them (IO errors
  // stop the job, naming the file).
  void swap_out(int64_t layer, LayerSaved& saved);
  // Starts reading layer `layer`'s tensors back on a thread (nothing for a layer not swapped).
  void prefetch(int64_t layer);
  // Puts layer `layer`'s tensors back into `saved` (waiting for its prefetch, or reading now).
  void swap_in(int64_t layer, LayerSaved& saved);
  // The bytes swap_out(layer, saved) would release now (exact allocator bytes when
  // config.sole_owners_only), without touching `saved`.
  static int64_t releasable_bytes(const SwapAttentionConfig& config, const LayerSaved& saved);
  // Bytes written so far.
  int64_t file_bytes() const { return file_->size(); }

 private:
  explicit ActivationSwap(const SwapAttentionConfig& c, std::unique_ptr<SwapFile> f)
      : config_(c), file_(std::move(f)) {}
  struct Entry {
    Tensor LayerSaved::*member = nullptr;  // a direct member, or
    Tensor CoreAttentionSaved::*attention_member = nullptr;  // a member of LayerSaved::attention
    Shape shape;
    DType dtype = DType::kF32;
    int64_t offset = 0, bytes = 0;
  };
  static Tensor& field(LayerSaved& saved, const Entry& e) {
    return e.member ? saved.*(e.member) : saved.attention.*(e.attention_member);
  }
  static const Tensor& field(const LayerSaved& saved, const Entry& e) {
    return e.member ? saved.*(e.member) : saved.attention.*(e.attention_member);
  }
  // The members `config` selects, in swap order (shape, offset and bytes not yet filled).
  static std::vector<Entry> selected(const SwapAttentionConfig& config);
  // Whether `config` swaps tensor `t` (defined, not empty; the sole owner of its storage when asked).
  static bool swaps(const SwapAttentionConfig& config, const Tensor& t);
  // Reads the entries' tensors (any thread).
  std::vector<Tensor> read(const std::vector<Entry>& entries) const;

  SwapAttentionConfig config_;
  std::unique_ptr<SwapFile> file_;
  std::map<int64_t, std::vector<Entry>> layers_;  // swapped out, not yet back
  std::map<int64_t, std::future<std::vector<Tensor>>> reads_;  // prefetches in flight
};

}  // namespace gale
