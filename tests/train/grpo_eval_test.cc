// GRPO's evaluation (--rl-prompts-per-eval): pass@k against Megatron's own pass_at_k in float64
// (tests/data/reference/grpo/fixture.json, tools/reference/grpo_reference.py), and evaluate_grpo
// through a tiny GPT: the first prompts, deterministic draws, rewards that always or never pass.
#include "train/grpo_eval.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "model/model_test_batches.h"
#include "testing.h"
#include "tokenizer/null_tokenizer.h"

namespace gale {
namespace {

TEST(GrpoEval, PassAtKMatchesMegatron) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/grpo/fixture.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json f = nlohmann::json::parse(in);
  ASSERT_GE(f["pass_at_k_cases"].size(), 10u);
  int strictly_between = 0;
  for (const auto& c : f["pass_at_k_cases"]) {
    const double got = pass_at_k(c["n"].get<int64_t>(), c["c"].get<int64_t>(), c["k"].get<int64_t>());
    const double want = c["pass_at_k"];
    EXPECT_NEAR(got, want, 1e-12) << c.dump();
    strictly_between += want > 0.0 && want < 1.0;
  }
  EXPECT_GT(strictly_between, 4);
}

struct EvalFixture {
  ModelConfig c = testing::gradcheck_gpt_config();
  OpTable ops = reference_ops();
  GPTModel model{c, single_process_partition(c), &ops};
  testing::TempDir dir;
  std::unique_ptr<NullTokenizer> tok = std::move(NullTokenizer::create(c.vocab - 1).value());
  EvalFixture() { model.params().initialize(42); }
  // Three prompts; `answer` for the first two, `last` (default `answer`) for the third; max_k samples per prompt.
  RlEnvironment env(const std::string& kind, const std::string& answer, int64_t max_k, const char* last = nullptr) {
    testing::write_file(dir.file("p.jsonl"), "{\"prompt\": \"1 2\", \"answer\": \"" + answer + "\"}\n"
                                             "{\"prompt\": \"4 5 6\", \"answer\": \"" + answer + "\"}\n"
                                             "{\"prompt\": \"7\", \"answer\": \"" + (last ? last : answer) + "\"}\n");
    testing::write_file(dir.file("env.yaml"), "environment: " + kind + "\ndata: p.jsonl\nmax_new_tokens: 3\nmax_k: " +
                                                  std::to_string(max_k) + "\n");
    StatusOr<RlEnvironment> e = load_rl_environment(dir.file("env.yaml"));
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return *e;
  }
};

TEST(GrpoEval, MetricsOfRewardsThatAlwaysOrNeverPass) {
  EvalFixture f;
  GrpoArgs g;
  g.rl_prompts_per_eval = 2;
  // contains "": every completion of the first two prompts passes (the third's answer never occurs,
  // and only the first --rl-prompts-per-eval prompts are evaluated).
  StatusOr<GrpoEvaluation> all =
      evaluate_grpo(f.model, *f.tok, f.env("contains", "", 4, "99 99 99 99"), g, f.c.seq_length, 3, 10);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ(all->prompts, 2);
  EXPECT_EQ(all->samples_per_prompt, 4);
  ASSERT_EQ(all->metrics.size(), 3u);
  EXPECT_EQ(all->metrics[0].first, "contains_eval_mean_pass_at_1");
  EXPECT_EQ(all->metrics[1].first, "contains_eval_mean_pass_at_4");
  EXPECT_EQ(all->metrics[2].first, "contains_eval_mean_greedy_reward");
  for (const auto& m : all->metrics) EXPECT_EQ(m.second, 1.0) << m.first;
  EXPECT_EQ(format_grpo_evaluation(*all),
            "Evaluation results:\n\tcontains_eval_mean_pass_at_1: 1.0000\n\tcontains_eval_mean_pass_at_4: "
            "1.0000\n\tcontains_eval_mean_greedy_reward: 1.0000");
  // exact_match "99" (ids are 0..31 and completions hold at most 3): nothing passes. max_k 1: no
  // separate pass@max_k entry; more prompts asked than the environment has: all 3.
  g.rl_prompts_per_eval = 10;
  StatusOr<GrpoEvaluation> none =
      evaluate_grpo(f.model, *f.tok, f.env("exact_match", "99 99 99 99", 1), g, f.c.seq_length, 3, 10);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->prompts, 3);
  ASSERT_EQ(none->metrics.size(), 2u);
  EXPECT_EQ(none->metrics[0].first, "exact_match_eval_mean_pass_at_1");
  EXPECT_EQ(none->metrics[1].first, "exact_match_eval_mean_greedy_reward");
  for (const auto& m : none->metrics) EXPECT_EQ(m.second, 0.0) << m.first;
}

// A reward that some samples reach: pass@1 is the passing fraction c/n averaged over the prompts,
// pass@n ≥ pass@1, and the same call gives the same numbers (draws keyed by seed and iteration),
// also when decoded in static batches of 5 requests instead of all 24 at once.
TEST(GrpoEval, PartialPassesAreDeterministic) {
  EvalFixture f;
  GrpoArgs g;
  g.rl_default_temperature = 3.0;  // flat sampling: completions vary
  const RlEnvironment env = f.env("contains", "5", 8);
  int64_t varied = 0;
  for (int64_t it = 0; it < 6; ++it) {
    StatusOr<GrpoEvaluation> a = evaluate_grpo(f.model, *f.tok, env, g, f.c.seq_length, 5, it);
    StatusOr<GrpoEvaluation> b = evaluate_grpo(f.model, *f.tok, env, g, f.c.seq_length, 5, it);
    GrpoArgs small = g;
    small.grpo_prompts_per_step = 1;
    small.grpo_group_size = 5;
    StatusOr<GrpoEvaluation> c = evaluate_grpo(f.model, *f.tok, env, small, f.c.seq_length, 5, it);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_EQ(a->metrics, b->metrics);
    EXPECT_EQ(a->metrics, c->metrics);
    const double p1 = a->metrics[0].second, pn = a->metrics[1].second;
    EXPECT_GE(pn, p1);
    // c/n per prompt, n = 8, 3 prompts: a multiple of 1/24.
    EXPECT_NEAR(p1 * 24.0, std::round(p1 * 24.0), 1e-9);
    varied += p1 > 0.0 && p1 < 1.0;
  }
  EXPECT_GT(varied, 0);
}

}  // namespace
}  // namespace gale
