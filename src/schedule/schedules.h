// Forward/backward over the micro-batches of one iteration: no pipelining, 1F1B and interleaved
// 1F1B (Megatron-Core's schedules.py), with forward-only variants for evaluation.
//
// Megatron's loss contract: micro-batch m contributes loss_m = Σ ℓ·mask / Σ mask, and the
// differentiated objective is Σ_m loss_m / num_microbatches; so backward of micro-batch m starts
// from loss_scale = 1 / (Σ mask_m · num_microbatches) on the last pipeline stage (with context
// parallelism the model's Σ mask_m and Σ ℓ·mask already cover the whole sequences). The reported loss
// sums Σ ℓ·mask and Σ mask over all micro-batches (the caller divides); with pipelining only the
// last stage has them (other stages return zeros).
//
// Pipeline schedules run the step order of pipeline_order.h and move activations [Tl, H]
// (Tl = S·B, divided by TP with sequence parallelism) and their gradients between stages with the
// tagged non-blocking transfers of pipeline_p2p.h over ps.pp(). Every rank calls the
// MicroBatchSource once for each micro-batch of the iteration, before the first step (every
// stage needs the position and document ids; the first the tokens, the last the labels and loss
// mask), so the source must be cheap and deterministic; the stages then agree (one all-reduce of
// a flag over ps.pp()) that all of them loaded their micro-batches, so a load error stops every
// stage instead of leaving its neighbours waiting. A micro-batch is dropped after its last
// forward on the rank.
//
// `timers` (may be null; evaluation passes none, as Megatron's) times Megatron's level-2 schedule
// timers: batch-generator (each MicroBatchSource call), forward-compute (a chunk's forward with the
// loss; without pipelining it includes the batch generator, as Megatron's forward step reads its
// batch), backward-compute, and with pipelining forward-recv / backward-recv (waiting for a posted
// receive) and forward-send / backward-send (posting a send).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "core/timers.h"
#include "model/gpt_model.h"
#include "parallel/parallel_state.h"
#include "schedule/pipeline_order.h"
#include "schedule/pipeline_p2p.h"
#include "schedule/stage_tensors.h"

