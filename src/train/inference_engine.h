// Batched generation for `gale generate --prompts-file`: Megatron's static batching
// (--inference-max-requests prompts decoded together until all finish) and dynamic batching
// (--inference-dynamic-batching: continuous batching over a paged KV buffer, Megatron-Core's
// DynamicInferenceContext and DynamicInferenceEngine).
//
// Both run GPTModel::forward_logits_ragged: each step is ONE forward over the mixed batch of the
// requests' new tokens — whole prompts of the requests that join (prefill) and one token of each
// request already decoding — with every linear layer over all rows together and attention per
// request against its own KV blocks (model/kv_cache.h). A request's tokens are those of generating
// it alone (greedy: the same argmax; sampling: the same draws, as every request samples step k with
// the draws of step k of a one-prompt run under the same --seed).
//
// Static: the requests in order, batches of max_requests; a batch's KV is one block of
// kv_length = --inference-max-seq-length positions (capped at --max-position-embeddings) per
// request, allocated for the batch; finished requests leave the forward, and the next batch starts
// when the whole batch has finished (Megatron's static engine; unlike Megatron, which starts every
// prompt at the shortest prompt's length, each prompt is prefilled whole in the first step).
//
// Dynamic: a KvBlockPool of DynamicBudget::num_blocks blocks of block_tokens positions. Before each
// step, as DynamicInferenceContext.update_requests and add_request do:
//   1. a decoding request whose blocks are full pauses; paused requests resume (oldest first, one
//      new block each) — all that fit when more than paused + gtd_block_count blocks are free,
//      otherwise only enough to bring the active requests up to gtd_request_count;
//   2. waiting requests join in order while the requests stay within max_requests, the step's
//      tokens within max_tokens, and the free blocks cover the prompt's blocks plus the guaranteed
//      reserve gtd_block_count (the first that does not fit waits, and those behind it);
// then the step's forward runs, each request samples its next token, and a request that finished
// (a stop token, max_new_tokens, or the last position) gives its blocks back at once.
//
// Speculative decoding (--num-speculative-tokens N, Megatron main's MTP speculative decoding, for
// a model built with its --mtp-num-layers D ≥ N MTP layers): after a request's step has sampled
// its next token t at position c (row ρ the last accepted row, h its decoder final-norm output), MTP
// layer k = 0..N−1 drafts d_{k+1} from h_k (h_0 = h) and the token at position c + k (t, then
// d_k), each request a sequence of ONE position (Megatron's forward_single_position: no KV cache
// for the MTP layers), sampled as the main model's token of that step would be. The next step
// feeds t, d_1..d_N (N + 1 rows at positions c..c + N); row j's sample o_j is emitted, and d_{j+1}
// is accepted while it equals o_j (Megatron's rule, for greedy and sampling alike): with a
// accepted, o_0..o_a are emitted (a + 1 tokens) and positions c + a + 1.. of the rejected drafts
// roll back (the request's cached length drops; under dynamic batching the blocks holding only
// them go back to the pool). Every emitted token is the main model's sample of its step (same
// logits, same draws), so the tokens are those of N = 0. A request drafts fewer tokens near its
// --max-new-tokens or the last position. Drafts per step need room in the request's blocks: a
// decoding request pauses when its blocks cannot hold its N + 1 rows (N < the block size).
// A model with recurrent layers (a GDN model's GDN layers; a hybrid model's Mamba layers) rolls
// their states back too, as Megatron main does: the verification forward keeps each request's
// states after each of its N + 1 rows (model/mamba_state.h, slots with N + 1 step buffers), and
// the state after the last accepted row becomes the request's state.
//
// A hybrid Mamba model (--is-hybrid-model): the blocks hold only its attention layers' keys and
// values; each request also holds a Mamba state slot (model/mamba_state.h) from when it joins
// (zero: its prefill starts the sequence) until it finishes — kept while it is paused — and the
// ragged forward continues each request's Mamba layers from its slot (Megatron's per-request
// Mamba states of the dynamic context). A Gated DeltaNet model's GDN layers do the same
// (mamba_state_bytes then counts their states).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/status.h"
#include "model/gpt_model.h"

