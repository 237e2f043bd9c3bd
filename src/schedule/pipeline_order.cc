// Megatron's 1F1B and interleaved 1F1B step orders.
#include "schedule/pipeline_order.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "core/check.h"

namespace gale {

std::string PipelineStep::to_string() const {
  const char* kind = forward ? "F " : recompute ? "R " : weight ? "W " : defer_weight ? "I " : "B ";
  const char* keeps = !forward || keep == StepKeep::kConfigured ? "" : keep == StepKeep::kAll ? " all" : " input";
  return str_cat(kind, chunk, " ", microbatch, keeps, overlap_next ? " +" : "");
}

int64_t one_f_one_b_warmup(int pp, int rank, int64_t num_microbatches) {
  return std::min<int64_t>(pp - rank - 1, num_microbatches);
}

std::vector<PipelineStep> one_f_one_b_order(int pp, int rank, int64_t num_microbatches, bool forward_only) {
  GALE_CHECK(rank >= 0 && rank < pp) << "pipeline rank " << rank << " of " << pp;
  std::vector<PipelineStep> steps;
  if (forward_only) {
    for (int64_t m = 0; m < num_microbatches; ++m) steps.push_back({true, 0, m});
    return steps;
  }
  const int64_t warmup = one_f_one_b_warmup(pp, rank, num_microbatches);
  for (int64_t m = 0; m < warmup; ++m) steps.push_back({true, 0, m});
  for (int64_t i = 0; i < num_microbatches - warmup; ++i) {
    steps.push_back({true, 0, warmup + i});
    steps.push_back({false, 0, i});
  }
  for (int64_t m = num_microbatches - warmup; m < num_microbatches; ++m) steps.push_back({false, 0, m});
  return steps;
}

Status check_interleaved_microbatches(int pp, int64_t num_microbatches, int64_t microbatch_group) {
  const int64_t g = microbatch_group > 0 ? microbatch_group : pp;
  auto counted = [&] {  // built only for an error: this runs every iteration
    return str_cat("the number of micro-batches per iteration (--global-batch-size / "
                   "(--micro-batch-size x data-parallel size) = ", num_microbatches, ")");
  };
  if (microbatch_group <= 0 && (num_microbatches < pp || num_microbatches % pp != 0))
    return InvalidArgument(
        "the interleaved pipeline schedule (--num-layers-per-virtual-pipeline-stage / "
        "--num-virtual-stages-per-pipeline-rank) needs ", counted(), " to be a multiple of "
        "--pipeline-model-parallel-size ", pp);
  if (g < pp || g > num_microbatches)
    return InvalidArgument("--microbatch-group-size-per-virtual-pipeline-stage ", g, " must lie between ",
                           "--pipeline-model-parallel-size ", pp, " and ", counted());
  const int64_t last = num_microbatches % g;
  if (last > 0 && last < pp)
    return InvalidArgument(counted(), " leaves a last group of ", last,
                           " micro-batches after groups of --microbatch-group-size-per-virtual-pipeline-stage ", g,
                           "; it must be 0 or at least --pipeline-model-parallel-size ", pp);
  return Status::Ok();
}

int64_t interleaved_warmup(int pp, int rank, int vpp, int64_t num_microbatches, bool forward_only,
                           int64_t microbatch_group) {
  const int64_t g = microbatch_group > 0 ? microbatch_group : pp;
  const int64_t total = num_microbatches * vpp;
  if (forward_only) return total;
  const int64_t warmup = static_cast<int64_t>(pp - rank - 1) * 2 + static_cast<int64_t>(vpp - 1) * g;
  return std::min(warmup, total);
}

std::vector<PipelineStep> interleaved_order(int pp, int rank, int vpp, int64_t num_microbatches, bool forward_only,
                                            int64_t microbatch_group) {
  GALE_CHECK(rank >= 0 && rank < pp) << "pipeline rank " << rank << " of " << pp;
  GALE_CHECK_OK(check_interleaved_microbatches(pp, num_microbatches, microbatch_group));
  const int64_t g = microbatch_group > 0 ? microbatch_group : pp;
  // Megatron's schedule table: virtual micro-batch k -> (micro-batch, chunk); groups of g
  // micro-batches go through every chunk before the next group starts (the last group takes
  // whatever is left).
  const int64_t total = num_microbatches * vpp;
  std::vector<PipelineStep> table;
  table.reserve(static_cast<size_t>(total));
  for (int64_t group = 0; group < num_microbatches; group += g) {
    const int64_t end = std::min(group + g, num_microbatches);
    for (int c = 0; c < vpp; ++c)
      for (int64_t m = group; m < end; ++m) table.push_back({true, c, m});
  }
  auto backward = [&](int64_t k) {
    PipelineStep s = table[static_cast<size_t>(k)];
    return PipelineStep{false, vpp - 1 - s.chunk, s.microbatch};
  };
  const int64_t warmup = interleaved_warmup(pp, rank, vpp, num_microbatches, forward_only, microbatch_group);
  std::vector<PipelineStep> steps(table.begin(), table.begin() + warmup);
  if (forward_only) return steps;
  for (int64_t k = 0; k < total - warmup; ++k) {
    steps.push_back(table[static_cast<size_t>(k + warmup)]);
    steps.push_back(backward(k));
  }
  for (int64_t k = total - warmup; k < total; ++k) steps.push_back(backward(k));
  return steps;
}

Status check_dualpipev_microbatches(int pp, int64_t num_microbatches) {
  if (pp < 2)
    return InvalidArgument("--schedules-method dualpipev needs --pipeline-model-parallel-size >= 2, found ", pp);
  if (num_microbatches < 2 * static_cast<int64_t>(pp))
    return InvalidArgument("--schedules-method dualpipev needs at least 2 x --pipeline-model-parallel-size = ", 2 * pp,
                           " micro-batches per iteration (--global-batch-size / (--micro-batch-size x data-parallel "
                           "size)), found ", num_microbatches);
  return Status::Ok();
}

std::vector<PipelineStep> dualpipev_order(int pp, int rank, int64_t num_microbatches, bool forward_only,
                                          bool dw_detach, bool fb_overlap) {
  GALE_CHECK_OK(check_dualpipev_microbatches(pp, num_microbatches));
  GALE_CHECK(rank >= 0 && rank < pp) << "pipeline rank " << rank << " of " << pp;
  const int64_t P = pp, r = rank, M = num_microbatches;
  const bool detach = dw_detach && !forward_only;
  std::vector<PipelineStep> steps;
  int64_t next_forward[2] = {0, 0}, next_backward[2] = {0, 0};  // per chunk, in micro-batch order
  std::deque<PipelineStep> deferred;                            // I steps whose W has not run, oldest first
  auto F = [&](int chunk) { steps.push_back({true, chunk, next_forward[chunk]++}); };
  auto B = [&](int chunk, bool defer = false) {
    if (forward_only) return;
    steps.push_back({false, chunk, next_backward[chunk]++, defer && detach});
    if (steps.back().defer_weight) deferred.push_back(steps.back());
  };
  auto W = [&] {
    if (!detach) return;
    GALE_CHECK(!deferred.empty()) << "dualpipev_order: a weight step with nothing deferred";
    steps.push_back({false, deferred.front().chunk, deferred.front().microbatch, false, true});
    deferred.pop_front();
  };
  for (int64_t i = 0; i < 2 * (P - r - 1); ++i) F(0);
  for (int64_t i = 0; i < r + 1; ++i) F(0), F(1);
  for (int64_t i = 0; i < P - r - 1; ++i) B(1, true), W(), F(1);
  const bool overlap = fb_overlap && !forward_only;
  auto pair = [&](int f_chunk) {  // F(f_chunk), B(1 - f_chunk): overlapped with --moe-fb-overlap
    F(f_chunk);
    steps.back().overlap_next = overlap;
    B(1 - f_chunk);
  };
  for (int64_t i = 0; i < M - 2 * P + r + 1; ++i) {
    if (i == 0 && r == P - 1)
      F(0), B(1);
    else
      pair(0);
    pair(1);
  }
  for (int64_t i = 0; i < P - r - 1; ++i) B(1), pair(1);
  for (int64_t i = 0; i < r + 1; ++i) {
    const bool later_half = i >= (r + 1) / 2;
    B(1, later_half && (i > (r + 1) / 2 || r % 2 == 1));
    B(0, later_half);
  }
  for (int64_t i = 0; i < P - r - 1; ++i) W(), B(0, true);
  for (int64_t i = 0; i < r + 1; ++i) W();
  GALE_CHECK(next_forward[0] == M && next_forward[1] == M) << "dualpipev_order: forwards miscounted";
  GALE_CHECK(forward_only || (next_backward[0] == M && next_backward[1] == M)) << "dualpipev_order: backwards miscounted";
  GALE_CHECK(deferred.empty()) << "dualpipev_order: weight gradients left queued";
  return steps;
}

std::vector<PipelineStep> gpipe_order(int64_t num_microbatches, bool forward_only) {
  std::vector<PipelineStep> steps;
  for (int64_t m = 0; m < num_microbatches; ++m) steps.push_back({true, 0, m});
  if (!forward_only)
    for (int64_t m = 0; m < num_microbatches; ++m) steps.push_back({false, 0, m});
  return steps;
}

namespace {

// The recompute step "R c m" of backward `b`.
PipelineStep recompute_step(const PipelineStep& b) {
  PipelineStep r{false, b.chunk, b.microbatch};
  r.recompute = true;
  return r;
}

}  // namespace

std::vector<PipelineStep> recompute_in_advance_order(const std::vector<PipelineStep>& steps, int keep_chunk) {
  std::vector<PipelineStep> out;
  out.reserve(steps.size() * 2);
  for (PipelineStep s : steps) {
    GALE_CHECK(!s.recompute && !s.weight && !s.defer_weight && s.keep == StepKeep::kConfigured)
        << "recompute_in_advance_order: expected a plain interleaved order";
    if (s.forward && s.chunk == keep_chunk) s.keep = StepKeep::kAll;
    if (!s.forward && s.chunk != keep_chunk) out.push_back(recompute_step(s));
    out.push_back(s);
  }
  return out;
}

std::vector<PipelineStep> recompute_in_bubble_order(const std::vector<PipelineStep>& steps, int64_t max_held) {
  GALE_CHECK_GE(max_held, 1);
  using Key = std::pair<int, int64_t>;  // (chunk, micro-batch)
  std::map<Key, size_t> backward_at;    // each backward's position in `steps`
  for (size_t i = 0; i < steps.size(); ++i) {
    GALE_CHECK(!steps[i].recompute && !steps[i].weight && !steps[i].defer_weight &&
               steps[i].keep == StepKeep::kConfigured)
        << "recompute_in_bubble_order: expected a plain interleaved order";
    if (!steps[i].forward) backward_at[{steps[i].chunk, steps[i].microbatch}] = i;
  }
  std::vector<PipelineStep> out;
  out.reserve(steps.size() * 2);
  std::set<std::pair<size_t, Key>> due;  // kept-input forwards not rematerialised yet, by backward position
  int64_t held = 0;                      // whole activations held
  for (PipelineStep s : steps) {
    const Key key{s.chunk, s.microbatch};
    auto b = backward_at.find(key);
    if (s.forward) {
      if (b != backward_at.end()) {  // a training forward
        // The recomputes due before this forward's backward will each hold one more.
        const int64_t earlier = static_cast<int64_t>(
            std::distance(due.begin(), due.lower_bound({b->second, Key{-1, -1}})));
        if (held + 1 + earlier <= max_held) {
          ++held;
        } else {
          s.keep = StepKeep::kInputOnly;
          due.insert({b->second, key});
        }
      }
    } else {
      GALE_CHECK(b != backward_at.end());
      if (due.erase({b->second, key}) > 0) {
        out.push_back(recompute_step(s));
        ++held;
      }
      --held;
    }
    out.push_back(s);
  }
  return out;
}

std::vector<PipelineStep> ripipe_interleaved_order(RiPipe ripipe, int pp, int rank, int vpp, int64_t num_microbatches,
                                                   bool forward_only, int64_t microbatch_group) {
  std::vector<PipelineStep> steps = interleaved_order(pp, rank, vpp, num_microbatches, forward_only, microbatch_group);
  if (forward_only || ripipe == RiPipe::kNone) return steps;
  if (ripipe == RiPipe::kAdvance) return recompute_in_advance_order(steps, rank == pp - 1 ? vpp - 1 : -1);
  return recompute_in_bubble_order(steps, static_cast<int64_t>(pp) * vpp);
}

int64_t max_whole_activations(const std::vector<PipelineStep>& steps) {
  int64_t held = 0, peak = 0;
  for (const PipelineStep& s : steps) {
    if (s.forward) {
      if (s.keep != StepKeep::kInputOnly) ++held;
    } else if (s.recompute) {
      ++held;
    }
    peak = std::max(peak, held);
    if (!s.forward && !s.recompute) --held;
  }
  return peak;
}

}  // namespace gale
