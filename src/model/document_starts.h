// Where each row's document starts, for the scans and rolls that restart at packed sequences' boundaries.
//
// Megatron runs packed sequences (packed_seq_params, cu_seqlens) through the Mamba mixer and Gated
// DeltaNet with the scans' state and the causal convolution's window reset at each sequence's first
// token (mamba_ssm's seq_idx, FLA's cu_seqlens), and rolls MTP's ids and labels within each sequence
// (multi_token_prediction.py's _roll_tensor_packed_seq). Gale marks such micro-batches
// (MicroBatch::packed_sequences) and gives the kernels, for every activation row t = s·B + b, the
// position of its document's first token in sample b: row t's convolution reads no input before it
// and its scan starts from the zero state there (a reset at s > 0 when the start is s).
#pragma once

#include <cstdint>
#include <vector>

#include "model/micro_batch.h"

namespace gale {

// [S·B] of document ids [B, S] (sample-major): row s·B + b's document's first position. A new
// document starts where the id differs from the position before.
std::vector<int32_t> document_starts(const int32_t* document_ids, int64_t B, int64_t S);

// The starts of the whole sequences the recurrent layers scan: empty unless mb.packed_sequences
// (then of mb's document ids, or under context parallelism of the whole sequences' key_document_ids,
// S_global positions, the scans' row order after the cp all-to-all).
std::vector<int32_t> scan_document_starts(const MicroBatch& mb);

// True when row t = s·B + b, s > 0, begins a document (the scan resets before it).
inline bool starts_document(const int32_t* starts, int64_t t, int64_t s) {
  return starts != nullptr && s > 0 && starts[t] == s;
}

}  // namespace gale
