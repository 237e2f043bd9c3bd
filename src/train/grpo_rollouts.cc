// GRPO's rollout collection: prompt draws, generation, rewards, advantages and rows (train/grpo_rollouts.h).
#include "train/grpo_rollouts.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "train/grpo_loss.h"
#include "train/inference_engine.h"

namespace gale {

namespace {

constexpr uint64_t kPromptStream = 0x4752504f00000000ull;  // "GRPO" + the collection's iteration
constexpr uint64_t kSampleStream = 0x4752504e00000000ull;

}  // namespace

double GrpoRollouts::reward_mean() const {
  if (rewards.empty()) return 0.0;
  return std::accumulate(rewards.begin(), rewards.end(), 0.0) / static_cast<double>(rewards.size());
}

double GrpoRollouts::reward_std() const {
  if (rewards.empty()) return 0.0;
  const double m = reward_mean();
  double v = 0.0;
  for (double r : rewards) v += (r - m) * (r - m);
  return std::sqrt(v / static_cast<double>(rewards.size()));
}

int32_t grpo_sample_token(const float* logits, int64_t vocab, const GrpoSampling& s, uint64_t stream,
                          uint64_t index) {
  if (s.temperature <= 0.0) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = s.top_k > 0 ? std::min(s.top_k, vocab) : vocab;
  std::vector<double> p(static_cast<size_t>(keep));
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i)
    total += p[i] = std::exp((static_cast<double>(logits[order[i]]) - logits[order[0]]) / s.temperature);
  if (s.top_p > 0.0) {
    double acc = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
      acc += p[i] / total;
      if (acc >= s.top_p) {
        keep = i + 1;
        break;
      }
    }
    total = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  double u = static_cast<double>(uniform_at(s.seed, stream, index)) * total;
  for (int64_t i = 0; i < keep; ++i) {
    u -= p[i];
    if (u <= 0.0) return order[i];
  }
  return order[keep - 1];
}

Status grpo_prompt_ids(const Tokenizer& tokenizer, std::string_view prompt, bool skip_bos_token,
                       std::vector<int32_t>* ids) {
  std::vector<int32_t> text;
  GALE_RETURN_IF_ERROR(tokenizer.encode(prompt, &text));
  const int32_t bos = tokenizer.bos();
  size_t start = 0;
  while (bos >= 0 && start < text.size() && text[start] == bos) ++start;
  ids->clear();
  if (!skip_bos_token && bos >= 0) ids->push_back(bos);
  ids->insert(ids->end(), text.begin() + static_cast<std::ptrdiff_t>(start), text.end());
  return Status::Ok();
}

