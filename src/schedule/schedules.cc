// The no-pipelining schedule and the dispatcher over the schedules.
#include "schedule/schedules.h"

namespace gale {

StatusOr<ForwardBackwardResult> forward_backward_no_pipelining(GPTModel& model, int64_t num_microbatches,
                                                               const MicroBatchSource& source, bool forward_only,
                                                               Timers* timers, const MicroBatchLoss& loss) {
  ForwardBackwardResult r;
  MicroBatch mb;
  model.set_num_microbatches(forward_only || loss ? 0 : num_microbatches);
  for (int64_t m = 0; m < num_microbatches; ++m) {
    GPTModel::LossSums sums;
    {
      ScopedTimer forward_timer(timers, "forward-compute", 2, false, {{"microbatch", m}, {"chunk", 0}});
      {
        ScopedTimer batch_timer(timers, "batch-generator", 2);
        GALE_RETURN_IF_ERROR(source(m, &mb));
      }
      model.forward(m, mb, Tensor(), /*training=*/!forward_only, &sums);
    }
    r.loss_sum += sums.loss_sum;
    r.tokens += sums.tokens;
    const float loss_scale =
        loss ? loss(model, m, sums) : micro_batch_loss_scale(sums.tokens, num_microbatches, model.per_token_loss());
    if (!forward_only) r.micro_batch_loss_sums.push_back(sums.loss_sum);
    if (!forward_only) {
      ScopedTimer backward_timer(timers, "backward-compute", 2, false, {{"microbatch", m}, {"chunk", 0}});
      model.backward(m, Tensor(), loss_scale);
    }
  }
  return r;
}

StatusOr<ForwardBackwardResult> forward_backward(const std::vector<GPTModel*>& chunks, const ParallelState& ps,
                                                 int64_t num_microbatches, const MicroBatchSource& source,
                                                 bool forward_only, const ScheduleObserver& observer,
                                                 int64_t microbatch_group, Timers* timers, bool dualpipev,
                                                 bool dualpipev_dw_detach, RiPipe ripipe, const Comm& pp_backward,
                                                 const StageTensors* stage_tensors, const MicroBatchLoss& loss) {
  GALE_CHECK(!chunks.empty()) << "no model chunks";
  GALE_CHECK(dualpipev || !dualpipev_dw_detach) << "--dualpipev-dw-detach without --schedules-method dualpipev";
  if (ripipe != RiPipe::kNone && (dualpipev || ps.pp_size() == 1 || chunks.size() == 1))
    return InvalidArgument(ripipe == RiPipe::kAdvance ? "--recompute-in-advance" : "--recompute-in-bubble",
                           " needs the interleaved pipeline schedule (--pipeline-model-parallel-size > 1 with virtual "
                           "stages, without --schedules-method dualpipev)");
  if (pp_backward && ps.pp_size() > 1 && (dualpipev || chunks.size() > 1))
    return InvalidArgument("--optimize-send-recv-comm applies to the 1F1B schedule without interleaving (as "
                           "MindSpeed's), found ",
                           dualpipev ? "--schedules-method dualpipev" : str_cat(chunks.size(), " model chunks per rank"));
  if (stage_tensors && ps.pp_size() > 1 && dualpipev)
    return InvalidArgument("--use-multiparameter-pipeline-model-parallel applies to the 1F1B and interleaved 1F1B "
                           "schedules (as MindSpeed's), found --schedules-method dualpipev");
  if (dualpipev)
    return forward_backward_dualpipev(chunks, ps, num_microbatches, source, forward_only, observer, timers,
                                      dualpipev_dw_detach, loss);
  if (ps.pp_size() == 1) {
    GALE_CHECK_EQ(chunks.size(), 1u) << "virtual pipeline stages need --pipeline-model-parallel-size > 1";
    return forward_backward_no_pipelining(*chunks[0], num_microbatches, source, forward_only, timers, loss);
  }
  // --dist-train: a forward-only (frozen) sub-world's stages run their forwards only, as evaluation
  // does; the stage after them sends them no gradient (DistTrainPipelineComm).
  if (ps.dist_train() && ps.dist_train()->forward_only_stage(ps.coords().pp)) forward_only = true;
  if (chunks.size() == 1)
    return forward_backward_pipelining_without_interleaving(*chunks[0], ps, num_microbatches, source, forward_only,
                                                            observer, timers, pp_backward, stage_tensors, loss);
  return forward_backward_pipelining_with_interleaving(chunks, ps, num_microbatches, source, forward_only, observer,
                                                       microbatch_group, timers, ripipe, stage_tensors, loss);
}

}  // namespace gale
