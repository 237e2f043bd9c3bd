// DualPipeV's step order: for PP = 4 and 10 micro-batches it is the order of DeepSeek's published
// figure (dualpipe repo, images/dualpipev.png, transcribed below by hand), every (PP, M) order
// completes against the V's data dependencies (no deadlock), each chunk's steps run in micro-batch
// order, the activation peak is DualPipeV's, and too few micro-batches are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <set>
#include <sstream>
#include <tuple>

#include "schedule/pipeline_order.h"

namespace gale {
namespace {

// DeepSeek's figure "DualPipeV scheduling for 4 PP ranks (8 PP stages) and 10 micro-batches", one
// row per device, read left to right: F m / B m is a forward / backward (full, or "backward for
// input") of micro-batch m in either chunk; the "backward for weights" cells are left out (Gale's
// backward computes them), an overlapped forward & backward cell is its forward, then its backward.
const char* const kFigurePp4M10[4] = {
    "F0 F1 F2 F3 F4 F5 F6 F0 B0 F1 B1 F2 B2 F3 F7 B3 F4 B0 F8 B4 F5 B1 F9 B5 F6 B2 B6 F7 B3 B7 F8 B4 B8 F9 B5 "
    "B9 B6 B7 B8 B9",
    "F0 F1 F2 F3 F4 F0 F5 F1 B0 F2 B1 F3 F6 B2 F4 B0 F7 B3 F5 B1 F8 B4 F6 B2 F9 B5 F7 B3 B6 F8 B4 B7 F9 B5 B8 "
    "B6 B9 B7 B8 B9",
    "F0 F1 F2 F0 F3 F1 F4 F2 B0 F3 F5 B1 F4 B0 F6 B2 F5 B1 F7 B3 F6 B2 F8 B4 F7 B3 F9 B5 F8 B4 B6 F9 B5 B7 B6 "
    "B8 B7 B9 B8 B9",
    "F0 F0 F1 F1 F2 F2 F3 F3 F4 B0 F4 B0 F5 B1 F5 B1 F6 B2 F6 B2 F7 B3 F7 B3 F8 B4 F8 B4 F9 B5 F9 B5 B6 B6 B7 "
    "B7 B8 B8 B9 B9",
};

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

TEST(DualPipeVOrder, MatchesDeepSeeksFigureForFourRanksAndTenMicroBatches) {
  for (int r = 0; r < 4; ++r) {
    std::vector<std::string> got;
    for (const PipelineStep& s : dualpipev_order(4, r, 10, false))
      got.push_back(str_cat(s.forward ? "F" : "B", s.microbatch));
    EXPECT_EQ(got, words(kFigurePp4M10[r])) << "pipeline rank " << r;
  }
}

// The chunks of the figure's rank 0 (its two shades): six chunk-0 forwards, then chunk 0 and 1
// alternate; the first backward is chunk 1's (the loss), the steady pairs put a forward of one chunk
// before a backward of the other.
TEST(DualPipeVOrder, RankZeroStartsDownTheVAndPairsForwardsWithTheOtherChunksBackwards) {
  const std::vector<PipelineStep> s = dualpipev_order(4, 0, 10, false);
  std::vector<std::string> head;
  for (size_t i = 0; i < 18; ++i) head.push_back(s[i].to_string());
  EXPECT_EQ(head, (std::vector<std::string>{"F 0 0", "F 0 1", "F 0 2", "F 0 3", "F 0 4", "F 0 5", "F 0 6", "F 1 0",
                                            "B 1 0", "F 1 1", "B 1 1", "F 1 2", "B 1 2", "F 1 3", "F 0 7", "B 1 3",
                                            "F 1 4", "B 0 0"}));
}

// Runs every rank's order against the V's data dependencies (chunk 0 of rank r is stage r, chunk 1
// stage 2P−1−r; forward (s, m) needs forward (s − 1, m); backward (s, m) its own forward and
// backward (s + 1, m) unless s is the last stage), one step at a time on whichever rank can
// proceed. False if the ranks stall with steps left. `peak[r]`: the most (chunk, micro-batch)
// activations rank r held between a forward and its backward.
// With `dw_detach` the W steps need nothing from other ranks (their I step ran before on the rank).
// With `fb_overlap` an overlapped pair (a forward marked overlap_next and the backward after it) runs
// as one step once both are ready, as the executor waits for both receives before computing either.
bool simulate_v(int pp, int64_t m, bool forward_only, std::vector<int64_t>* peak, bool dw_detach = false,
                bool fb_overlap = false) {
  std::vector<std::vector<PipelineStep>> orders;
  for (int r = 0; r < pp; ++r) orders.push_back(dualpipev_order(pp, r, m, forward_only, dw_detach, fb_overlap));
  std::set<std::tuple<bool, int, int64_t>> done;
  std::vector<size_t> next(static_cast<size_t>(pp), 0);
  std::vector<int64_t> held(static_cast<size_t>(pp), 0);
  peak->assign(static_cast<size_t>(pp), 0);
  const int last = 2 * pp - 1;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      size_t& i = next[static_cast<size_t>(r)];
      if (i == orders[static_cast<size_t>(r)].size()) continue;
      const PipelineStep& s = orders[static_cast<size_t>(r)][i];
      if (s.weight) {
        ++i;
        progress = true;
        continue;
      }
      auto stage_of = [&](const PipelineStep& x) { return x.chunk == 0 ? r : last - r; };
      auto ready = [&](const PipelineStep& x) {
        const int stage = stage_of(x);
        return x.forward ? (stage == 0 || done.count({true, stage - 1, x.microbatch}))
                         : done.count({true, stage, x.microbatch}) &&
                               (stage == last || done.count({false, stage + 1, x.microbatch}));
      };
      const size_t n = s.overlap_next ? 2 : 1;
      if (!ready(s) || (n == 2 && !ready(orders[static_cast<size_t>(r)][i + 1]))) continue;
      for (size_t j = 0; j < n; ++j) {
        const PipelineStep& x = orders[static_cast<size_t>(r)][i + j];
        done.insert({x.forward, stage_of(x), x.microbatch});
        int64_t& h = held[static_cast<size_t>(r)];
        if (!forward_only) h += x.forward ? 1 : -1;
        (*peak)[static_cast<size_t>(r)] = std::max((*peak)[static_cast<size_t>(r)], h);
      }
      i += n;
      progress = true;
    }
  }
  for (int r = 0; r < pp; ++r)
    if (next[static_cast<size_t>(r)] != orders[static_cast<size_t>(r)].size()) return false;
  return true;
}

