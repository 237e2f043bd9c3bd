// Beam search on hand-made next-token tables: results worked out by hand, N = 1 against greedy
// decoding with a stop token, and the stop-token rules.
#include "train/beam_search.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

namespace gale {
namespace {

// A model whose next-token probabilities depend on the last token only (-1: the prompt).
struct MarkovModel {
  std::map<int32_t, std::vector<double>> next;  // last token -> probabilities [V]
  int advances = 0;

  std::vector<double> log_row(int32_t last) const {
    std::vector<double> r;
    for (double p : next.at(last)) r.push_back(std::log(p));
    return r;
  }

  BeamModel model() {
    BeamModel m;
    m.start = [this] { return log_row(-1); };
    m.advance = [this](const std::vector<int>&, const std::vector<int32_t>& tokens) {
      ++advances;
      std::vector<std::vector<double>> rows;
      for (int32_t t : tokens) rows.push_back(log_row(t));
      return rows;
    };
    return m;
  }
};

BeamSearchOptions options(int64_t beams, int64_t steps, int32_t stop = -1, double length_penalty = 1.0) {
  BeamSearchOptions o;
  o.num_beams = beams;
  o.max_new_tokens = steps;
  if (stop >= 0) o.stop_tokens = {stop};
  o.length_penalty = length_penalty;
  return o;
}

// Greedy takes 0 (0.5) and then at best 0.3: 0.15; two beams find 1 (0.4) then 2 (0.9): 0.36.
TEST(BeamSearch, FindsTheLikelierSequenceGreedyMisses) {
  MarkovModel mm;
  mm.next[-1] = {0.5, 0.4, 0.05, 0.05};
  mm.next[0] = {0.3, 0.25, 0.25, 0.2};
  mm.next[1] = {0.05, 0.025, 0.9, 0.025};
  mm.next[2] = mm.next[3] = {0.25, 0.25, 0.25, 0.25};
  BeamSearchResult one = beam_search(options(1, 2), mm.model());
  EXPECT_EQ(one.tokens, (std::vector<int32_t>{0, 0}));
  EXPECT_NEAR(one.score, std::log(0.15) / 2, 1e-12);
  BeamSearchResult two = beam_search(options(2, 2), mm.model());
  EXPECT_EQ(two.tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(two.score, std::log(0.36) / 2, 1e-12);
}

// The stop token (3) is the likeliest first token: it finishes the empty sequence with log 0.6
// (one generated token). The open beams end at [0, 2] (log 0.27 over 2 tokens, −0.65 per token):
// the empty sequence wins at length penalty 1, [0, 2] at length penalty 2 (−1.31 / 4 = −0.33).
TEST(BeamSearch, StopTokenEndsAHypothesisScoredWithItsLength) {
  MarkovModel mm;
  mm.next[-1] = {0.3, 0.1, 0.0001, 0.5999};
  mm.next[0] = {0.04, 0.03, 0.9, 0.03};
  mm.next[1] = {0.25, 0.25, 0.25, 0.25};
  mm.next[2] = {0.25, 0.25, 0.25, 0.25};
  BeamSearchResult r = beam_search(options(2, 2, 3), mm.model());
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_NEAR(r.score, std::log(0.5999), 1e-12);
  r = beam_search(options(2, 2, 3, 2.0), mm.model());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(r.score, std::log(0.3 * 0.9) / 4, 1e-12);
}

// A model whose next-token probabilities depend on the whole generated prefix (`fallback` for
// prefixes not listed); it follows the beams through `advance`'s parents.
struct PrefixModel {
  std::map<std::vector<int32_t>, std::vector<double>> next;
  std::vector<double> fallback;
  std::vector<std::vector<int32_t>> beams{{}};

  std::vector<double> log_row(const std::vector<int32_t>& prefix) const {
    auto it = next.find(prefix);
    std::vector<double> r;
    for (double p : it == next.end() ? fallback : it->second) r.push_back(std::log(p));
    return r;
  }

  BeamModel model() {
    BeamModel m;
    m.start = [this] { return log_row({}); };
    m.advance = [this](const std::vector<int>& parents, const std::vector<int32_t>& tokens) {
      std::vector<std::vector<int32_t>> grown;
      std::vector<std::vector<double>> rows;
      for (size_t i = 0; i < parents.size(); ++i) {
        grown.push_back(beams.at(static_cast<size_t>(parents[i])));
        grown.back().push_back(tokens[i]);
        rows.push_back(log_row(grown.back()));
      }
      beams = grown;
      return rows;
    };
    return m;
  }
};

// Two beams, stop token 3. Step 1: [0] .5, stop .3 (rank 1: the hypothesis [] at log .3), [1] .15.
// Step 2: [0, stop] .35 (rank 0: [0] at log(.35)/2 = −0.525), [0, 1] .149, [1, stop] .12 at rank 2:
// not a hypothesis (it would score −1.06 and replace [] as the worst kept, −1.204), [1, 0] .03.
// Step 3: the best candidate [0, 1, 0] scores log(.149·.25)/3 = −1.097, which would end the search
// against −1.06 but not against −1.204; then t0 is almost sure, and after 8 tokens
// [0, 1, 0, 0, 0, 0, 0, 0] scores ≈ −0.41, better than [0]'s −0.525.
TEST(BeamSearch, StopTokenCountsOnlyFromTheFirstNRanks) {
  PrefixModel pm;
  pm.next[{}] = {0.5, 0.15, 0.05, 0.3};
  pm.next[{0}] = {0.001, 0.298, 0.001, 0.7};
  pm.next[{1}] = {0.2, 0.0001, 0.0001, 0.7998};
  pm.next[{0, 1}] = {0.25, 0.25, 0.25, 0.25};
  pm.fallback = {0.997, 0.001, 0.001, 0.001};
  BeamSearchResult r = beam_search(options(2, 8, 3), pm.model());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{0, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_NEAR(r.score, (std::log(0.5 * 0.298 * 0.25) + 5 * std::log(0.997)) / 8, 1e-12);
}

// With one beam the stop token at rank 0 ends the search at once: no hypothesis can beat it.
TEST(BeamSearch, StopTokenFirstEndsTheSearch) {
  MarkovModel stop_first;
  stop_first.next[-1] = {0.2, 0.1, 0.1, 0.6};
  BeamSearchResult r = beam_search(options(1, 5, 3), stop_first.model());
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_NEAR(r.score, std::log(0.6), 1e-12);
  EXPECT_EQ(stop_first.advances, 0);
}

// Once N hypotheses are finished and no open beam can beat the worst of them, the search stops
// before max_new_tokens.
TEST(BeamSearch, StopsEarlyWhenNoOpenBeamCanWin) {
  MarkovModel mm;
  mm.next[-1] = {0.45, 0.45, 0.05, 0.05};
  mm.next[0] = mm.next[1] = {0.005, 0.005, 0.0, 0.99};  // both beams stop next (3 = stop)
  mm.next[0][2] = 0.0;
  mm.next[2] = {0.25, 0.25, 0.25, 0.25};
  for (auto& [last, row] : mm.next)
    for (double& p : row) p = std::max(p, 1e-9);
  BeamSearchResult r = beam_search(options(2, 50, 3), mm.model());
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{0}));
  EXPECT_EQ(mm.advances, 1);
}

// One beam is greedy decoding that stops at the stop token, on random tables.
TEST(BeamSearch, OneBeamIsGreedyWithAStopToken) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0.01, 1.0);
  for (int trial = 0; trial < 20; ++trial) {
    const int V = 6, stop = 5;
    MarkovModel mm;
    for (int last = -1; last < V; ++last) {
      std::vector<double> row(V);
      double sum = 0;
      for (double& p : row) sum += p = u(rng);
      for (double& p : row) p /= sum;
      mm.next[last] = row;
    }
    std::vector<int32_t> greedy;
    int32_t last = -1;
    double total = 0;
    for (int step = 0; step < 8; ++step) {
      const std::vector<double>& row = mm.next[last];
      const int32_t t = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      total += std::log(row[t]);
      if (t == stop) break;
      greedy.push_back(t);
      last = t;
    }
    const int64_t generated = std::min<int64_t>(static_cast<int64_t>(greedy.size()) + 1, 8);
    BeamSearchResult r = beam_search(options(1, 8, stop), mm.model());
    EXPECT_EQ(r.tokens, greedy) << trial;
    EXPECT_NEAR(r.score, total / static_cast<double>(generated), 1e-12) << trial;
  }
}

TEST(BeamSearch, LogSoftmaxRowWithTemperature) {
  const float logits[3] = {1.0f, 2.0f, 4.0f};
  std::vector<double> r = log_softmax_row(logits, 3, 2.0);
  const double lse = std::log(std::exp(0.5) + std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(r[0], 0.5 - lse, 1e-12);
  EXPECT_NEAR(r[2], 2.0 - lse, 1e-12);
  EXPECT_EQ(log_softmax_row(logits, 3, 0.0), log_softmax_row(logits, 3, 1.0));
}

}  // namespace
}  // namespace gale
