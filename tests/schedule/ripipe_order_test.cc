// MindSpeed's RiPipe orders (--recompute-in-advance / --recompute-in-bubble): where the recompute
// steps go, which forwards keep what, and the bubble order's bound of P·V whole activations.
#include <gtest/gtest.h>

#include <map>

#include "schedule/pipeline_order.h"

namespace gale {
namespace {

std::vector<std::string> strings(const std::vector<PipelineStep>& steps) {
  std::vector<std::string> out;
  for (const PipelineStep& s : steps) out.push_back(s.to_string());
  return out;
}

// Every R step is right before the backward of the same (chunk, micro-batch), once, after its forward.
void expect_recompute_right_before_backward(const std::vector<PipelineStep>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].recompute) continue;
    ASSERT_LT(i + 1, steps.size());
    const PipelineStep& b = steps[i + 1];
    EXPECT_TRUE(!b.forward && !b.recompute && b.chunk == steps[i].chunk && b.microbatch == steps[i].microbatch)
        << steps[i].to_string() << " is followed by " << b.to_string();
  }
}

// Without the R and the keep marks, the order is the interleaved one.
std::vector<PipelineStep> plain(std::vector<PipelineStep> steps) {
  std::vector<PipelineStep> out;
  for (PipelineStep s : steps) {
    if (s.recompute) continue;
    s.keep = StepKeep::kConfigured;
    out.push_back(s);
  }
  return out;
}

TEST(RiPipeOrder, AdvanceRecomputesBeforeEachBackwardButTheLastStagesChunk) {
  // PP 2, VPP 2, 2 micro-batches, the last rank: chunk 1 holds the model's last layers.
  const std::vector<PipelineStep> last = ripipe_interleaved_order(RiPipe::kAdvance, 2, 1, 2, 2, false);
  EXPECT_EQ(strings(last), (std::vector<std::string>{"F 0 0", "F 0 1", "F 1 0 all", "B 1 0", "F 1 1 all", "B 1 1",
                                                     "R 0 0", "B 0 0", "R 0 1", "B 0 1"}));
  // Rank 0 keeps no chunk whole: every backward has its R step.
  const std::vector<PipelineStep> first = ripipe_interleaved_order(RiPipe::kAdvance, 2, 0, 2, 2, false);
  EXPECT_EQ(strings(first), (std::vector<std::string>{"F 0 0", "F 0 1", "F 1 0", "F 1 1", "R 1 0", "B 1 0", "R 1 1",
                                                      "B 1 1", "R 0 0", "B 0 0", "R 0 1", "B 0 1"}));
  for (int pp : {2, 4})
    for (int vpp : {2, 3})
      for (int64_t m : {int64_t{pp}, int64_t{2 * pp}, int64_t{4 * pp}})
        for (int r = 0; r < pp; ++r) {
          const auto steps = ripipe_interleaved_order(RiPipe::kAdvance, pp, r, vpp, m, false);
          expect_recompute_right_before_backward(steps);
          EXPECT_EQ(plain(steps), interleaved_order(pp, r, vpp, m, false));
          int64_t recomputes = 0, kept_whole = 0;
          for (const PipelineStep& s : steps) {
            recomputes += s.recompute;
            kept_whole += s.forward && s.keep == StepKeep::kAll;
          }
          const int64_t last_stage_chunks = r == pp - 1 ? m : 0;  // chunk V−1's forwards on the last rank
          EXPECT_EQ(kept_whole, last_stage_chunks);
          EXPECT_EQ(recomputes, m * vpp - last_stage_chunks);
        }
}

TEST(RiPipeOrder, BubbleHoldsAtMostPipelineTimesVirtualStagesWhole) {
  int64_t total_recomputes = 0;
  for (int pp : {2, 3, 4})
    for (int vpp : {2, 3})
      for (int64_t m : {int64_t{pp}, int64_t{2 * pp}, int64_t{4 * pp}})
        for (int r = 0; r < pp; ++r) {
          SCOPED_TRACE(str_cat("pp ", pp, " vpp ", vpp, " m ", m, " rank ", r));
          const auto base = interleaved_order(pp, r, vpp, m, false);
          const auto steps = ripipe_interleaved_order(RiPipe::kBubble, pp, r, vpp, m, false);
          expect_recompute_right_before_backward(steps);
          EXPECT_EQ(plain(steps), base);
          const int64_t limit = static_cast<int64_t>(pp) * vpp, before = max_whole_activations(base);
          EXPECT_EQ(before, std::min(interleaved_warmup(pp, r, vpp, m, false) + 1, m * vpp));
          EXPECT_LE(max_whole_activations(steps), std::min(before, limit));
          // Each kept-input forward has its R step; nothing else recomputes.
          std::map<std::pair<int, int64_t>, int> due;
          for (const PipelineStep& s : steps) {
            if (s.forward && s.keep == StepKeep::kInputOnly) ++due[{s.chunk, s.microbatch}];
            if (s.recompute) --due[{s.chunk, s.microbatch}];
            total_recomputes += s.recompute;
            EXPECT_NE(s.keep, StepKeep::kAll);
          }
          for (const auto& [key, n] : due) EXPECT_EQ(n, 0) << "chunk " << key.first << " micro-batch " << key.second;
          if (before <= limit) EXPECT_EQ(steps, base) << "nothing to recompute";
        }
  EXPECT_GT(total_recomputes, 0);
  // PP 4, VPP 2, 8 micro-batches, rank 0: 11 whole chunk activations become 8 for 4 recomputes.
  const auto steps = ripipe_interleaved_order(RiPipe::kBubble, 4, 0, 2, 8, false);
  int64_t recomputes = 0;
  for (const PipelineStep& s : steps) recomputes += s.recompute;
  EXPECT_EQ(max_whole_activations(interleaved_order(4, 0, 2, 8, false)), 11);
  EXPECT_EQ(max_whole_activations(steps), 8);
  EXPECT_EQ(recomputes, 4);
}

TEST(RiPipeOrder, ForwardOnlyAndNoneAreTheInterleavedOrder) {
  for (RiPipe r : {RiPipe::kNone, RiPipe::kAdvance, RiPipe::kBubble}) {
    EXPECT_EQ(ripipe_interleaved_order(r, 4, 0, 2, 8, true), interleaved_order(4, 0, 2, 8, true));
    if (r == RiPipe::kNone) EXPECT_EQ(ripipe_interleaved_order(r, 4, 0, 2, 8, false), interleaved_order(4, 0, 2, 8, false));
  }
}

}  // namespace
}  // namespace gale