StatusOr<GrpoRollouts> collect_grpo_rollouts(GPTModel& policy, const Tokenizer& tokenizer, const RlEnvironment& env,
                                             const GrpoArgs& g, int64_t seq_length, uint64_t seed,
                                             int64_t iteration) {
  const int64_t P = g.grpo_prompts_per_step, G = g.grpo_group_size;
  const int64_t N = static_cast<int64_t>(env.prompts.size());
  const int32_t eod = tokenizer.eod();
  const int32_t pad = tokenizer.pad() >= 0 ? tokenizer.pad() : eod;
  const int64_t max_length = std::min<int64_t>(seq_length, policy.config().max_positions);
  GrpoSampling sampling{seed, g.rl_default_temperature, g.rl_default_top_k, g.rl_default_top_p};
  const int64_t vocab = tokenizer.vocab_size();
  const uint64_t stream = kSampleStream + static_cast<uint64_t>(iteration);
  int64_t draws = 0;

  GrpoRollouts out;
  out.seq_length = seq_length;
  std::vector<std::vector<int32_t>> kept_prompts, kept_completions;
  std::vector<int64_t> kept_index;
  std::vector<std::vector<double>> kept_rewards;
  int64_t attempts = 0;
  int64_t request_base = 0;  // completions generated so far in this collection (sampling indices)
  std::vector<std::vector<double>> kept_logprobs;  // per kept completion: each generated token's inference log-prob
  const int64_t model_vocab = policy.config().vocab;
  while (static_cast<int64_t>(kept_rewards.size()) < P) {
    const int64_t need = P - static_cast<int64_t>(kept_rewards.size());
    attempts += need;
    if (attempts > 100 * P)
      return FailedPrecondition("--grpo-filter-groups-with-same-reward: ", attempts - need,
                                " prompts drawn for the collection at iteration ", iteration, " and only ", kept_rewards.size(), " of ",
                                P, " groups had different rewards (expected an environment whose rewards vary)");
    std::vector<int64_t> index(static_cast<size_t>(need));
    std::vector<std::vector<int32_t>> prompt_ids(static_cast<size_t>(need));
    std::vector<std::vector<int32_t>> requests;
    for (int64_t i = 0; i < need; ++i) {
      const double u = uniform_at(seed, kPromptStream + static_cast<uint64_t>(iteration), static_cast<uint64_t>(draws++));
      index[i] = std::min<int64_t>(N - 1, static_cast<int64_t>(u * static_cast<double>(N)));
      GALE_RETURN_IF_ERROR(grpo_prompt_ids(tokenizer, env.prompts[index[i]].prompt, g.rl_skip_bos_token, &prompt_ids[i]));
      if (prompt_ids[i].empty() || static_cast<int64_t>(prompt_ids[i].size()) >= max_length)
        return InvalidArgument(env.data_path, ": prompt ", index[i] + 1, " has ", prompt_ids[i].size(),
                               " tokens; expected 1 to ", max_length - 1,
                               " (shorter than --seq-length and --max-position-embeddings)");
      for (int64_t k = 0; k < G; ++k) requests.push_back(prompt_ids[i]);
    }
    EngineOptions o;
    o.max_requests = static_cast<int64_t>(requests.size());
    o.kv_length = max_length;
    o.max_length = max_length;
    o.max_new_tokens = env.max_new_tokens > 0 ? env.max_new_tokens : max_length;
    o.stop_tokens = {eod};
    std::vector<std::vector<double>> logprobs(requests.size());
    o.sample = [&](const float* logits, int64_t request, int64_t step) {
      const int32_t token =
          grpo_sample_token(logits, vocab, sampling, stream,
                            (static_cast<uint64_t>(request_base + request) << 20) + static_cast<uint64_t>(step));
      // The raw log-softmax of the drawn token (Megatron's "raw_logprobs").
      const double top = *std::max_element(logits, logits + model_vocab);
      double sum = 0.0;
      for (int64_t v = 0; v < model_vocab; ++v) sum += std::exp(static_cast<double>(logits[v]) - top);
      std::vector<double>& lp = logprobs[static_cast<size_t>(request)];
      if (static_cast<int64_t>(lp.size()) <= step) lp.resize(static_cast<size_t>(step + 1), 0.0);
      lp[static_cast<size_t>(step)] = static_cast<double>(logits[token]) - top - std::log(sum);
      return token;
    };
    GALE_ASSIGN_OR_RETURN(const EngineResult r, run_inference_engine(policy, requests, o));
    request_base += static_cast<int64_t>(requests.size());
    for (int64_t i = 0; i < need; ++i) {
      std::vector<double> rewards;
      for (int64_t k = 0; k < G; ++k) {
        const std::vector<int32_t>& gen = r.generated[static_cast<size_t>(i * G + k)];
        std::vector<int32_t> text_ids = gen;
        if (!text_ids.empty() && text_ids.back() == eod) text_ids.pop_back();
        GALE_ASSIGN_OR_RETURN(const std::string text, tokenizer.decode(text_ids));
        rewards.push_back(env.reward(index[i], text));
      }
      if (g.grpo_filter_groups_with_same_reward) {  // Megatron: np.std(rewards) <= 1e-6
        const double m = std::accumulate(rewards.begin(), rewards.end(), 0.0) / static_cast<double>(G);
        double v = 0.0;
        for (double x : rewards) v += (x - m) * (x - m);
        if (std::sqrt(v / static_cast<double>(G)) <= 1e-6) {
          ++out.filtered_groups;
          continue;
        }
      }
      if (static_cast<int64_t>(kept_rewards.size()) == P) break;
      kept_rewards.push_back(rewards);
      kept_index.push_back(index[i]);
      kept_prompts.push_back(prompt_ids[i]);
      for (int64_t k = 0; k < G; ++k) {
        kept_completions.push_back(r.generated[static_cast<size_t>(i * G + k)]);
        kept_logprobs.push_back(logprobs[static_cast<size_t>(i * G + k)]);
      }
    }
  }
  const std::vector<double> adv = grpo_advantages(kept_rewards);
  const int64_t R = P * G, S = seq_length;
  out.rows = R;
  out.tokens.assign(static_cast<size_t>(R * S), pad);
  out.loss_mask.assign(static_cast<size_t>(R * S), 0.0f);
  out.inference_logprobs.assign(static_cast<size_t>(R * S), 0.0);
  for (int64_t row = 0; row < R; ++row) {
    const std::vector<int32_t>& prompt = kept_prompts[static_cast<size_t>(row / G)];
    const std::vector<int32_t>& completion = kept_completions[static_cast<size_t>(row)];
    const int64_t np = static_cast<int64_t>(prompt.size()), nc = static_cast<int64_t>(completion.size());
    GALE_CHECK_LE(np + nc, S) << "a rollout longer than --seq-length";
    int32_t* t = out.tokens.data() + row * S;
    std::copy(prompt.begin(), prompt.end(), t);
    std::copy(completion.begin(), completion.end(), t + np);
    float* m = out.loss_mask.data() + row * S;
    const std::vector<double>& lp = kept_logprobs[static_cast<size_t>(row)];
    GALE_CHECK_GE(static_cast<int64_t>(lp.size()), nc) << "a generated token without its inference log-probability";
    for (int64_t s = np; s < np + nc; ++s) {  // token s generated -> the position predicting it, s - 1
      if (t[s] != pad) m[s - 1] = 1.0f;
      out.inference_logprobs[static_cast<size_t>(row * S + s - 1)] = lp[static_cast<size_t>(s - np)];
    }
    out.rewards.push_back(kept_rewards[static_cast<size_t>(row / G)][static_cast<size_t>(row % G)]);
    out.advantages.push_back(adv[static_cast<size_t>(row)]);
    out.prompt_index.push_back(kept_index[static_cast<size_t>(row / G)]);
    out.completion_tokens.push_back(nc);
  }
  return out;
}

}  // namespace gale
