// Text generation: load a checkpoint into one model, then sample token by token or run a beam search.
#include "train/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "core/rng.h"
#include "train/beam_search.h"
#include "train/inference_model.h"

namespace gale {

namespace {

struct GenerateArgs {
  std::string prompt;
  int64_t max_new_tokens = 128;
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  double top_p = 0.0;        // 0: no nucleus cut
  int64_t num_beams = 1;     // > 1: beam search (train/beam_search.h)
  double length_penalty = 1.0;
};

// Picks the next token from `logits` (over the tokenizer's vocabulary) with Philox draws.
int32_t sample(const float* logits, int64_t vocab, const GenerateArgs& g, uint64_t seed, uint64_t step) {
  if (g.temperature <= 0.0) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = g.top_k > 0 ? std::min(g.top_k, vocab) : vocab;
  std::vector<double> p(static_cast<size_t>(keep));
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) total += p[i] = std::exp((logits[order[i]] - logits[order[0]]) / g.temperature);
  if (g.top_p > 0.0) {
    double acc = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
      acc += p[i] / total;
      if (acc >= g.top_p) {
        keep = i + 1;
        break;
      }
    }
    total = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  double u = uniform_at(seed, 0x6e6, step) * total;
  for (int64_t i = 0; i < keep; ++i) {
    u -= p[i];
    if (u <= 0.0) return order[i];
  }
  return order[keep - 1];
}

// The prompt in one pass, then one token per step, each running only the new token against the keys
// and values cached so far (model/kv_cache.h); stops at the eod token or the last position.
std::vector<int32_t> sample_generate(const InferenceModel& m, const std::vector<int32_t>& prompt, const GenerateArgs& g,
                                     uint64_t seed) {
  std::vector<int32_t> out;
  KvCache cache = make_kv_cache(m.config, m.model->partition(), 1, m.config.max_positions);
  Tensor logits = m.next_logits(prompt, &cache);  // [new tokens, V]
  int64_t length = static_cast<int64_t>(prompt.size());
  for (int64_t step = 0; step < g.max_new_tokens && length < m.config.max_positions; ++step) {
    const float* last = logits.data<float>() + (logits.size(0) - 1) * m.config.vocab;
    const int32_t next = sample(last, m.tokenizer->vocab_size(), g, seed, static_cast<uint64_t>(step));
    if (next == m.tokenizer->eod()) break;
    out.push_back(next);
    if (++length >= m.config.max_positions || step + 1 == g.max_new_tokens) break;
    logits = m.next_logits(std::span<const int32_t>(&out.back(), 1), &cache);
  }
  return out;
}

// A cache holding `src`'s filled positions in storage of its own (a beam that branches off).
KvCache copy_kv_cache(const KvCache& src) {
  KvCache dst = src;
  for (Tensor& t : dst.layers) {
    if (!t.defined()) continue;
    const Tensor from = t;
    t = Tensor::empty(from.shape(), from.dtype());
    const int64_t rows = src.length * src.B;
    if (rows > 0) t.slice(0, rows).copy_from(from.slice(0, rows));
  }
  return dst;
}

// Beam search over the model: one KV cache per beam; a beam that continues another takes over its
// cache (the last beam to continue it) or a copy of it.
std::vector<int32_t> beam_generate(const InferenceModel& m, const std::vector<int32_t>& prompt, const GenerateArgs& g,
                                   double* score) {
  const int64_t vocab = m.tokenizer->vocab_size();
  BeamSearchOptions o;
  o.num_beams = g.num_beams;
  o.max_new_tokens = std::min(g.max_new_tokens, m.config.max_positions - static_cast<int64_t>(prompt.size()));
  o.length_penalty = g.length_penalty;
  o.stop_token = m.tokenizer->eod();
  std::vector<KvCache> caches;
  caches.push_back(make_kv_cache(m.config, m.model->partition(), 1, m.config.max_positions));
  BeamModel model;
  model.start = [&] {
    const Tensor logits = m.next_logits(prompt, &caches[0]);
    return log_softmax_row(logits.data<float>() + (logits.size(0) - 1) * m.config.vocab, vocab, g.temperature);
  };
  model.advance = [&](const std::vector<int>& parents, const std::vector<int32_t>& tokens) {
    std::vector<KvCache> next(parents.size());
    for (size_t i = 0; i < parents.size(); ++i) {
      const bool last_use = std::find(parents.begin() + static_cast<std::ptrdiff_t>(i) + 1, parents.end(), parents[i]) ==
                            parents.end();
      next[i] = last_use ? std::move(caches[parents[i]]) : copy_kv_cache(caches[parents[i]]);
    }
    caches = std::move(next);
    std::vector<std::vector<double>> rows;
    for (size_t i = 0; i < caches.size(); ++i) {
      const Tensor logits = m.next_logits(std::span<const int32_t>(&tokens[i], 1), &caches[i]);
      rows.push_back(log_softmax_row(logits.data<float>(), vocab, g.temperature));
    }
    return rows;
  };
  BeamSearchResult r = beam_search(o, model);
  *score = r.score;
  return r.tokens;
}

int usage(const Status& s) {
  std::fprintf(stderr, "gale generate: error: %s\n", s.message().c_str());
  return 2;
}

int failure(const Status& s) {
  std::fprintf(stderr, "gale generate: error: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int generate_main(int argc, char** argv) {
  ArgParser parser("gale generate", "Generate text from a checkpoint saved by `gale pretrain` (one process).");
  Arguments args;
  add_inference_model_args(parser, args);
  GenerateArgs g;
  int64_t seed = 1234;
  parser.group("generation");
  parser.add("--prompt", &g.prompt, "text to continue");
  parser.add("--max-new-tokens", &g.max_new_tokens, "tokens to generate");
  parser.add("--temperature", &g.temperature, "sampling temperature; 0 picks the most likely token (greedy)");
  parser.add("--top-k", &g.top_k, "sample among the k most likely tokens (0: all)");
  parser.add("--top-p", &g.top_p, "sample among the most likely tokens whose probabilities sum to p (0: off)");
  parser.add("--seed", &seed, "random seed of the sampling");
  parser.add("--num-beams", &g.num_beams, "beam search with this many beams (1: sample or greedy)");
  parser.add("--length-penalty", &g.length_penalty,
             "beam search: a finished sequence scores sum(log p) / length^this (1.0: the mean)");
  Status st = parser.parse(argc, argv);
  if (!st.ok()) return usage(st);
  if (parser.help_requested()) {
    std::printf("%s", parser.help_text().c_str());
    return 0;
  }
  if (g.max_new_tokens < 0) return usage(InvalidArgument("--max-new-tokens: expected a non-negative integer"));
  if (g.temperature < 0.0) return usage(InvalidArgument("--temperature: expected a non-negative number"));
  if (g.top_p < 0.0 || g.top_p > 1.0) return usage(InvalidArgument("--top-p: expected a value in [0, 1]"));
  if (g.num_beams < 1) return usage(InvalidArgument("--num-beams: expected a positive integer, found ", g.num_beams));
  if (g.num_beams > 1 && (g.top_k > 0 || g.top_p > 0.0))
    return usage(InvalidArgument("--num-beams ", g.num_beams, " with --top-k/--top-p: beam search with sampling ",
                                 "(MindSpeed-LLM's beam_search_with_sampling) is not implemented"));
  st = validate_inference_model_args(args, parser);
  if (!st.ok()) return usage(st);

  StatusOr<std::unique_ptr<InferenceModel>> loaded = load_inference_model(args, seed);
  if (!loaded.ok()) return failure(loaded.status());
  const InferenceModel& m = *loaded.value();
  const Tokenizer& tokenizer = *m.tokenizer;

  std::vector<int32_t> ids;
  st = tokenizer.encode(g.prompt, &ids);
  if (!st.ok()) return failure(st);
  if (ids.empty()) ids.push_back(tokenizer.eod());  // start a new document
  const size_t prompt_len = ids.size();
  if (static_cast<int64_t>(prompt_len) > m.config.max_positions)
    return failure(InvalidArgument("--prompt: ", prompt_len, " tokens, more than --max-position-embeddings ",
                                   m.config.max_positions));
  if (g.num_beams > 1 && 2 * g.num_beams >= tokenizer.vocab_size())
    return usage(InvalidArgument("--num-beams ", g.num_beams, ": expected fewer than half the vocabulary (",
                                 tokenizer.vocab_size(), " tokens)"));
  const auto start = std::chrono::steady_clock::now();
  double beam_score = 0.0;
  const std::vector<int32_t> generated = g.num_beams > 1 ? beam_generate(m, ids, g, &beam_score)
                                                         : sample_generate(m, ids, g, static_cast<uint64_t>(seed));
  ids.insert(ids.end(), generated.begin(), generated.end());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  StatusOr<std::string> text = tokenizer.decode(std::span<const int32_t>(ids.data(), ids.size()));
  if (!text.ok()) return failure(text.status());
  std::printf("%s\n", text.value().c_str());
  std::fprintf(stderr, "[%zu prompt tokens, %zu generated, %.1f tokens/s", prompt_len, ids.size() - prompt_len,
               static_cast<double>(ids.size() - prompt_len) / std::max(seconds, 1e-9));
  if (g.num_beams > 1) std::fprintf(stderr, ", %lld beams, score %.6f", static_cast<long long>(g.num_beams), beam_score);
  std::fprintf(stderr, "]\n");
  return 0;
}

}  // namespace gale
