// The order of forward and backward steps each pipeline rank runs under Megatron's schedules.
//
// Pure functions of (pipeline size, rank, virtual stages, micro-batches): the schedules in
// schedules.h execute these lists, and tests compare them with the order recorded from
// Megatron-Core's own schedules.py (tools/reference/pipeline_order.py).
//
// 1F1B (no interleaving), rank r of P, M micro-batches:
//   warm-up   W = min(P − r − 1, M) forwards F0 … F(W−1)
//   steady    M − W pairs: forward F(W+i), then backward B(i)
//   cool-down the last W backwards
// so rank r holds at most W + 1 ≤ P − r micro-batches' activations at once.
//
// Interleaved 1F1B, V virtual stages (model chunks) per rank: the forward "virtual
// micro-batches" k = 0 … M·V−1 walk Megatron's schedule table — groups of P micro-batches, each
// group run through chunk 0, then chunk 1, …, chunk V−1 (groups of G micro-batches with
// --microbatch-group-size-per-virtual-pipeline-stage G) — and the k-th backward is the k-th
// entry of the same table with the chunk mirrored (V−1−chunk). Warm-up runs
// W = min((P − r − 1)·2 + (V − 1)·P, M·V) forwards (all of them when forward-only), then the
// steady phase alternates forward k+W and backward k, then the remaining backwards.
// Megatron requires M to be a multiple of P (with its default micro-batch group size P).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

// MindSpeed's RiPipe recompute scheduling of the interleaved schedule (recompute_in_*_order below).
enum class RiPipe : uint8_t { kNone, kAdvance, kBubble };

// What a forward step keeps for its backward (MindSpeed's RiPipe schedules, below).
enum class StepKeep : uint8_t {
  kConfigured,  // what the model's --recompute-granularity full plan says
  kAll,         // every activation: no full recompute for this (chunk, micro-batch)
  kInputOnly,   // only the chunk's input: all its layers recompute (one group)
};

struct PipelineStep {
  bool forward = true;     // forward step, else backward (or recompute) step
  int chunk = 0;           // model chunk (virtual stage) on this rank
  int64_t microbatch = 0;  // micro-batch of the iteration
  // Backward steps of DualPipeV with --dualpipev-dw-detach (dualpipev_order):
  //   defer_weight: the backward computes the input gradient (and the small parameters' gradients)
  //                 and queues the linear weight gradients (model/weight_grad_store.h);
  //   weight:       not a backward but a "W" step: it runs the oldest queued weight gradients,
  //                 those of backward (chunk, microbatch).
  bool defer_weight = false;
  bool weight = false;
  // A recompute step (forward = false; the RiPipe orders below): reruns the (chunk, micro-batch)'s
  // recomputed layers from their kept inputs, ahead of its backward, which then reruns nothing.
  bool recompute = false;
  StepKeep keep = StepKeep::kConfigured;  // forward steps
  // A forward step of DualPipeV with --moe-fb-overlap (dualpipev_order's `fb_overlap`): its compute
  // is interleaved with the backward step right after it (an overlapped pair, schedules.h).
  bool overlap_next = false;

  bool operator==(const PipelineStep&) const = default;
  // "F c m" / "B c m", as in tests/data/schedule/megatron_order.json; "I c m" for a backward that
  // defers its weight gradients (input gradient only), "W c m" for a weight step, "R c m" for a
  // recompute step, and a forward that keeps all activations or only its input is "F c m all" /
  // "F c m input"; a forward overlapped with the next backward ends in " +" ("F 0 4 +").
  std::string to_string() const;
};

// Warm-up forwards of the non-interleaved 1F1B schedule on pipeline rank `rank` of `pp`.
int64_t one_f_one_b_warmup(int pp, int rank, int64_t num_microbatches);

// The steps of pipeline rank `rank` under 1F1B (forward-only: all forwards in order).
std::vector<PipelineStep> one_f_one_b_order(int pp, int rank, int64_t num_microbatches, bool forward_only);

// Whether the interleaved schedule can run `num_microbatches` micro-batches over `pp` stages
// (Megatron: a multiple of the pipeline size); the error names the flags that set the count.
// `microbatch_group` is --microbatch-group-size-per-virtual-pipeline-stage G, the micro-batches
// that run through every chunk before the next group starts; 0 means Megatron's default, G = P.
// Megatron's rules: G = P needs M to be a multiple of P; otherwise P <= G <= M, and the last group
// (M mod G) is empty or holds at least P micro-batches.
Status check_interleaved_microbatches(int pp, int64_t num_microbatches, int64_t microbatch_group = 0);

// Warm-up forwards of the interleaved schedule (all M·V of them when forward-only).
// W = min((P − r − 1)·2 + (V − 1)·G, M·V).
int64_t interleaved_warmup(int pp, int rank, int vpp, int64_t num_microbatches, bool forward_only,
                           int64_t microbatch_group = 0);

// The steps of pipeline rank `rank` under interleaved 1F1B with `vpp` chunks per rank.
// Requires check_interleaved_microbatches(pp, num_microbatches, microbatch_group) to pass.
std::vector<PipelineStep> interleaved_order(int pp, int rank, int vpp, int64_t num_microbatches, bool forward_only,
                                            int64_t microbatch_group = 0);

