// Pipeline step orders: Gale's 1F1B and interleaved orders equal the orders recorded from
// Megatron-Core's own schedules (tests/data/schedule/megatron_order.json, written by
// tools/reference/pipeline_order.py), every order completes when all ranks run it against each
// other's data dependencies (no deadlock), and 1F1B keeps at most P − r micro-batches in flight.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "schedule/pipeline_order.h"
#include "schedule/pipeline_p2p.h"

namespace gale {
namespace {

struct OrderCase {
  int pp = 1, vpp = 0;  // vpp 0: no interleaving
  int64_t num_microbatches = 0;
  int64_t group = 0;  // --microbatch-group-size-per-virtual-pipeline-stage; 0: the default (pp)
  bool forward_only = false;
  std::vector<std::vector<std::string>> ranks;
  std::string name() const {
    return str_cat("pp", pp, vpp ? str_cat("_vpp", vpp) : "", "_m", num_microbatches, group ? str_cat("_g", group) : "",
                   forward_only ? "_fwd" : "");
  }
};

std::vector<OrderCase> megatron_cases() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/schedule/megatron_order.json");
  EXPECT_TRUE(in.good()) << "tests/data/schedule/megatron_order.json is missing";
  std::vector<OrderCase> cases;
  if (!in.good()) return cases;
  for (const auto& j : nlohmann::json::parse(in)) {
    OrderCase c;
    c.pp = j.at("pp").get<int>();
    c.vpp = j.at("vpp").is_null() ? 0 : j.at("vpp").get<int>();
    c.num_microbatches = j.at("num_microbatches").get<int64_t>();
    c.forward_only = j.at("forward_only").get<bool>();
    if (j.contains("microbatch_group_size") && !j.at("microbatch_group_size").is_null())
      c.group = j.at("microbatch_group_size").get<int64_t>();
    c.ranks = j.at("ranks").get<std::vector<std::vector<std::string>>>();
    cases.push_back(c);
  }
  return cases;
}

std::vector<PipelineStep> gale_order(int pp, int vpp, int rank, int64_t num_microbatches, bool forward_only,
                                     int64_t group = 0) {
  return vpp == 0 ? one_f_one_b_order(pp, rank, num_microbatches, forward_only)
                  : interleaved_order(pp, rank, vpp, num_microbatches, forward_only, group);
}

TEST(PipelineOrder, MatchesMegatronSchedules) {
  std::vector<OrderCase> cases = megatron_cases();
  ASSERT_GE(cases.size(), 15u);
  int interleaved = 0, grouped = 0;
  for (const OrderCase& c : cases) {
    grouped += c.group != 0 && c.group != c.pp;
    ASSERT_EQ(static_cast<int>(c.ranks.size()), c.pp) << c.name();
    interleaved += c.vpp > 0;
    for (int r = 0; r < c.pp; ++r) {
      std::vector<std::string> got;
      for (const PipelineStep& s : gale_order(c.pp, c.vpp, r, c.num_microbatches, c.forward_only, c.group))
        got.push_back(s.to_string());
      EXPECT_EQ(got, c.ranks[static_cast<size_t>(r)]) << c.name() << ", pipeline rank " << r;
    }
  }
  EXPECT_GE(interleaved, 5);
  EXPECT_GE(grouped, 5);  // micro-batch groups larger than P, with and without a short last group
}

TEST(PipelineOrder, MicrobatchGroupRulesAreMegatrons) {
  EXPECT_TRUE(check_interleaved_microbatches(2, 4).ok());
  EXPECT_FALSE(check_interleaved_microbatches(2, 5).ok());     // default G = P: M must be a multiple
  EXPECT_TRUE(check_interleaved_microbatches(2, 5, 3).ok());   // last group 2 >= P
  EXPECT_FALSE(check_interleaved_microbatches(3, 7, 5).ok());  // last group 2 < P = 3
  EXPECT_FALSE(check_interleaved_microbatches(4, 8, 2).ok());  // G < P
  EXPECT_FALSE(check_interleaved_microbatches(2, 4, 5).ok());  // G > M
  Status s = check_interleaved_microbatches(3, 7, 5);
  EXPECT_NE(s.message().find("leaves a last group of 2 micro-batches"), std::string::npos) << s.message();
}

// Runs every rank's order against the data dependencies between virtual stages (stage s = c·P + r:
// forward (s, m) needs forward (s − 1, m); backward (s, m) needs backward (s + 1, m), and the
// last stage's backward its own forward), one step at a time on whichever rank can proceed.
// Returns false if the ranks stall with steps left (a deadlock with blocking receives).
// `max_in_flight[r]` gets the most micro-batches rank r held between forward and backward.
bool simulate(int pp, int vpp, int64_t num_microbatches, bool forward_only, std::vector<int64_t>* max_in_flight,
              int64_t group = 0) {
  const int chunks = std::max(vpp, 1);
  std::vector<std::vector<PipelineStep>> orders;
  for (int r = 0; r < pp; ++r) orders.push_back(gale_order(pp, vpp, r, num_microbatches, forward_only, group));
  std::set<std::tuple<bool, int, int64_t>> done;  // (forward, virtual stage, micro-batch)
  std::vector<size_t> next(static_cast<size_t>(pp), 0);
  std::vector<int64_t> held(static_cast<size_t>(pp), 0);
  max_in_flight->assign(static_cast<size_t>(pp), 0);
  const int last_stage = pp * chunks - 1;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      auto& i = next[static_cast<size_t>(r)];
      if (i == orders[static_cast<size_t>(r)].size()) continue;
      const PipelineStep& s = orders[static_cast<size_t>(r)][i];
      const int stage = s.chunk * pp + r;
      bool ready = s.forward ? (stage == 0 || done.count({true, stage - 1, s.microbatch}))
                             : done.count({true, stage, s.microbatch}) &&
                                   (stage == last_stage || done.count({false, stage + 1, s.microbatch}));
      if (!ready) continue;
      done.insert({s.forward, stage, s.microbatch});
      int64_t& h = held[static_cast<size_t>(r)];
      if (!forward_only) h += s.forward ? 1 : -1;
      (*max_in_flight)[static_cast<size_t>(r)] = std::max((*max_in_flight)[static_cast<size_t>(r)], h);
      ++i;
      progress = true;
    }
  }
  for (int r = 0; r < pp; ++r)
    if (next[static_cast<size_t>(r)] != orders[static_cast<size_t>(r)].size()) return false;
  return true;
}