namespace gale {

// Megatron's DynamicInferenceContext sizing from the buffer flags, with Gale's block bytes.
struct DynamicBudget {
  int64_t block_tokens = 0;
  int64_t block_bytes = 0;           // KV bytes of one block over all layers
  int64_t num_blocks = 0;            // the buffer (rounded down to whole blocks)
  int64_t max_requests = 0;          // requests in the context at once (active and paused)
  int64_t max_tokens = 0;            // tokens in one step's forward
  int64_t max_blocks_per_request = 0;  // ceil(max_seq_length / block_tokens)
  int64_t gtd_request_count = 0;     // requests the reserve guarantees
  int64_t gtd_block_count = 0;       // the reserve: gtd_request_count · max_blocks_per_request
};

struct DynamicBufferFlags {
  double buffer_size_gb = 40.0;               // --inference-dynamic-batching-buffer-size-gb
  double guaranteed_fraction = 0.2;           // --inference-dynamic-batching-buffer-guaranteed-fraction
  std::optional<double> overflow_factor;      // --inference-dynamic-batching-buffer-overflow-factor
  std::optional<int64_t> max_requests_override;  // --inference-dynamic-batching-max-requests-override
  std::optional<int64_t> max_tokens_override;    // --inference-dynamic-batching-max-tokens-override
};

// As Megatron computes it: bytes rounded down to whole blocks; tokens = blocks · block_tokens,
// max_requests = int(tokens / max_seq_length), max_tokens = tokens; with the overflow factor f
// max_requests = round64(int(max_requests·f)), max_tokens = round64(int(max_tokens·f / 50)); the
// overrides replace them (rounded up to a multiple of 64); max_requests = min(max_requests,
// max_tokens); gtd_request_count = round64(min(max(1, requests of fraction·bytes), max_requests)).
// Errors (naming the flag): a buffer smaller than one block, no request of max_seq_length fits, the
// guaranteed requests exceed max_requests (Megatron's assertion), or the reserve is the whole buffer.
StatusOr<DynamicBudget> dynamic_budget(const DynamicBufferFlags& flags, int64_t block_tokens, int64_t block_bytes,
                                       int64_t max_seq_length);

struct EngineOptions {
  bool dynamic = false;
  int64_t max_requests = 8;      // static: --inference-max-requests
  int64_t kv_length = 0;         // static: KV positions per request
  DynamicBudget budget;          // dynamic
  int64_t max_new_tokens = 0;
  int64_t max_length = 0;        // the last position + 1 (--max-position-embeddings)
  std::vector<int32_t> stop_tokens;
  int64_t flash_decode_chunk = 0;  // --flash-decode (0: off)
  // --num-speculative-tokens N (Megatron's; 0: off): see "Speculative decoding" above.
  int64_t num_speculative_tokens = 0;
  // The next token of request `request` at its decode step `step` from its logits row.
  std::function<int32_t(const float* logits, int64_t request, int64_t step)> sample;
};

struct EngineResult {
  std::vector<std::vector<int32_t>> generated;  // per request, in input order
  int64_t steps = 0;              // forwards run
  int64_t kv_bytes_allocated = 0; // static: the largest batch's KV; dynamic: the buffer
  int64_t peak_kv_bytes = 0;      // the most KV bytes held by requests at once
  int64_t peak_requests = 0;      // the most requests in one forward
  int64_t pauses = 0;             // dynamic: times a request paused for a block
  int64_t joined_mid_flight = 0;  // dynamic: requests that joined while others were decoding
  int64_t free_blocks_at_end = 0, num_blocks = 0;  // dynamic: every block is back at the end
  // A hybrid model's Mamba states (model/mamba_state.h; 0 without Mamba layers): the bytes of the
  // slots allocated (static: the largest batch's; dynamic: min(max_requests, requests) slots; with
  // --num-speculative-tokens N each slot's N + 1 step buffers included), and
  // under dynamic batching the slots and those free at the end (all of them).
  int64_t mamba_state_bytes = 0;
  int64_t mamba_slots = 0, free_mamba_slots_at_end = 0;
  // --num-speculative-tokens: the drafts fed to verification forwards and those accepted, in all
  // and per request (input order); dynamic: the blocks rolled back (held only rejected drafts).
  int64_t drafted = 0, accepted_drafts = 0, rewound_blocks = 0;
  std::vector<int64_t> drafted_per_request, accepted_per_request;
};

// Megatron's checks of --num-speculative-tokens N > 0 (errors name the flag): N ≤ the model's MTP
// layers (none: an error), N < the block size under dynamic batching.
Status check_speculative_decoding(const GPTModel& model, const EngineOptions& options);

// Speculative decoding's KV rollback (Megatron's rewind_kv_cache): a request whose positions
// [0, kept) are the accepted ones keeps the blocks they need (at least one) and gives the blocks
// after them, which held only rejected drafts, back to `pool`. Returns the blocks released.
int64_t rewind_kv_blocks(KvBlockPool& pool, std::vector<int32_t>& blocks, int64_t kept);

// Generates for every prompt (each non-empty and shorter than max_length) with `model` (the whole
// model on one process; multi-latent and DeepSeek sparse attention too).
StatusOr<EngineResult> run_inference_engine(GPTModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                            const EngineOptions& options);

}  // namespace gale
