// GRPO's pass@k evaluation over the environment's first --rl-prompts-per-eval prompts (train/grpo_eval.h).
#include "train/grpo_eval.h"

#include <algorithm>
#include <cstdio>

#include "core/check.h"
#include "train/grpo_rollouts.h"
#include "train/inference_engine.h"

namespace gale {

namespace {

constexpr uint64_t kEvalStream = 0x4752504500000000ull;  // "GRPE" + the iteration

// The completions of `requests` (prompt ids) under `sampling`, request r's step t drawing index
// (r << 20) + t of `stream`, and each one's reward for its environment prompt `index[r]`; at most
// `batch` requests are decoded together (static batching: the same tokens as all at once).
StatusOr<std::vector<double>> rewards_of(GPTModel& policy, const Tokenizer& tokenizer, const RlEnvironment& env,
                                         const std::vector<std::vector<int32_t>>& requests,
                                         const std::vector<int64_t>& index, const GrpoSampling& sampling,
                                         uint64_t stream, int64_t max_length, int64_t batch) {
  const int32_t eod = tokenizer.eod();
  const int64_t vocab = tokenizer.vocab_size();
  EngineOptions o;
  o.max_requests = std::min<int64_t>(batch, static_cast<int64_t>(requests.size()));
  o.kv_length = max_length;
  o.max_length = max_length;
  o.max_new_tokens = env.max_new_tokens > 0 ? env.max_new_tokens : max_length;
  o.stop_tokens = {eod};
  o.sample = [&](const float* logits, int64_t request, int64_t step) {
    return grpo_sample_token(logits, vocab, sampling, stream,
                             (static_cast<uint64_t>(request) << 20) + static_cast<uint64_t>(step));
  };
  GALE_ASSIGN_OR_RETURN(const EngineResult r, run_inference_engine(policy, requests, o));
  std::vector<double> rewards;
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<int32_t> ids = r.generated[i];
    if (!ids.empty() && ids.back() == eod) ids.pop_back();
    GALE_ASSIGN_OR_RETURN(const std::string text, tokenizer.decode(ids));
    rewards.push_back(env.reward(index[i], text));
  }
  return rewards;
}

std::string fixed4(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%0.4f", v);
  return buf;
}

}  // namespace

double pass_at_k(int64_t n, int64_t c, int64_t k) {
  GALE_CHECK(n >= 0 && c >= 0 && c <= n && k >= 1 && k <= n) << "pass@k with n " << n << ", c " << c << ", k " << k;
  if (n - c < k) return 1.0;
  double prod = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) prod *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  return 1.0 - prod;
}

StatusOr<GrpoEvaluation> evaluate_grpo(GPTModel& policy, const Tokenizer& tokenizer, const RlEnvironment& env,
                                       const GrpoArgs& g, int64_t seq_length, uint64_t seed, int64_t iteration) {
  const int64_t K = std::min<int64_t>(g.rl_prompts_per_eval, static_cast<int64_t>(env.prompts.size()));
  const int64_t n = env.max_k;
  const int64_t max_length = std::min<int64_t>(seq_length, policy.config().max_positions);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(K)), sampled, greedy;
  std::vector<int64_t> sampled_index, greedy_index;
  for (int64_t p = 0; p < K; ++p) {  // Megatron: the first num_prompts prompts
    GALE_RETURN_IF_ERROR(grpo_prompt_ids(tokenizer, env.prompts[p].prompt, g.rl_skip_bos_token, &prompts[p]));
    if (prompts[p].empty() || static_cast<int64_t>(prompts[p].size()) >= max_length)
      return InvalidArgument(env.data_path, ": prompt ", p + 1, " has ", prompts[p].size(), " tokens; expected 1 to ",
                             max_length - 1, " (shorter than --seq-length and --max-position-embeddings)");
    for (int64_t j = 0; j < n; ++j) {
      sampled.push_back(prompts[p]);
      sampled_index.push_back(p);
    }
    greedy.push_back(prompts[p]);
    greedy_index.push_back(p);
  }
  const uint64_t stream = kEvalStream + static_cast<uint64_t>(iteration);
  const int64_t batch = g.grpo_prompts_per_step * g.grpo_group_size;  // a rollout collection's KV at most
  const GrpoSampling sampling{seed, g.rl_default_temperature, g.rl_default_top_k, g.rl_default_top_p};
  GALE_ASSIGN_OR_RETURN(const std::vector<double> rs,
                        rewards_of(policy, tokenizer, env, sampled, sampled_index, sampling, stream, max_length, batch));
  const GrpoSampling argmax{seed, 0.0, 1, 0.0};  // Megatron's greedy pass: top_k 1, temperature 0
  GALE_ASSIGN_OR_RETURN(const std::vector<double> rg,
                        rewards_of(policy, tokenizer, env, greedy, greedy_index, argmax, stream, max_length, batch));
  std::vector<int64_t> ks = {1};
  if (n > 1) ks.push_back(n);
  std::vector<double> sums(ks.size(), 0.0);
  double greedy_sum = 0.0;
  for (int64_t p = 0; p < K; ++p) {
    int64_t c = 0;
    for (int64_t j = 0; j < n; ++j) c += rs[static_cast<size_t>(p * n + j)] == 1.0;
    for (size_t i = 0; i < ks.size(); ++i) sums[i] += pass_at_k(n, c, ks[i]);
    greedy_sum += rg[static_cast<size_t>(p)];
  }
  GrpoEvaluation e;
  e.prompts = K;
  e.samples_per_prompt = n;
  const double denom = static_cast<double>(std::max<int64_t>(K, 1));
  for (size_t i = 0; i < ks.size(); ++i)
    e.metrics.emplace_back(env.kind + "_eval_mean_pass_at_" + std::to_string(ks[i]), sums[i] / denom);
  e.metrics.emplace_back(env.kind + "_eval_mean_greedy_reward", greedy_sum / denom);
  return e;
}

std::string format_grpo_evaluation(const GrpoEvaluation& e) {
  std::string out = "Evaluation results:";
  for (const auto& [name, value] : e.metrics) out += "\n\t" + name + ": " + fixed4(value);
  return out;
}

}  // namespace gale