TEST(PipelineOrder, EveryOrderCompletesWithoutDeadlock) {
  std::vector<int64_t> held;
  for (int pp : {2, 3, 4, 8})
    for (int vpp : {0, 2, 3})
      for (int64_t m : {1, 2, 3, 4, 6, 8, 12, 16})
        for (bool fwd : {false, true}) {
          if (vpp > 0 && !check_interleaved_microbatches(pp, m).ok()) continue;
          EXPECT_TRUE(simulate(pp, vpp, m, fwd, &held)) << "pp " << pp << " vpp " << vpp << " m " << m;
        }
  for (int pp : {2, 3, 4})
    for (int vpp : {2, 3})
      for (int64_t m : {4, 5, 6, 7, 9, 12})
        for (int64_t g = pp; g <= m; ++g) {
          if (!check_interleaved_microbatches(pp, m, g).ok()) continue;
          EXPECT_TRUE(simulate(pp, vpp, m, false, &held, g)) << "pp " << pp << " vpp " << vpp << " m " << m << " g " << g;
        }
}

TEST(PipelineOrder, OneFOneBHoldsAtMostPipelineSizeMinusRankMicroBatches) {
  std::vector<int64_t> held;
  for (int pp : {2, 3, 4, 8})
    for (int64_t m : {1, 3, 4, 8, 16}) {
      ASSERT_TRUE(simulate(pp, 0, m, false, &held));
      for (int r = 0; r < pp; ++r)
        EXPECT_EQ(held[static_cast<size_t>(r)], std::min<int64_t>(pp - r, m)) << pp << " " << m;
    }
  // Interleaved: Megatron's warm-up plus one.
  for (int pp : {2, 4})
    for (int vpp : {2, 3}) {
      const int64_t m = 4 * pp;
      ASSERT_TRUE(simulate(pp, vpp, m, false, &held));
      for (int r = 0; r < pp; ++r)
        EXPECT_EQ(held[static_cast<size_t>(r)], std::min(interleaved_warmup(pp, r, vpp, m, false) + 1, m * vpp));
    }
}

TEST(PipelineOrder, EveryStepRunsOnceAndBackwardFollowsForward) {
  for (int pp : {2, 4})
    for (int vpp : {0, 2})
      for (int r = 0; r < pp; ++r) {
        std::vector<PipelineStep> steps = gale_order(pp, vpp, r, 8, false);
        const int chunks = std::max(vpp, 1);
        ASSERT_EQ(steps.size(), static_cast<size_t>(2 * 8 * chunks));
        std::set<std::tuple<bool, int, int64_t>> seen;
        for (const PipelineStep& s : steps) {
          EXPECT_TRUE(seen.insert({s.forward, s.chunk, s.microbatch}).second) << s.to_string();
          if (!s.forward) {
            EXPECT_TRUE(seen.count({true, s.chunk, s.microbatch})) << s.to_string();
          }
        }
      }
}

TEST(PipelineOrder, InterleavedNeedsAMultipleOfThePipelineSize) {
  EXPECT_TRUE(check_interleaved_microbatches(4, 8).ok());
  EXPECT_TRUE(check_interleaved_microbatches(2, 2).ok());
  for (int64_t m : {1, 2, 6}) {
    Status s = check_interleaved_microbatches(4, m);
    EXPECT_FALSE(s.ok()) << m;
    EXPECT_NE(s.message().find(str_cat("= ", m, ") to be a multiple of --pipeline-model-parallel-size 4")),
              std::string::npos)
        << s.message();
  }
}

TEST(PipelineP2P, TagsDistinguishDirectionStageAndMicroBatch) {
  std::set<int> tags;
  for (bool fwd : {true, false})
    for (int stage = 0; stage < 8; ++stage)
      for (int64_t m = 0; m < 64; ++m) EXPECT_TRUE(tags.insert(PipelineP2P::tag(fwd, stage, m, 8)).second);
  for (int64_t m = 0; m < 100000; m += 997) {
    int t = PipelineP2P::tag(false, 7, m, 8);
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 32768);
  }
}

}  // namespace
}  // namespace gale