namespace gale {

// Fills `mb` with micro-batch m of the current iteration.
using MicroBatchSource = std::function<Status(int64_t m, MicroBatch* mb)>;

struct ForwardBackwardResult {
  double loss_sum = 0.0;  // Σ ℓ·mask over this rank's micro-batches (last pipeline stage)
  double tokens = 0.0;    // Σ mask
  // Each micro-batch's Σ ℓ·mask, by micro-batch (the stage holding the loss; empty elsewhere and
  // when forward-only): what --rerun-mode / --check-for-spiky-loss validate, as Megatron's loss_func.
  std::vector<double> micro_batch_loss_sums;
  // --dualpipev-dw-detach: the most bytes the queued weight gradients' dy and x held at once
  // (WeightGradStore::held_bytes; 0 without deferred steps).
  int64_t deferred_weight_grad_peak_bytes = 0;
};

// Called after each step a pipeline schedule runs (tests record the order and the memory held).
using ScheduleObserver = std::function<void(const PipelineStep& step)>;

// A micro-batch loss other than Megatron's token mean, computed on the chunk holding the LM head
// from the model's loss sums, per-sequence sums included (--stage dpo's pair loss, train/dpo.h).
// Given one, a schedule runs its chunks without the eager fused LM-head backward
// (GPTModel::set_num_microbatches(0)), calls it after every forward of that chunk (forward-only
// too) with the micro-batch's index and sums, and starts that micro-batch's backward from the loss
// scale it returns (it may first have scaled the model's loss mask, GPTModel::scale_loss_mask).
// The result's loss sums stay the model's cross-entropy sums. Empty (the default): Megatron's loss.
using MicroBatchLoss = std::function<float(GPTModel& model, int64_t m, const GPTModel::LossSums& sums)>;

// No pipeline: forward then backward of each micro-batch in turn (forward only when
// `forward_only`, e.g. evaluation).
StatusOr<ForwardBackwardResult> forward_backward_no_pipelining(GPTModel& model, int64_t num_microbatches,
                                                               const MicroBatchSource& source, bool forward_only,
                                                               Timers* timers = nullptr,
                                                               const MicroBatchLoss& loss = {});

// Megatron's 1F1B over ps.pp() (PP > 1, one chunk per rank): warm-up forwards, steady
// one-forward-one-backward, cool-down backwards (pipeline_order.h); rank r holds the saved
// activations of at most P − r micro-batches. Forward-only runs the forwards in order.
// `pp_backward` (MindSpeed's --optimize-send-recv-comm; null: off): a second communicator over the
// ranks of ps.pp() that carries the gradients, so each direction has a communicator of its own
// (PipelineP2P's direction groups); the steps and what they compute are unchanged.
// `stage_tensors` (MindSpeed's --use-multiparameter-pipeline-model-parallel; null: off): the
// stages exchange its list of typed tensors instead of the hidden states alone (stage_tensors.h),
// after agreeing on every transfer's list (PipelineP2P::agree_on_tensors); the same results.
StatusOr<ForwardBackwardResult> forward_backward_pipelining_without_interleaving(
    GPTModel& model, const ParallelState& ps, int64_t num_microbatches, const MicroBatchSource& source,
    bool forward_only, const ScheduleObserver& observer = {}, Timers* timers = nullptr,
    const Comm& pp_backward = nullptr, const StageTensors* stage_tensors = nullptr, const MicroBatchLoss& loss = {});

// Megatron's interleaved 1F1B over ps.pp(): `chunks` are this rank's V model chunks in order
// (chunk c is virtual stage c·P + rank). `microbatch_group`: micro-batches per group of the
// schedule table (--microbatch-group-size-per-virtual-pipeline-stage; 0 = P, Megatron's default).
// num_microbatches must pass check_interleaved_microbatches (an InvalidArgument otherwise).
// `ripipe`: MindSpeed's --recompute-in-advance / --recompute-in-bubble order
// (ripipe_interleaved_order; training only). `stage_tensors`: as for 1F1B.
StatusOr<ForwardBackwardResult> forward_backward_pipelining_with_interleaving(
    const std::vector<GPTModel*>& chunks, const ParallelState& ps, int64_t num_microbatches,
    const MicroBatchSource& source, bool forward_only, const ScheduleObserver& observer = {},
    int64_t microbatch_group = 0, Timers* timers = nullptr, RiPipe ripipe = RiPipe::kNone,
    const StageTensors* stage_tensors = nullptr, const MicroBatchLoss& loss = {});

// DeepSeek's DualPipeV over ps.pp() (--schedules-method dualpipev): `chunks` are this rank's two
// chunks, chunk 0 = virtual stage rank and chunk 1 = stage 2P−1−rank (StagePlacement::kV), so
// pipeline rank 0 holds the embedding (chunk 0) and the loss (chunk 1); the order is
// dualpipev_order. num_microbatches must pass check_dualpipev_microbatches (an InvalidArgument
// otherwise). With `dw_detach` (--dualpipev-dw-detach) the order's I steps send their input
// gradient before the linears' weight gradients run, in the later W steps (model/weight_grad_store.h);
// the W steps are timed as backward-compute. With the op table's moe_fb_overlap (--moe-fb-overlap)
// the order's overlapped pairs (dualpipev_order's `fb_overlap`) wait for both receives, run their
// forward and backward interleaved at each MoE all-to-all (core/interleave.h; each timed as
// forward-compute / backward-compute while it runs), then send both results; bitwise the same results.
StatusOr<ForwardBackwardResult> forward_backward_dualpipev(const std::vector<GPTModel*>& chunks,
                                                           const ParallelState& ps, int64_t num_microbatches,
                                                           const MicroBatchSource& source, bool forward_only,
                                                           const ScheduleObserver& observer = {},
                                                           Timers* timers = nullptr, bool dw_detach = false,
                                                           const MicroBatchLoss& loss = {});

// Runs an arbitrary step order over ps.pp() with the same transfers, loading and loss handling as
// the schedules above (which call it with Megatron's and DualPipeV's orders); `placement` says
// which rank and chunk hold each virtual stage (pipeline_p2p.h), `pp_backward` the communicator of
// the gradients (null: ps.pp(), as the activations; see PipelineP2P). The order must run every
// (chunk, micro-batch) forward once and, unless `forward_only`, its backward after it (and for a
// backward that defers its weight gradients, one weight step later, in the order they deferred), with each
// chunk's forwards in micro-batch order on every rank, and the steps of all ranks must form an
// acyclic graph with their data dependencies. Recompute steps (PipelineStep::recompute, the RiPipe
// orders) call GPTModel::recompute between a forward and its backward and transfer nothing; a
// forward's StepKeep overrides the model's full-recompute plan for its micro-batch. Benchmarks use it to compare Megatron's orders
// with others (e.g. gpipe_order). `stage_tensors` (the loop placement only): as for 1F1B.
StatusOr<ForwardBackwardResult> forward_backward_pipelined(const std::vector<GPTModel*>& chunks,
                                                           const ParallelState& ps,
                                                           const std::vector<PipelineStep>& steps,
                                                           int64_t num_microbatches, const MicroBatchSource& source,
                                                           bool forward_only, const ScheduleObserver& observer = {},
                                                           Timers* timers = nullptr,
                                                           StagePlacement placement = StagePlacement::kLoop,
                                                           const Comm& pp_backward = nullptr,
                                                           const StageTensors* stage_tensors = nullptr,
                                                           const MicroBatchLoss& loss = {});

// Dispatches to the schedule the layout needs: no pipelining (one chunk, PP = 1), 1F1B (PP > 1),
// interleaved 1F1B (several chunks per rank, in groups of `microbatch_group` micro-batches;
// 0 = P), or DualPipeV when `dualpipev` (two chunks per rank in the V placement; with `dualpipev_dw_detach`
// its deferred weight gradients). `chunks` are this rank's virtual stages in order. `ripipe`
// applies to the interleaved schedule only (an InvalidArgument with any other); `pp_backward`
// (--optimize-send-recv-comm) to 1F1B only (an InvalidArgument with interleaving or DualPipeV;
// ignored without pipelining, where nothing is sent). `stage_tensors`
// (--use-multiparameter-pipeline-model-parallel) to 1F1B and interleaved 1F1B (an InvalidArgument
// with DualPipeV, as MindSpeed's; ignored without pipelining). `loss` (MicroBatchLoss) to every one.
StatusOr<ForwardBackwardResult> forward_backward(const std::vector<GPTModel*>& chunks, const ParallelState& ps,
                                                 int64_t num_microbatches, const MicroBatchSource& source,
                                                 bool forward_only, const ScheduleObserver& observer = {},
                                                 int64_t microbatch_group = 0, Timers* timers = nullptr,
                                                 bool dualpipev = false, bool dualpipev_dw_detach = false,
                                                 RiPipe ripipe = RiPipe::kNone, const Comm& pp_backward = nullptr,
                                                 const StageTensors* stage_tensors = nullptr,
                                                 const MicroBatchLoss& loss = {});



}  // namespace gale
