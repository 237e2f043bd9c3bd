// Beam search over a model's next-token log-probabilities (`gale generate --num-beams N`), with the
// rules of Megatron's text-generation beam search (MindSpeed-LLM's `beam_search` task).
//
// Beams hold the sum of their tokens' log-probabilities. The first step expands the prompt alone;
// every later step ranks all N·V (beam, token) extensions by that sum and walks the best 2N in
// order (ties: lower beam, then lower token first):
//   - a stop token (the tokenizer's eod, the chat template's end, --add-eos-token) is only taken from the first N ranks: it
//     ends that beam's sequence, which joins the finished hypotheses without the stop token and with
//     score sum / g^length_penalty, g = the tokens generated including the stop token;
//   - any other token continues a beam, until N beams are chosen.
// The hypotheses keep the N best scores. The search stops once N hypotheses are kept and the best
// candidate of the step, scored as if it ended there, is no better than the worst kept (Megatron's
// BeamHypotheses.is_done, early_stopping off), or after `max_new_tokens` steps; in the second case
// the open beams join the hypotheses too (g = the tokens generated). The result is the best-scoring
// hypothesis (the first added among equals).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace gale {

struct BeamSearchOptions {
  int64_t num_beams = 1;        // N ≥ 1
  int64_t max_new_tokens = 0;   // steps at most
  double length_penalty = 1.0;  // --length-penalty: the exponent of g in a hypothesis' score
  std::vector<int32_t> stop_tokens;  // the eod id (and --add-eos-token ids)
};

struct BeamSearchResult {
  std::vector<int32_t> tokens;  // the generated tokens (without the stop token)
  double score = 0.0;           // sum of log-probabilities / g^length_penalty
};

// The model side of the search. `start` returns the log-probabilities [V] of the token after the
// prompt. `advance(parents, tokens)` makes beam i the continuation of beam parents[i] by tokens[i]
// (beam 0 is the prompt alone before the first advance) and returns the log-probabilities of each
// new beam's next token, N rows of V. It is not called after the last step.
struct BeamModel {
  std::function<std::vector<double>()> start;
  std::function<std::vector<std::vector<double>>(const std::vector<int>& parents, const std::vector<int32_t>& tokens)>
      advance;
};

BeamSearchResult beam_search(const BeamSearchOptions& options, const BeamModel& model);

// log-softmax of logits[0, V) / temperature (temperature ≤ 0: 1), in double.
std::vector<double> log_softmax_row(const float* logits, int64_t V, double temperature);

}  // namespace gale
