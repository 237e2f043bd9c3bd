// Point-to-point transfers of activations and gradients between adjacent virtual pipeline stages.
//
// With P pipeline ranks and V model chunks per rank, chunk c of rank r is virtual stage
// s = c·P + r; stage s feeds stage s + 1, which is the next rank of the pipeline group, read as a
// ring (rank P−1's chunk c feeds rank 0's chunk c + 1). Forward sends a stage's output [Tl, H] to
// the next stage; backward sends the gradient of its input [Tl, H] to the previous stage.
//
// Deadlock freedom: every message carries a tag made of its direction, receiving stage and
// micro-batch, so a send matches its receive whatever order the two ranks issue them in. Sends are
// non-blocking and only completed later (release_completed / finish), receives are posted ahead of
// the step that needs them and waited for by that step. A rank therefore only ever blocks on data
// it needs now; as long as the schedule's steps with their data dependencies form an acyclic
// graph (as every Megatron schedule does), every wait is eventually satisfied.
//
// DualPipeV's V placement (--schedules-method dualpipev, two chunks per rank): chunk 0 of rank r is
// virtual stage r and chunk 1 is stage 2P−1−r, so stage s feeds the rank below through chunk 0 and
// the rank above through chunk 1; the last rank's chunk 0 feeds its own chunk 1, a hand-over inside
// the process (no message).
//
// Direction groups (MindSpeed's --optimize-send-recv-comm): with a `backward_group` the gradients
// travel on it and only the activations on `pp`. It must hold the same ranks in the same order as
// `pp` (a second communicator over the pipeline group, as MindSpeed's "pp_new_stream" group), so
// the two directions never share a communicator's matching queue or stream.
//
// Tags are taken modulo 32768 (the smallest tag bound MPI guarantees); two messages between the
// same pair of ranks could only share a tag if they were ≥ 32768 / (2·P·V) micro-batches apart,
// and MPI's non-overtaking rule matches such messages in issue order anyway.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "core/tensor.h"
#include "schedule/pipeline_tensor_spec.h"

namespace gale {

// Which rank and chunk hold each virtual stage: Megatron's loop (stage c·P + r) or DualPipeV's V.
enum class StagePlacement { kLoop, kV };

class PipelineP2P {
 public:
  // `pp` is this rank's pipeline group; `num_chunks` the model chunks per rank (V; 2 for kV);
  // `backward_group`, when not null, the communicator the gradients travel on (see above).
  PipelineP2P(Comm pp, int num_chunks, StagePlacement placement = StagePlacement::kLoop, Comm backward_group = nullptr);
  // Call finish() before. Transfers still in flight here (an error left the schedule early) keep
  // their buffers alive until the process ends instead of blocking: the job is going down.
  ~PipelineP2P();
  PipelineP2P(const PipelineP2P&) = delete;
  PipelineP2P& operator=(const PipelineP2P&) = delete;

  int num_virtual_stages() const { return size_ * num_chunks_; }
  int virtual_stage(int chunk) const { return stage_of(rank_, chunk); }
  // The virtual stage of `chunk` on pipeline rank `rank`, and the rank holding `stage`.
  int stage_of(int rank, int chunk) const;
  int rank_of(int stage) const;
  // The first virtual stage (embedding) receives no activation; the last (loss) sends none.
  bool first_virtual_stage(int chunk) const { return virtual_stage(chunk) == 0; }
  bool last_virtual_stage(int chunk) const { return virtual_stage(chunk) == num_virtual_stages() - 1; }

  // Posts the receive of what step (forward, chunk, mb) reads: its input activation (forward)
  // or the gradient of its output (backward), of `shape`. Posting twice is a no-op.
  void post_recv(bool forward, int chunk, int64_t mb, const Shape& shape);
  bool recv_posted(bool forward, int chunk, int64_t mb) const;
  // Waits for that receive (posted before) and hands over its tensor.
  Tensor wait_recv(bool forward, int chunk, int64_t mb);

  // Sends what step (forward, chunk, mb) produced: its output (forward) to the next stage or its
  // input gradient (backward) to the previous stage. The tensor is kept until the send completes.
  void send(bool forward, int chunk, int64_t mb, Tensor t);

  // The same for a list of typed tensors: the receive of `specs` (for backward, the gradient
  // specs), its tensors in that order, and the send of `tensors` (non-empty, each defined).
  void post_recv_tensors(bool forward, int chunk, int64_t mb, const PipeTensorSpecs& specs);
  std::vector<Tensor> wait_recv_tensors(bool forward, int chunk, int64_t mb);
  void send_tensors(bool forward, int chunk, int64_t mb, std::vector<Tensor> tensors);

  // What the stage of `chunk` sends forward for micro-batch mb (`outputs`; asked for chunks that
  // are not the last stage) and expects to receive (`inputs`; chunks that are not the first).
  using StageSpecsFn = std::function<PipeTensorSpecs(int chunk, int64_t mb)>;
  // Before the first transfer of the micro-batches [0, num_microbatches): each stage sends the
  // next one the descriptions of its outputs, which compares them with its inputs; then the
  // stages agree over the pipeline group (one all-reduce, on every rank). A stage that found a
  // mismatch returns an InvalidArgument naming both stages, the micro-batch and both lists; the
  // others a FailedPrecondition naming that pipeline rank. No data transfer is posted by it, and
  // every rank of the pipeline group must call it (with none in flight).
  Status agree_on_tensors(const StageSpecsFn& outputs, const StageSpecsFn& inputs, int64_t num_microbatches);

  // Drops the sends that have completed (frees their tensors); does not block.
  void release_completed();
  // Waits for every send still in flight.
  void finish();

  // The message tag of a transfer to virtual stage `receiver_stage` (exposed for tests).
  static int tag(bool forward, int receiver_stage, int64_t mb, int num_virtual_stages);

 private:
  using Key = std::tuple<bool, int, int64_t>;
  // A transfer's tensors and, when it went through MPI, one work handle per tensor.
  struct Pending {
    std::vector<Tensor> tensors;
    std::vector<WorkPtr> works;
  };
  // The communicator of a direction: activations on pp_, gradients on backward_ (or pp_).
  Communicator& comm(bool forward) const { return forward || !backward_ ? *pp_ : *backward_; }
  Comm pp_, backward_;
  int rank_, size_, num_chunks_;
  StagePlacement placement_;
  std::map<Key, Pending> recvs_;
  // Transfers to this rank's own stages (the V's turn), by receiving step: handed over, not sent.
  std::map<Key, std::vector<Tensor>> local_;
  std::vector<Pending> sends_;
};

}  // namespace gale