TEST(DualPipeVOrder, EveryOrderCompletesWithEachChunkInMicroBatchOrder) {
  std::vector<int64_t> peak;
  for (int pp : {2, 3, 4, 8})
    for (int64_t m : {2 * pp, 2 * pp + 1, 3 * pp, 4 * pp + 3, 20})
      for (bool fwd : {false, true}) {
        EXPECT_TRUE(simulate_v(pp, m, fwd, &peak)) << "pp " << pp << " m " << m << (fwd ? " forward-only" : "");
        for (int r = 0; r < pp; ++r) {
          const std::vector<PipelineStep> steps = dualpipev_order(pp, r, m, fwd);
          ASSERT_EQ(steps.size(), static_cast<size_t>((fwd ? 2 : 4) * m)) << pp << " " << r << " " << m;
          int64_t next[2][2] = {{0, 0}, {0, 0}};  // [forward][chunk]
          for (const PipelineStep& s : steps) {
            ASSERT_TRUE(s.chunk == 0 || s.chunk == 1);
            EXPECT_EQ(s.microbatch, next[s.forward][s.chunk]++) << s.to_string() << " on rank " << r;
          }
        }
      }
}

// --moe-fb-overlap marks DeepSeek's overlapped pairs (phase 4: (F0, B1) but the last rank's first,
// (F1, B0); phase 5: (F1, B0)) and changes nothing else; every order with its pairs run as units
// completes (no deadlock from waiting for both receives), with and without --dualpipev-dw-detach.
TEST(DualPipeVOrder, FbOverlapMarksDeepSeeksOverlappedPairs) {
  std::vector<int64_t> peak;
  for (int pp : {2, 3, 4, 8})
    for (int64_t m : {2 * pp, 2 * pp + 1, 3 * pp, 4 * pp + 3, 20})
      for (bool detach : {false, true}) {
        EXPECT_TRUE(simulate_v(pp, m, false, &peak, detach, true)) << "pp " << pp << " m " << m;
        for (int r = 0; r < pp; ++r) {
          const std::vector<PipelineStep> plain = dualpipev_order(pp, r, m, false, detach);
          const std::vector<PipelineStep> paired = dualpipev_order(pp, r, m, false, detach, true);
          ASSERT_EQ(plain.size(), paired.size());
          int64_t pairs = 0;
          for (size_t i = 0; i < plain.size(); ++i) {
            PipelineStep unmarked = paired[i];
            unmarked.overlap_next = false;
            EXPECT_EQ(unmarked, plain[i]) << i;
            if (!paired[i].overlap_next) continue;
            ++pairs;
            ASSERT_TRUE(paired[i].forward && i + 1 < paired.size());
            const PipelineStep& b = paired[i + 1];
            EXPECT_TRUE(!b.forward && !b.weight && !b.defer_weight && !b.recompute && b.chunk != paired[i].chunk)
                << b.to_string();
          }
          EXPECT_EQ(pairs, 2 * (m - 2 * pp + r + 1) - (r == pp - 1 ? 1 : 0) + (pp - r - 1))
              << "pp " << pp << " rank " << r << " m " << m;
        }
      }
  // Forward-only orders have no backward to pair.
  for (const PipelineStep& s : dualpipev_order(2, 0, 4, true, false, true)) EXPECT_FALSE(s.overlap_next);
  EXPECT_EQ(dualpipev_order(2, 0, 6, false, false, true)[6].to_string(), "F 0 3 +");
}

