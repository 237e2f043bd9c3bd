// Megatron-LM main's RL flags (megatron/training/arguments.py _add_rl_args) that Gale's GRPO runs
// with: --perform-rl-step, the --grpo-* flags, --langrl-env-config, --rl-default-*,
// --rl-inference-logprobs-is-correction, --rl-importance-sampling-truncation-coef and
// --rl-prompts-per-eval, sequence packing (--rl-use-sequence-packing,
// --rl-sequence-packing-max-sequences-per-bin, --rl-sequence-packing-algo) and
// --[no-]rl-skip-bos-token, with Megatron's defaults; --use-same-sampling-seed-across-dp-ranks
// accepted with a start-up note (what it asks is what Gale does); the group's other flags (partial
// rollouts, rollout banks, the separate inference model's parallelism, CUDA graphs, offloading,
// profiling, parsers) refused in one line each. Registered and validated by the
// perform-rl-step feature (features/feature_grpo.cc), run by train/grpo.h.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "train/arg_parser.h"
#include "train/arguments.h"

namespace gale {

struct GrpoArgs {
  bool perform_rl_step = false;           // --perform-rl-step
  int64_t grpo_prompts_per_step = 32;     // prompts (groups) per rollout collection
  int64_t grpo_group_size = 2;            // completions per prompt
  int64_t grpo_iterations = 2;            // passes over each collection's rollouts
  double grpo_clamp_eps_lower = 0.01;     // ratio clamp 1 − ε_l
  double grpo_clamp_eps_upper = 0.01;     // ratio clamp 1 + ε_u
  double grpo_kl_beta = 0.001;            // KL(π ‖ π_ref) weight
  double grpo_entropy_term_weight = 0.0;  // entropy bonus weight
  bool grpo_filter_groups_with_same_reward = false;
  std::string langrl_env_config;          // Gale's environment config (train/rl_environment.h)
  double rl_default_temperature = 1.0;
  double rl_default_top_p = 0.0;          // 0: off
  int64_t rl_default_top_k = -1;          // -1 (Megatron) or 0: off
  // --rl-inference-logprobs-is-correction: weight each token's policy term by exp(π_old − π_inf),
  // π_inf the sampler's log-probability of the token when it was generated (train/grpo_loss.h).
  bool rl_inference_logprobs_is_correction = false;
  // --rl-importance-sampling-truncation-coef: that weight's upper bound; 0: unset (Megatron's None).
  double rl_importance_sampling_truncation_coef = 0.0;
  // --rl-prompts-per-eval: the environment's first prompts evaluated at each --eval-interval and
  // after training when --eval-iters > 0 (train/grpo_eval.h).
  int64_t rl_prompts_per_eval = 32;
  // --rl-inference-tensor-model-parallel-size: the rollout model's TP size; 0: unset (Megatron's
  // None). Gale's rollout model is always TP 1 (the policy, or at TP > 1 its refit whole-model
  // copy, train/grpo_refit.h): only 1 is accepted.
  int64_t rl_inference_tensor_model_parallel_size = 0;
  // --rl-use-sequence-packing: train on the rollouts packed into bins of --seq-length
  // (train/grpo_packing.h); --micro-batch-size must be 1, as Megatron asserts.
  bool rl_use_sequence_packing = false;
  int64_t rl_sequence_packing_max_sequences_per_bin = 50;
  std::string rl_sequence_packing_algo = "fifo";  // fifo | round-robin: how the bins go to the DP ranks
  // --[no-]rl-skip-bos-token (Megatron's BooleanOptionalAction, default False): a prompt starts
  // with the tokenizer's BOS unless this is set or the tokenizer has none (grpo_prompt_ids).
  bool rl_skip_bos_token = false;
};

void add_grpo_args(ArgParser& p, GrpoArgs& g);

// The flags' values and what GRPO does not run with yet (one-line errors naming the flag):
// without --perform-rl-step the other RL flags are an error; with it --langrl-env-config is
// required, P·G (--grpo-prompts-per-step × --grpo-group-size) must be a multiple of
// --global-batch-size, --rl-use-sequence-packing needs --micro-batch-size 1 (and no Mamba or Gated
// DeltaNet layers: their scans know no sequence boundaries), and MTP, LoRA, --stage dpo,
// --qad-enable, --reuse-fp32-param, --overlap-param-gather, --rampup-batch-size,
// --calculate-per-token-loss, --train-samples, --dist-train, --exit-interval, --async-save,
// --non-persistent-save-interval and a --data-path are refused; --save-interval
// must be a multiple of the iterations per collection, grpo_iterations · (P·G / gbs);
// --rl-importance-sampling-truncation-coef and --rl-prompts-per-eval must be positive.
Status validate_grpo_args(const GrpoArgs& g, const Arguments& a, const ArgParser& p);

}  // namespace gale
