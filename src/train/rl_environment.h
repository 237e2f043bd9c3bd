// GRPO's built-in rule-based environments (--langrl-env-config; Megatron-LM's RewardOnlyAgent
// shape: a prompt, the model's completion, a scalar reward against the prompt's golden answer).
//
// The config file is YAML or JSON (one mapping; YAML is read by yaml-cpp, which reads JSON too):
//   environment: exact_match      # or contains (required)
//   data: prompts.jsonl           # JSON lines, relative to the config file's folder (required)
//   prompt_key: prompt            # the field holding the prompt text (default prompt)
//   answer_key: answer            # the field holding the golden answer (default answer; a string or a number)
//   max_new_tokens: 16            # completion cap (default: up to --seq-length)
//   max_k: 32                     # RL evaluation: samples per prompt (Megatron's PassAtEvaluationAgent max_k)
// Rewards (the completion is its decoded text without a final end-of-document token; both texts
// trimmed of surrounding whitespace):
//   exact_match  1 when the completion equals the answer, else 0
//   contains     1 when the answer occurs in the completion, else 0
// Any other key or environment is an error naming the file and the key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

struct RlPrompt {
  std::string prompt;
  std::string answer;
};

struct RlEnvironment {
  std::string kind;             // exact_match or contains
  std::string data_path;        // resolved against the config file's folder
  int64_t max_new_tokens = 0;   // 0: up to --seq-length
  int64_t max_k = 32;           // RL evaluation's samples per prompt (train/grpo_eval.h)
  std::vector<RlPrompt> prompts;
  // The reward of `completion` (decoded text) for prompt `index`.
  double reward(int64_t index, const std::string& completion) const;
};

// Reads the config and its JSONL. Errors name the file (and line) and what was expected.
StatusOr<RlEnvironment> load_rl_environment(const std::string& config_path);

}  // namespace gale