// DualPipeV (DeepSeek's dualpipev.py, MindSpeed's --schedules-method dualpipev): the layers are
// cut into 2·P chunks, rank r holding chunk 0 = virtual stage r and chunk 1 = virtual stage
// 2P−1−r, so activations go down the ranks through the chunk-0 stages and back up through the
// chunk-1 stages (rank 0 runs the embedding and the loss). Each chunk's forwards and backwards
// run in micro-batch order; rank r of P with M ≥ 2P micro-batches, F0/F1/B0/B1 a forward/backward
// of chunk 0/1:
//   1. 2(P−r−1) × F0                   warm-up down the V
//   2. (r+1) × (F0, F1)
//   3. (P−r−1) × (B1, F1)
//   4. (M−2P+r+1) × (F0, B1, F1, B0)    steady: each forward paired with a backward of the other chunk
//   5. (P−r−1) × (B1, F1, B0)
//   6. (r+1) × (B1, B0)
//   7. (P−r−1) × B0                    cool-down
// DualPipeV overlaps the pairs (F with B) on the device; Gale runs a pair's forward, then its
// backward, or with `fb_overlap` (below) both interleaved at each MoE all-to-all. Every rank holds at most 2P + 1 (chunk, micro-batch) activations at once, DualPipeV's
// profile (DeepSeek's "PP + 1" for 2P stages). Forward-only keeps the forwards in the same order.
//
// With `dw_detach` (--dualpipev-dw-detach, DeepSeek's zero-bubble backwards: dualpipev.py's
// enable_zb and WeightGradStore) some backwards become I steps (input gradient only, sent on at
// once; their weight gradients queued) and W steps run the queued weight gradients, oldest first:
//   3. (P−r−1) × (I1, W, F1)       each I1's weight gradient right after it, before the forward
//   6. (r+1) × (B1, B0), the later half as I1 / I0: from pair ⌊(r+1)/2⌋ on, starting with its
//      B0 on even ranks and its B1 on odd ranks (r+1 I steps in all)
//   7. (P−r−1) × (W, I0)           cool-down: each W fills the wait for the next gradient
//   8. (r+1) × W                   the weight gradients left
// Once a chunk's backwards start deferring (phase 6), all its later ones do, so every weight's
// gradient still accumulates in micro-batch order (the same sums, bitwise).
//
// With `fb_overlap` (--moe-fb-overlap, training orders) the forwards of DualPipeV's overlapped
// pairs are marked PipelineStep::overlap_next, as DeepSeek's dualpipev.py overlaps them: in
// phase 4 (F0, B1) and (F1, B0), in phase 5 (F1, B0); on the last rank (r = P−1) the first
// phase-4 pair (F0, B1) stays sequential (its F0 feeds the F1 right after it on the same rank).
// The steps and their order are unchanged; no backward of a pair defers its weight gradients.
Status check_dualpipev_microbatches(int pp, int64_t num_microbatches);
std::vector<PipelineStep> dualpipev_order(int pp, int rank, int64_t num_microbatches, bool forward_only,
                                          bool dw_detach = false, bool fb_overlap = false);

// GPipe's order, for comparison (one chunk per rank): every forward, then every backward, in
// micro-batch order. It holds all M micro-batches at once on every stage.
std::vector<PipelineStep> gpipe_order(int64_t num_microbatches, bool forward_only);

// MindSpeed's RiPipe schedules (--recompute-in-advance / --recompute-in-bubble, interleaved 1F1B
// only): the recompute of a (chunk, micro-batch) becomes a step of its own, "R c m", placed right
// before its backward "B c m". The executor posts a backward's gradient receive a few steps ahead,
// so R runs while that gradient is still on its way from the next stage (a rank waiting for it
// idles: the pipeline bubble), instead of after it arrived as the backward-triggered recompute does.
// Both take a training order (forward_only orders have no backward and are returned unchanged).
//
// --recompute-in-advance (with --recompute-granularity full): every backward of a chunk other than
// `keep_chunk` gets an R step before it; the forwards of `keep_chunk` (the chunk holding the
// model's last layers on the last pipeline rank; -1 elsewhere) keep all their activations
// (StepKeep::kAll): its backwards follow its forwards closely, so recomputing there saves little
// memory and costs time on the critical path.
std::vector<PipelineStep> recompute_in_advance_order(const std::vector<PipelineStep>& steps, int keep_chunk);

// --recompute-in-bubble (without --recompute-granularity): at most `max_held` (chunk, micro-batch)
// activations are held whole at any time (MindSpeed: P·V, the pipeline size times the virtual
// stages). Walking the order, a forward keeps everything (kConfigured) when the whole activations
// held, plus the recomputes still due before its own backward, stay within max_held; otherwise
// it keeps only its input (kInputOnly) and an R step rematerialises it right before its backward.
// So only ranks whose interleaved warm-up holds more than max_held activations (the first ones:
// W + 1 = 2(P−r−1) + (V−1)·P + 1 > P·V) recompute anything, and the held count never exceeds
// max(max_held, what the order held before) (tests/schedule/pipeline_order_test.cc).
std::vector<PipelineStep> recompute_in_bubble_order(const std::vector<PipelineStep>& steps, int64_t max_held);

// interleaved_order of rank `rank` with `ripipe` applied (training orders only): the advance
// order keeps chunk V−1 of the last rank whole, the bubble order holds at most P·V whole.
std::vector<PipelineStep> ripipe_interleaved_order(RiPipe ripipe, int pp, int rank, int vpp, int64_t num_microbatches,
                                                   bool forward_only, int64_t microbatch_group = 0);

// The most (chunk, micro-batch) activations held whole at once while running `steps` (a kInputOnly
// forward holds its chunk input only, until its R step).
int64_t max_whole_activations(const std::vector<PipelineStep>& steps);

}  // namespace gale
