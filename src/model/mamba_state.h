// Incremental decoding state of a model's recurrent layers: a hybrid model's Mamba layers
// (Megatron's MambaMixer inference state) and a Gated DeltaNet model's GDN layers (Megatron's
// GatedDeltaNet ssm_prefill / ssm_decode state).
//
// Per recurrent layer of the model chunk and per slot (one decoding sequence):
//   conv [K−1, CD]     the last K−1 inputs of the causal convolution (before the convolution),
//                      oldest first: row j is the input at position length − (K−1) + j (zeros
//                      before position 0; model/causal_conv1d.h ConvSequence). Mamba: xBC,
//                      CD = DI + 2·G·N; GDN: q | k | v, CD = 2·NK·DK + NV·DV (Megatron keeps it
//                      transposed [CD, K], the last column the current input);
//   ssm                the recurrence's state after the last position: Mamba's selective scan
//                      [NH, P, N] (state_s of model/mamba_mixer.h), GDN's delta rule [NV, DK, DV]
//                      (S_s of model/gated_delta_net.h).
// A fresh slot is zero (the state before position 0). Prefill runs the prompt's positions in one
// pass from the slot's state and leaves the state after its last position; a decode step is the
// same for one position, the single-token recurrence (model/mamba_mixer.h mamba_mixer_forward_sequences,
// model/gated_delta_net.h gdn_forward_sequences).
// The slots are allocated once (zeroed); allocate/release hand them to requests (ragged decoding,
// train/inference_engine.h), and copy() moves one slot's state to another (beam reordering).
//
// Speculative decoding (--num-speculative-tokens N) verifies a token and N drafts in one forward,
// but keeps only the rows up to the first rejected draft. Recurrent states cannot be rolled back,
// so, as Megatron main's dynamic context does (its intermediate conv and SSM states), a pool made
// with `steps` = N + 1 also holds per slot and layer the states after each of up to `steps` rows of
// a forward (RaggedRequest::keep_steps); keep_step(slot, j) makes the state after row j the slot's
// state, the one a one-row-at-a-time decode of rows 0..j leaves (the same arithmetic, so bit-exact).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace gale {

class MambaStatePool {
 public:
  MambaStatePool() = default;  // no recurrent layers, no slots
  // `slots` slots for every Mamba or GDN layer of `part` (none: an empty pool when the chunk has no such layer).
  MambaStatePool(const ModelConfig& config, const ModelPartition& part, int64_t slots, int64_t steps = 0);

  // Whether the chunk has recurrent layers (otherwise nothing is stored).
  bool has_layers() const { return !conv_.empty(); }
  int64_t slots() const { return slots_; }
  int64_t free_slots() const { return static_cast<int64_t>(free_.size()); }
  // Bytes of one slot over all recurrent layers, its step buffers included (the pool holds slots() of them).
  int64_t slot_bytes() const { return slot_bytes_; }
  // The rows whose states a forward can keep per slot (0: none).
  int64_t steps() const { return steps_; }
  // The state of local layer `layer` (a Mamba or GDN layer) in `slot`.
  float* conv(int64_t layer, int64_t slot);
  float* ssm(int64_t layer, int64_t slot);
  // The state after row j (< steps()) of the last forward that kept its steps: conv_step's rows j,
  // j + 1, .. follow contiguously (stride: one conv state), as do ssm_step's.
  float* conv_step(int64_t layer, int64_t slot, int64_t j);
  float* ssm_step(int64_t layer, int64_t slot, int64_t j);
  // Slot `slot`'s state (every layer) ← its state after row j (speculative decoding's rollback).
  void keep_step(int64_t slot, int64_t j);
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
  int64_t slots_ = 0, slot_bytes_ = 0, steps_ = 0;
  std::vector<int64_t> index_;  // local layer -> its storage (-1: not a recurrent layer)
  std::vector<Tensor> conv_;    // per recurrent layer: [slots, K−1, CD]
  std::vector<Tensor> ssm_;     // per recurrent layer: [slots, NH, P, N] or [slots, NV, DK, DV]
  std::vector<Tensor> conv_steps_, ssm_steps_;  // per recurrent layer: [slots, steps · one state] (steps > 0)
  std::vector<int64_t> free_;   // free slots (a stack)
  std::vector<char> taken_;
};

}  // namespace gale
