// One micro-batch as the model consumes it, plus per-batch data the layers share.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/cp_layout.h"

namespace gale {

// B samples of S tokens. Per-token arrays are [B, S] (sample-major, as the data loader builds
// them); the model reorders tokens to its [S, B] activation layout itself.
//
// With context parallelism S is this cp rank's share of each sequence (local positions, in the
// order of parallel/context_split.h), S_global the whole sequence's length, and seq_positions
// the global position of each local position; key_document_ids then holds the document ids of the
// whole sequences, which attention's keys need. Without it S_global = S and both lists are empty.
struct MicroBatch {
  int64_t B = 0, S = 0;
  int64_t S_global = 0;               // 0: the same as S (no context parallelism)
  std::vector<int32_t> tokens;        // [B, S]
  std::vector<int32_t> labels;        // [B, S]
  std::vector<float> loss_mask;       // [B, S]
  std::vector<int32_t> position_ids;  // [B, S]
  std::vector<int32_t> document_ids;  // [B, S], or empty when attention is plain causal
  // The documents are packed sequences (Megatron's packed_seq_params / cu_seqlens; GRPO's
  // --rl-use-sequence-packing): besides attention, the Mamba and Gated DeltaNet scans and
  // convolutions and the MTP rolls restart at each document (model/document_starts.h). Without it
  // (--reset-attention-mask) only attention does, as in Megatron's pretraining.
  bool packed_sequences = false;
  std::vector<int64_t> sample_ids;    // [B]: global index of each sample in the training stream (dropout streams)
  std::vector<int32_t> seq_positions;     // [S]: global position of each local position (empty: 0..S-1)
  std::vector<int32_t> key_document_ids;  // [B, S_global] with context parallelism and document ids, else empty
  // adaptive_cp_algo: the layout this micro-batch was sliced with (parallel/cp_layout.h), else null.
  std::shared_ptr<const CpLayout> cp_layout;

  int64_t global_length() const { return S_global > 0 ? S_global : S; }
  int32_t seq_position(int64_t s) const { return seq_positions.empty() ? static_cast<int32_t>(s) : seq_positions[s]; }
};

// Megatron's loss contract: micro-batch m contributes Σ ℓ·mask / Σ mask, and the differentiated
// objective averages those over the iteration's micro-batches, so backward of a micro-batch with
// `tokens` loss tokens starts from this scale per unit of mask (0 when it has none: Megatron would
// divide by zero; Gale lets such a micro-batch contribute nothing).
inline float micro_batch_loss_scale(double tokens, int64_t num_microbatches) {
  return tokens > 0.0 ? static_cast<float>(1.0 / (tokens * static_cast<double>(num_microbatches))) : 0.0f;
}

// The same with Megatron's --calculate-per-token-loss: the differentiated objective is the summed
// token loss of every micro-batch (scale 1; the trainer divides the gradients by the iteration's
// tokens once, after the data-parallel reduction).
inline float micro_batch_loss_scale(double tokens, int64_t num_microbatches, bool per_token_loss) {
  return per_token_loss ? 1.0f : micro_batch_loss_scale(tokens, num_microbatches);
}

}  // namespace gale
