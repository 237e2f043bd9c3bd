// GRPO's built-in environments: YAML and JSON configs, the JSONL prompts, both rewards and the
// errors naming the file, key or line; and the rollout sampler's greedy, top-k and seeded draws.
#include "train/rl_environment.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "train/grpo_rollouts.h"

namespace gale {
namespace {

using testing::TempDir;

std::string setup(const TempDir& dir, const std::string& config, const std::string& jsonl) {
  testing::write_file(dir.file("p.jsonl"), jsonl);
  testing::write_file(dir.file("env.cfg"), config);
  return dir.file("env.cfg");
}

TEST(RlEnvironment, YamlConfigAndRewards) {
  TempDir dir;
  const std::string cfg = setup(dir, "environment: exact_match\ndata: p.jsonl\nmax_new_tokens: 8\n",
                                "{\"prompt\": \"2+3=\", \"answer\": \"5\"}\n\n{\"prompt\": \"x\", \"answer\": 12}\n");
  StatusOr<RlEnvironment> env = load_rl_environment(cfg);
  ASSERT_TRUE(env.ok()) << env.status().to_string();
  EXPECT_EQ(env->kind, "exact_match");
  EXPECT_EQ(env->max_new_tokens, 8);
  ASSERT_EQ(env->prompts.size(), 2u);
  EXPECT_EQ(env->prompts[1].answer, "12");  // a number answer as its JSON text
  EXPECT_EQ(env->reward(0, " 5\n"), 1.0);    // trimmed
  EXPECT_EQ(env->reward(0, "5 5"), 0.0);
  EXPECT_EQ(env->reward(1, "12"), 1.0);
}

TEST(RlEnvironment, JsonConfigAndContains) {
  TempDir dir;
  const std::string cfg = setup(dir, "{\"environment\": \"contains\", \"data\": \"p.jsonl\", \"prompt_key\": \"q\", "
                                     "\"answer_key\": \"a\"}",
                                "{\"q\": \"capital of France?\", \"a\": \"Paris\"}\n");
  StatusOr<RlEnvironment> env = load_rl_environment(cfg);
  ASSERT_TRUE(env.ok()) << env.status().to_string();
  EXPECT_EQ(env->prompts[0].prompt, "capital of France?");
  EXPECT_EQ(env->reward(0, "It is Paris."), 1.0);
  EXPECT_EQ(env->reward(0, "Lyon"), 0.0);
}

TEST(RlEnvironment, ErrorsNameTheFileAndKey) {
  TempDir dir;
  const std::string ok_line = "{\"prompt\": \"a\", \"answer\": \"b\"}\n";
  std::string cfg = setup(dir, "environment: exact_match\ndata: p.jsonl\ntemperature: 1\n", ok_line);
  EXPECT_EQ(load_rl_environment(cfg).status().message(),
            "--langrl-env-config " + cfg +
                ": unknown key 'temperature' (expected environment, data, prompt_key, answer_key, max_new_tokens, max_k)");
  cfg = setup(dir, "environment: regex\ndata: p.jsonl\n", ok_line);
  EXPECT_EQ(load_rl_environment(cfg).status().message(),
            "--langrl-env-config " + cfg + ": environment: expected exact_match or contains, found 'regex'");
  cfg = setup(dir, "environment: contains\n", ok_line);
  EXPECT_EQ(load_rl_environment(cfg).status().message(),
            "--langrl-env-config " + cfg + ": data: expected the JSONL file of prompts, found none");
  cfg = setup(dir, "environment: contains\ndata: p.jsonl\n", ok_line + "{\"prompt\": \"c\"}\n");
  EXPECT_EQ(load_rl_environment(cfg).status().message(),
            dir.file("p.jsonl") + " line 2: expected a string or number field 'answer' (the answer)");
  cfg = setup(dir, "environment: contains\ndata: p.jsonl\n", "[1, 2]\n");
  EXPECT_EQ(load_rl_environment(cfg).status().message(), dir.file("p.jsonl") + " line 1: expected a JSON object");
  EXPECT_FALSE(load_rl_environment(dir.file("missing.yaml")).ok());
}

TEST(GrpoSampling, GreedyTopKAndSeededDraws) {
  const std::vector<float> logits = {0.1f, 2.0f, 1.5f, -1.0f};
  GrpoSampling greedy{7, 0.0, -1, 0.0};
  EXPECT_EQ(grpo_sample_token(logits.data(), 4, greedy, 1, 0), 1);
  GrpoSampling top1{7, 1.0, 1, 0.0};
  for (uint64_t i = 0; i < 20; ++i) EXPECT_EQ(grpo_sample_token(logits.data(), 4, top1, 1, i), 1);
  GrpoSampling nucleus{7, 1.0, -1, 0.5};  // token 1 alone holds over half the mass
  for (uint64_t i = 0; i < 20; ++i) EXPECT_EQ(grpo_sample_token(logits.data(), 4, nucleus, 1, i), 1);
  GrpoSampling full{7, 1.0, -1, 0.0};
  int counts[4] = {};
  for (uint64_t i = 0; i < 400; ++i) {
    const int32_t t = grpo_sample_token(logits.data(), 4, full, 1, i);
    EXPECT_EQ(t, grpo_sample_token(logits.data(), 4, full, 1, i));  // the same draw, the same token
    ++counts[t];
  }
  EXPECT_GT(counts[1], counts[2]);
  EXPECT_GT(counts[2], counts[0]);
  EXPECT_GT(counts[0], 0);
}

}  // namespace
}  // namespace gale
