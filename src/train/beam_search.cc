// Beam search with Megatron's hypothesis rules (see the header).
#include "train/beam_search.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace gale {

namespace {

// The finished sequences: the N best by score (Megatron's BeamHypotheses).
class Hypotheses {
 public:
  Hypotheses(int64_t n, double length_penalty) : n_(n), length_penalty_(length_penalty) {}

  void add(std::vector<int32_t> tokens, double sum_log_probs, int64_t generated) {
    const double score = sum_log_probs / std::pow(static_cast<double>(generated), length_penalty_);
    if (static_cast<int64_t>(kept_.size()) >= n_ && score <= worst_) return;
    kept_.push_back({score, std::move(tokens)});
    if (static_cast<int64_t>(kept_.size()) > n_) {
      // Drop the lowest score (the first of equals) and remember the next lowest.
      std::vector<size_t> order(kept_.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return kept_[a].score < kept_[b].score; });
      worst_ = kept_[order[1]].score;
      kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(order[0]));
    } else {
      worst_ = std::min(worst_, score);
    }
  }

  // No open beam can beat the kept ones: `best_sum` over `generated` tokens scores no better than the worst.
  bool done(double best_sum, int64_t generated) const {
    if (static_cast<int64_t>(kept_.size()) < n_) return false;
    return worst_ >= best_sum / std::pow(static_cast<double>(generated), length_penalty_);
  }

  BeamSearchResult best() const {
    GALE_CHECK(!kept_.empty());
    const auto it = std::max_element(kept_.begin(), kept_.end(),
                                     [](const Kept& a, const Kept& b) { return a.score < b.score; });
    return {it->tokens, it->score};
  }

 private:
  struct Kept {
    double score;
    std::vector<int32_t> tokens;
  };
  int64_t n_;
  double length_penalty_;
  double worst_ = 1e9;
  std::vector<Kept> kept_;
};

struct Candidate {
  double score;
  int beam;
  int32_t token;
};

}  // namespace

std::vector<double> log_softmax_row(const float* logits, int64_t V, double temperature) {
  const double t = temperature > 0.0 ? temperature : 1.0;
  const double mx = *std::max_element(logits, logits + V) / t;
  double sum = 0.0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[v] / t - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) out[v] = logits[v] / t - lse;
  return out;
}

BeamSearchResult beam_search(const BeamSearchOptions& o, const BeamModel& model) {
  GALE_CHECK_GE(o.num_beams, 1);
  const int N = static_cast<int>(o.num_beams);
  Hypotheses hyps(N, o.length_penalty);
  std::vector<std::vector<int32_t>> seqs(1);  // beam 0: nothing generated yet
  std::vector<double> sums(1, 0.0);
  std::vector<std::vector<double>> rows;
  if (o.max_new_tokens > 0) rows.push_back(model.start());
  bool done = false;
  int64_t step = 0;
  for (; step < o.max_new_tokens; ++step) {
    // Every extension of every open beam (only the prompt's at the first step), best first.
    std::vector<Candidate> cands;
    for (size_t b = 0; b < rows.size(); ++b)
      for (size_t v = 0; v < rows[b].size(); ++v)
        cands.push_back({sums[b] + rows[b][v], static_cast<int>(b), static_cast<int32_t>(v)});
    const size_t take = std::min(cands.size(), static_cast<size_t>(2 * N));
    std::partial_sort(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(take), cands.end(),
                      [](const Candidate& a, const Candidate& b) {
                        if (a.score != b.score) return a.score > b.score;
                        return a.beam != b.beam ? a.beam < b.beam : a.token < b.token;
                      });
    std::vector<Candidate> next;
    for (size_t rank = 0; rank < take && static_cast<int>(next.size()) < N; ++rank) {
      const Candidate& c = cands[rank];
      if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), c.token) != o.stop_tokens.end()) {
        if (rank < static_cast<size_t>(N)) hyps.add(seqs[c.beam], c.score, step + 1);
      } else {
        next.push_back(c);
      }
    }
    GALE_CHECK_EQ(static_cast<int>(next.size()), N) << "beam search: fewer than " << N << " continuations";
    done = hyps.done(cands[0].score, step + 1);
    std::vector<std::vector<int32_t>> new_seqs(N);
    std::vector<double> new_sums(N);
    std::vector<int> parents(N);
    std::vector<int32_t> tokens(N);
    for (int i = 0; i < N; ++i) {
      new_seqs[i] = seqs[next[i].beam];
      new_seqs[i].push_back(next[i].token);
      new_sums[i] = next[i].score;
      parents[i] = next[i].beam;
      tokens[i] = next[i].token;
    }
    seqs = std::move(new_seqs);
    sums = std::move(new_sums);
    if (done) break;
    if (step + 1 < o.max_new_tokens) rows = model.advance(parents, tokens);
  }
  if (!done) {
    const int64_t generated = std::min(step, o.max_new_tokens);
    for (size_t b = 0; b < seqs.size(); ++b) hyps.add(seqs[b], sums[b], std::max<int64_t>(generated, 1));
  }
  return hyps.best();
}

}  // namespace gale
