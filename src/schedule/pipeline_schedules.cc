// 1F1B and interleaved 1F1B: run a rank's step order with activations and gradients over ps.pp().
#include <algorithm>
#include <array>
#include <map>

#include "core/interleave.h"
#include "model/weight_grad_store.h"
#include "schedule/pipeline_p2p.h"
#include "schedule/schedules.h"

namespace gale {

namespace {

// Receives are posted this many steps ahead of the step that reads them, so the transfer overlaps
// the compute of the steps in between (each posted receive holds one [Tl, H] buffer).
constexpr size_t kPrefetchSteps = 3;

// The activation between stages for micro-batch `mb`: [Tl, H].
Shape activation_shape(const GPTModel& model, const MicroBatch& mb) {
  const ModelPartition& part = model.partition();
  const int64_t tokens = mb.S * mb.B;
  if (part.tp2d())  // --tp-2d: the piece [T/X, H/Y]
    return {tokens / part.tp_x->size(), model.config().hidden / part.tp_y->size()};
  return {part.sequence_parallel ? tokens / part.tp_size() : tokens, model.config().hidden};
}

// Adds `seconds` to the level-2 timer `name` (nothing when `timers` is null or below level 2), and
// tells the timers' scope observer of it as of a scope that ended.
void add_seconds(Timers* timers, const char* name, double seconds) {
  if (!timers) return;
  if (TimerScopeObserver* o = timers->scope_observer()) o->scope_end(name, seconds);
  Timer& t = (*timers)(name, 2);
  if (t.enabled()) t.set_elapsed(t.elapsed(/*reset=*/false) + seconds);
}

}  // namespace

StatusOr<ForwardBackwardResult> forward_backward_pipelined(const std::vector<GPTModel*>& chunks,
                                                           const ParallelState& ps,
                                                           const std::vector<PipelineStep>& steps,
                                                           int64_t num_microbatches, const MicroBatchSource& source,
                                                           bool forward_only, const ScheduleObserver& observer,
                                                           Timers* timers, StagePlacement placement,
                                                           const Comm& pp_backward, const StageTensors* stage_tensors,
                                                           const MicroBatchLoss& loss) {
  PipelineP2P p2p(ps.pp(), static_cast<int>(chunks.size()), placement, pp_backward);
  for (size_t c = 0; c < chunks.size(); ++c) {
    chunks[c]->set_num_microbatches(forward_only || loss ? 0 : num_microbatches);  // the eager fused LM head
    const ModelPartition& part = chunks[c]->partition();
    GALE_CHECK_EQ(part.pre_process, p2p.first_virtual_stage(static_cast<int>(c)));
    GALE_CHECK_EQ(part.post_process, p2p.last_virtual_stage(static_cast<int>(c)));
  }
  auto receives = [&](const PipelineStep& s) {
    if (s.weight || s.recompute) return false;
    return s.forward ? !p2p.first_virtual_stage(s.chunk) : !p2p.last_virtual_stage(s.chunk);
  };
  // Load this iteration's micro-batches first, and agree over the pipeline group that every
  // stage could: a stage that failed half-way through the schedule would leave its neighbours
  // waiting for transfers that never come. Every stage loads the same micro-batches, so each
  // knows every transfer's shape, which may differ between micro-batches (--variable-seq-lengths)
  // with no shape exchange.
  std::vector<MicroBatch> batches(static_cast<size_t>(num_microbatches));
  std::vector<Shape> shapes(static_cast<size_t>(num_microbatches));  // micro-batch m's transfers: [Tl, H]
  Status loaded = Status::Ok();
  for (int64_t m = 0; m < num_microbatches && loaded.ok(); ++m) {
    MicroBatch& mb = batches[static_cast<size_t>(m)];
    ScopedTimer batch_timer(timers, "batch-generator", 2);
    loaded = source(m, &mb);
    shapes[static_cast<size_t>(m)] = activation_shape(*chunks[0], mb);
  }
  const int64_t failed_stage =
      ps.pp()->all_reduce_scalar(loaded.ok() ? int64_t{0} : static_cast<int64_t>(ps.coords().pp) + 1, ReduceOp::kMax);
  if (!loaded.ok()) return loaded;
  if (failed_stage > 0)
    return FailedPrecondition("pipeline stage ", failed_stage - 1, " could not load this iteration's micro-batches (",
                              "its error is reported by that rank)");
  if (num_microbatches == 0) return ForwardBackwardResult{};
  // --use-multiparameter-pipeline-model-parallel: each transfer is stage_tensors' list; the stages
  // first agree on every list of the iteration (a mismatch is an error on every stage, not a hang).
  auto transfer_specs = [&](int64_t m) {
    return stage_tensors->specs(shapes[static_cast<size_t>(m)], batches[static_cast<size_t>(m)]);
  };
  if (stage_tensors) {
    GALE_CHECK(placement == StagePlacement::kLoop) << "several tensors per transfer with DualPipeV's placement";
    const auto specs = [&](int, int64_t m) { return transfer_specs(m); };
    GALE_RETURN_IF_ERROR(p2p.agree_on_tensors(specs, specs, num_microbatches));
  }
  const int last_chunk = static_cast<int>(chunks.size()) - 1;
  ForwardBackwardResult result;
  std::map<int64_t, float> loss_scales;   // last stage: each micro-batch's backward loss scale until its backward
  size_t prefetched = 0;                  // steps [0, prefetched) have their receives posted
  WeightGradStore deferred;               // the weight gradients of I steps until their W step
  auto prefetch = [&](size_t upto) {
    for (upto = std::min(upto, steps.size()); prefetched < upto; ++prefetched)
      if (receives(steps[prefetched])) {
        const PipelineStep& s = steps[prefetched];
        if (stage_tensors) {
          const PipeTensorSpecs specs = transfer_specs(s.microbatch);
          p2p.post_recv_tensors(s.forward, s.chunk, s.microbatch, s.forward ? specs : gradient_specs(specs));
        } else {
          p2p.post_recv(s.forward, s.chunk, s.microbatch, shapes[static_cast<size_t>(s.microbatch)]);
        }
      }
  };
  // A forward step's compute and bookkeeping (loss sums); returns what it sends on (empty on the
  // chunk holding the loss): the output, or with stage_tensors its list.
  auto run_forward = [&](const PipelineStep& s, std::vector<Tensor> received_list) {
    GPTModel& model = *chunks[static_cast<size_t>(s.chunk)];
    MicroBatch& mb = batches[static_cast<size_t>(s.microbatch)];
    Tensor received;
    if (!received_list.empty())
      received = stage_tensors ? stage_tensors->take_inputs(std::move(received_list), &mb) : std::move(received_list[0]);
    GPTModel::LossSums sums;
    FullRecompute plan = model.config().full_recompute;  // StepKeep::kAll / kInputOnly override it
    if (s.keep == StepKeep::kAll) plan.method = FullRecompute::Method::kNone;
    if (s.keep == StepKeep::kInputOnly) plan.method = FullRecompute::Method::kUniform, plan.num_layers = int64_t{1} << 40;
    Tensor out = model.forward(s.microbatch, mb, received, /*training=*/!forward_only, &sums,
                               s.keep == StepKeep::kConfigured ? nullptr : &plan);
    std::vector<Tensor> sent;
    if (out.defined()) {
      if (stage_tensors) sent = stage_tensors->outputs(std::move(out), mb);
      else sent.push_back(std::move(out));
    }
    if (s.chunk == last_chunk) mb = MicroBatch();  // the model keeps what its backward needs
    if (model.partition().post_process) {
      result.loss_sum += sums.loss_sum;
      result.tokens += sums.tokens;
      const float loss_scale = loss ? loss(model, s.microbatch, sums)
                                    : micro_batch_loss_scale(sums.tokens, num_microbatches, model.per_token_loss());
      if (!forward_only) {
        loss_scales[s.microbatch] = loss_scale;
        result.micro_batch_loss_sums.resize(static_cast<size_t>(num_microbatches), 0.0);
        result.micro_batch_loss_sums[static_cast<size_t>(s.microbatch)] = sums.loss_sum;
      }
    }
    return sent;
  };
  // A backward step's loss scale (the chunk holding the loss; 0 elsewhere), read before it runs.
  auto backward_loss_scale = [&](const PipelineStep& s) {
    if (!chunks[static_cast<size_t>(s.chunk)]->partition().post_process) return 0.0f;
    auto it = loss_scales.find(s.microbatch);
    GALE_CHECK(it != loss_scales.end()) << "backward of micro-batch " << s.microbatch << " before its forward";
    const float scale = it->second;
    loss_scales.erase(it);
    return scale;
  };
  // The backward's received list is the gradients of the outputs that have one: the hidden states'.
  auto run_backward = [&](const PipelineStep& s, std::vector<Tensor> received_list, float loss_scale) {
    GPTModel& model = *chunks[static_cast<size_t>(s.chunk)];
    GALE_CHECK_LE(received_list.size(), size_t{1}) << "a backward receives the hidden states' gradient only";
    const Tensor received = received_list.empty() ? Tensor() : std::move(received_list[0]);
    Tensor d_input = model.backward(s.microbatch, received, loss_scale, s.defer_weight ? &deferred : nullptr);
    if (s.defer_weight) {
      deferred.flush(s.chunk, s.microbatch);
      result.deferred_weight_grad_peak_bytes = std::max(result.deferred_weight_grad_peak_bytes, deferred.held_bytes());
    }
    return d_input;
  };
  auto send_forward = [&](const PipelineStep& s, std::vector<Tensor> out) {
    if (chunks[static_cast<size_t>(s.chunk)]->partition().post_process) return;
    ScopedTimer send_timer(timers, "forward-send", 2, false, {{"microbatch", s.microbatch}, {"chunk", s.chunk}});
    if (stage_tensors) p2p.send_tensors(/*forward=*/true, s.chunk, s.microbatch, std::move(out));
    else p2p.send(/*forward=*/true, s.chunk, s.microbatch, std::move(out.at(0)));
  };
  // The input's gradient; with stage_tensors the list of the inputs that have one (the hidden states).
  auto send_backward = [&](const PipelineStep& s, Tensor d_input) {
    if (chunks[static_cast<size_t>(s.chunk)]->partition().pre_process) return;
    ScopedTimer send_timer(timers, "backward-send", 2, false, {{"microbatch", s.microbatch}, {"chunk", s.chunk}});
    if (stage_tensors) {
      std::vector<Tensor> grads;
      grads.push_back(std::move(d_input));
      p2p.send_tensors(/*forward=*/false, s.chunk, s.microbatch, std::move(grads));
    } else {
      p2p.send(/*forward=*/false, s.chunk, s.microbatch, std::move(d_input));
    }
  };
  auto receive = [&](const PipelineStep& s) {
    std::vector<Tensor> list;
    if (!receives(s)) return list;
    ScopedTimer recv_timer(timers, s.forward ? "forward-recv" : "backward-recv", 2, false,
                          {{"microbatch", s.microbatch}, {"chunk", s.chunk}});
    if (stage_tensors) return p2p.wait_recv_tensors(s.forward, s.chunk, s.microbatch);
    list.push_back(p2p.wait_recv(s.forward, s.chunk, s.microbatch));
    return list;
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const PipelineStep& s = steps[i];
    GPTModel& model = *chunks[static_cast<size_t>(s.chunk)];
    prefetch(i + kPrefetchSteps);
    if (s.weight) {  // W: the oldest deferred backward's weight gradients
      ScopedTimer weight_timer(timers, "backward-compute", 2, false, {{"microbatch", s.microbatch}, {"chunk", s.chunk}, {"weight", 1}});
      const std::pair<int, int64_t> ran = deferred.pop();
      weight_timer.stop();
      GALE_CHECK(ran.first == s.chunk && ran.second == s.microbatch)
          << "weight step " << s.to_string() << " found the deferred gradients of chunk " << ran.first
          << " micro-batch " << ran.second;
      p2p.release_completed();
      if (observer) observer(s);
      continue;
    }
    if (s.forward && s.overlap_next) {
      // --moe-fb-overlap: an overlapped pair, as DeepSeek's DualPipeV runs it: both receives, the
      // forward and the backward interleaved at each MoE all-to-all (core/interleave.h), both sends.
      GALE_CHECK(i + 1 < steps.size() && !steps[i + 1].forward && !steps[i + 1].weight && !steps[i + 1].recompute &&
                 !steps[i + 1].defer_weight && steps[i + 1].chunk != s.chunk)
          << "step " << s.to_string() << " is overlapped but not followed by a plain backward of the other chunk";
      const PipelineStep& b = steps[i + 1];
      prefetch(i + 1 + kPrefetchSteps);
      std::vector<Tensor> f_in = receive(s), b_in = receive(b);
      const float loss_scale = backward_loss_scale(b);
      std::vector<Tensor> out;
      Tensor d_input;
      const std::array<double, 2> ran = run_interleaved([&] { out = run_forward(s, std::move(f_in)); },
                                                        [&] { d_input = run_backward(b, std::move(b_in), loss_scale); });
      add_seconds(timers, "forward-compute", ran[0]);  // each one's own running time
      add_seconds(timers, "backward-compute", ran[1]);
      send_forward(s, std::move(out));
      send_backward(b, std::move(d_input));
      p2p.release_completed();
      if (observer) observer(s), observer(b);
      ++i;
      continue;
    }
    std::vector<Tensor> received = receive(s);
    if (s.recompute) {  // RiPipe: the recompute ahead of its backward (no transfer)
      ScopedTimer recompute_timer(timers, "backward-compute", 2, false, {{"microbatch", s.microbatch}, {"chunk", s.chunk}, {"recompute", 1}});
      model.recompute(s.microbatch);
    } else if (s.forward) {
      ScopedTimer forward_timer(timers, "forward-compute", 2, false, {{"microbatch", s.microbatch}, {"chunk", s.chunk}});
      std::vector<Tensor> out = run_forward(s, std::move(received));
      forward_timer.stop();
      send_forward(s, std::move(out));
    } else {
      const float loss_scale = backward_loss_scale(s);
      ScopedTimer backward_timer(timers, "backward-compute", 2, false, {{"microbatch", s.microbatch}, {"chunk", s.chunk}});
      Tensor d_input = run_backward(s, std::move(received), loss_scale);
      backward_timer.stop();
      send_backward(s, std::move(d_input));
    }
    p2p.release_completed();
    if (observer) observer(s);
  }
  p2p.finish();
  GALE_CHECK(deferred.empty()) << "the step order left deferred weight gradients unrun";
  return result;
}

StatusOr<ForwardBackwardResult> forward_backward_pipelining_without_interleaving(
    GPTModel& model, const ParallelState& ps, int64_t num_microbatches, const MicroBatchSource& source,
    bool forward_only, const ScheduleObserver& observer, Timers* timers, const Comm& pp_backward,
    const StageTensors* stage_tensors, const MicroBatchLoss& loss) {
  const int pp = ps.pp_size(), rank = ps.coords().pp;
  return forward_backward_pipelined({&model}, ps, one_f_one_b_order(pp, rank, num_microbatches, forward_only),
                                    num_microbatches, source, forward_only, observer, timers, StagePlacement::kLoop,
                                    pp_backward, stage_tensors, loss);
}

StatusOr<ForwardBackwardResult> forward_backward_pipelining_with_interleaving(
    const std::vector<GPTModel*>& chunks, const ParallelState& ps, int64_t num_microbatches,
    const MicroBatchSource& source, bool forward_only, const ScheduleObserver& observer, int64_t microbatch_group,
    Timers* timers, RiPipe ripipe, const StageTensors* stage_tensors, const MicroBatchLoss& loss) {
  const int pp = ps.pp_size(), rank = ps.coords().pp, vpp = static_cast<int>(chunks.size());
  GALE_RETURN_IF_ERROR(check_interleaved_microbatches(pp, num_microbatches, microbatch_group));
  return forward_backward_pipelined(
      chunks, ps, ripipe_interleaved_order(ripipe, pp, rank, vpp, num_microbatches, forward_only, microbatch_group),
      num_microbatches, source, forward_only, observer, timers, StagePlacement::kLoop, nullptr, stage_tensors,
      loss);
}

StatusOr<ForwardBackwardResult> forward_backward_dualpipev(const std::vector<GPTModel*>& chunks,
                                                           const ParallelState& ps, int64_t num_microbatches,
                                                           const MicroBatchSource& source, bool forward_only,
                                                           const ScheduleObserver& observer, Timers* timers,
                                                           bool dw_detach, const MicroBatchLoss& loss) {
  const int pp = ps.pp_size(), rank = ps.coords().pp;
  if (chunks.size() != 2)
    return InvalidArgument("--schedules-method dualpipev runs two model chunks per pipeline rank, found ", chunks.size());
  GALE_RETURN_IF_ERROR(check_dualpipev_microbatches(pp, num_microbatches));
  const bool fb_overlap = chunks[0]->ops().moe_fb_overlap;
  return forward_backward_pipelined(chunks, ps,
                                    dualpipev_order(pp, rank, num_microbatches, forward_only, dw_detach, fb_overlap),
                                    num_microbatches, source, forward_only, observer, timers, StagePlacement::kV,
                                    nullptr, nullptr, loss);
}

}  // namespace gale