// DeepSeek's table: DualPipeV keeps PP_stages + 1 = 2P + 1 chunk activations on every device
// (the same on every rank, unlike 1F1B's P − r), whatever the number of micro-batches.
TEST(DualPipeVOrder, EveryRankHoldsTwicePipelineSizePlusOneActivations) {
  std::vector<int64_t> peak;
  for (int pp : {2, 3, 4, 8})
    for (int64_t m : {2 * pp, 3 * pp, 20}) {
      ASSERT_TRUE(simulate_v(pp, m, false, &peak));
      EXPECT_EQ(peak, std::vector<int64_t>(static_cast<size_t>(pp), 2 * pp + 1)) << pp << " " << m;
    }
}

std::vector<std::string> strings(const std::vector<PipelineStep>& steps) {
  std::vector<std::string> out;
  for (const PipelineStep& s : steps) out.push_back(s.to_string());
  return out;
}

// --dualpipev-dw-detach, PP = 2 and 4 micro-batches, by hand from DeepSeek's dualpipev.py: rank 0
// (P − r − 1 = 1) defers its phase-3 backward I 1 0 and runs its weight step at once, before the
// next forward; in phase 6 the later half of the pairs defers (rank 0: its one B0; rank 1, odd: the
// whole second pair); phase 7 puts a W before each cool-down I 0 m, phase 8 runs the r + 1 left.
TEST(DualPipeVOrder, DwDetachDefersPhaseThreeAndTheCoolDownsWeightGradients) {
  EXPECT_EQ(strings(dualpipev_order(2, 0, 4, false, true)),
            (std::vector<std::string>{"F 0 0", "F 0 1", "F 0 2", "F 1 0", "I 1 0", "W 1 0", "F 1 1", "F 0 3", "B 1 1",
                                      "F 1 2", "B 0 0", "B 1 2", "F 1 3", "B 0 1", "B 1 3", "I 0 2", "W 0 2", "I 0 3",
                                      "W 0 3"}));
  EXPECT_EQ(strings(dualpipev_order(2, 1, 4, false, true)),
            (std::vector<std::string>{"F 0 0", "F 1 0", "F 0 1", "F 1 1", "F 0 2", "B 1 0", "F 1 2", "B 0 0", "F 0 3",
                                      "B 1 1", "F 1 3", "B 0 1", "B 1 2", "B 0 2", "I 1 3", "I 0 3", "W 1 3",
                                      "W 0 3"}));
  // Forward-only has nothing to defer.
  EXPECT_EQ(dualpipev_order(4, 1, 9, true, true), dualpipev_order(4, 1, 9, true, false));
}

