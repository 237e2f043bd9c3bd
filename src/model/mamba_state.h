// Incremental decoding state of a hybrid model's Mamba layers (Megatron's MambaMixer inference state).
//
// Per Mamba layer of the model chunk and per slot (one decoding sequence), as Megatron's MambaMixer
// keeps for inference (mamba_ssm's causal_conv1d_update / selective_state_update):
//   conv [K−1, CD]     the last K−1 inputs of the causal convolution (xBC before the convolution),
//                      oldest first: row j is the input at position length − (K−1) + j (zeros
//                      before position 0), CD = conv_dim = DI + 2·G·N;
//   ssm  [NH, P, N]    the selective scan's state after the last position (state_s of
//                      model/mamba_mixer.h).
// A fresh slot is zero (the state before position 0). Prefill runs the prompt's positions in one
// pass from the slot's state and leaves the state after its last position; a decode step is the
// same for one position, the single-token recurrence (model/mamba_mixer.h mamba_mixer_forward_sequences).
// The slots are allocated once (zeroed); allocate/release hand them to requests (ragged decoding,
// train/inference_engine.h), and copy() moves one slot's state to another (beam reordering).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace gale {

class MambaStatePool {
 public:
  MambaStatePool() = default;  // no Mamba layers, no slots
  // `slots` slots for every Mamba layer of `part` (none: an empty pool when the chunk has no Mamba layer).
  MambaStatePool(const ModelConfig& config, const ModelPartition& part, int64_t slots);

  // Whether the chunk has Mamba layers (otherwise nothing is stored).
  bool has_layers() const { return !conv_.empty(); }
  int64_t slots() const { return slots_; }
  int64_t free_slots() const { return static_cast<int64_t>(free_.size()); }
  // Bytes of one slot over all Mamba layers (the pool holds slots() of them).
  int64_t slot_bytes() const { return slot_bytes_; }
  // The state of local layer `layer` (a Mamba layer) in `slot`.
  float* conv(int64_t layer, int64_t slot);
  float* ssm(int64_t layer, int64_t slot);
  // Takes a free slot, zeroed (GALE_CHECKs that there is one); gives one back (a double release is a
  // GALE_CHECK failure).
  int64_t allocate();
  void release(int64_t slot);
  // Slot `to` gets slot `from`'s state (every layer).
  void copy(int64_t from, int64_t to);
  // A pool with the same states in storage of its own.
  MambaStatePool clone() const;

 private:
  int64_t index(int64_t layer) const;
  int64_t slots_ = 0, conv_numel_ = 0, ssm_numel_ = 0, slot_bytes_ = 0;
  std::vector<int64_t> index_;  // local layer -> its storage (-1: not a Mamba layer)
  std::vector<Tensor> conv_;    // per Mamba layer: [slots, K−1, CD]
  std::vector<Tensor> ssm_;     // per Mamba layer: [slots, NH, P, N]
  std::vector<int64_t> free_;   // free slots (a stack)
  std::vector<char> taken_;
};

}  // namespace gale