// For every (PP, M, rank): the detached order is the plain one with some B steps turned into I steps
// and W steps inserted; each W runs the oldest pending I's weight gradients; every chunk's weight
// gradients accumulate in micro-batch order (at its B, or at the W of its I), which is what makes the
// gradients bitwise those of plain DualPipeV; 2P − r − 1 backwards defer, at most r + 1 of them
// pending at once (their linears' inputs and output gradients held until their W); and the ranks
// still complete against the V's dependencies.
TEST(DualPipeVOrder, DwDetachKeepsEachWeightsMicroBatchOrderAndCompletes) {
  std::vector<int64_t> peak;
  for (int pp : {2, 3, 4, 8})
    for (int64_t m : {2 * pp, 2 * pp + 1, 3 * pp, 4 * pp + 3, 20}) {
      EXPECT_TRUE(simulate_v(pp, m, false, &peak, true)) << "pp " << pp << " m " << m;
      EXPECT_EQ(peak, std::vector<int64_t>(static_cast<size_t>(pp), 2 * pp + 1)) << pp << " " << m;
      for (int r = 0; r < pp; ++r) {
        const std::vector<PipelineStep> detached = dualpipev_order(pp, r, m, false, true);
        std::vector<PipelineStep> stripped;
        std::deque<PipelineStep> pending;
        int64_t next_weight[2] = {0, 0}, deferred = 0;
        size_t most_pending = 0;
        for (const PipelineStep& s : detached) {
          if (s.weight) {
            ASSERT_FALSE(pending.empty()) << s.to_string() << " on rank " << r;
            EXPECT_EQ(s.chunk, pending.front().chunk) << "rank " << r;
            EXPECT_EQ(s.microbatch, pending.front().microbatch) << "rank " << r;
            pending.pop_front();
            EXPECT_EQ(s.microbatch, next_weight[s.chunk]++) << s.to_string() << " on rank " << r;
            continue;
          }
          if (!s.forward && s.defer_weight) {
            pending.push_back(s);
            ++deferred;
            most_pending = std::max(most_pending, pending.size());
          } else if (!s.forward) {
            EXPECT_EQ(s.microbatch, next_weight[s.chunk]++) << s.to_string() << " on rank " << r;
          }
          stripped.push_back({s.forward, s.chunk, s.microbatch});
        }
        EXPECT_TRUE(pending.empty());
        EXPECT_EQ(stripped, dualpipev_order(pp, r, m, false)) << "pp " << pp << " rank " << r << " m " << m;
        EXPECT_EQ(deferred, 2 * pp - r - 1) << "pp " << pp << " rank " << r;
        EXPECT_EQ(most_pending, static_cast<size_t>(r + 1)) << "pp " << pp << " rank " << r;
      }
    }
}

TEST(DualPipeVOrder, NeedsTwicePipelineSizeMicroBatchesAndTwoRanks) {
  EXPECT_TRUE(check_dualpipev_microbatches(2, 4).ok());
  EXPECT_TRUE(check_dualpipev_microbatches(4, 8).ok());
  Status few = check_dualpipev_microbatches(4, 7);
  ASSERT_FALSE(few.ok());
  EXPECT_EQ(few.message(), "--schedules-method dualpipev needs at least 2 x --pipeline-model-parallel-size = 8 "
                           "micro-batches per iteration (--global-batch-size / (--micro-batch-size x data-parallel "
                           "size)), found 7");
  Status one = check_dualpipev_microbatches(1, 8);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.message(), "--schedules-method dualpipev needs --pipeline-model-parallel-size >= 2, found 1");
}

}  // namespace
}  // namespace gale
