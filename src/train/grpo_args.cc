// Megatron-LM main's RL flags (--perform-rl-step, --grpo-*, --langrl-env-config, --rl-*): registration and checks.
#include "train/grpo_args.h"

namespace gale {

void add_grpo_args(ArgParser& p, GrpoArgs& g) {
  p.group("rl (Megatron-LM main's GRPO)");
  p.add_flag("--perform-rl-step", &g.perform_rl_step,
             "online GRPO: each collection generates --grpo-group-size completions for --grpo-prompts-per-step "
             "prompts of the --langrl-env-config environment, scores them and trains on them (docs/rl.md)");
  p.add("--grpo-prompts-per-step", &g.grpo_prompts_per_step, "GRPO: prompts (groups) per rollout collection (32)");
  p.add("--grpo-group-size", &g.grpo_group_size, "GRPO: completions per prompt (2)");
  p.add("--grpo-iterations", &g.grpo_iterations, "GRPO: passes over each collection's rollouts (2)");
  p.add("--grpo-clamp-eps-lower", &g.grpo_clamp_eps_lower, "GRPO: lower ratio clipping bound eps (0.01)");
  p.add("--grpo-clamp-eps-upper", &g.grpo_clamp_eps_upper, "GRPO: upper ratio clipping bound eps (0.01)");
  p.add("--grpo-kl-beta", &g.grpo_kl_beta, "GRPO: weight of the KL term against the reference model (0.001)");
  p.add("--grpo-entropy-term-weight", &g.grpo_entropy_term_weight, "GRPO: weight of the entropy term (0)");
  p.add_flag("--grpo-filter-groups-with-same-reward", &g.grpo_filter_groups_with_same_reward,
             "GRPO: drop groups whose rewards are all equal (std <= 1e-6) and draw new prompts in their place");
  p.add("--langrl-env-config", &g.langrl_env_config,
        "GRPO: the environment's config file (Gale's JSON: a built-in rule-based reward over a JSONL of prompts and "
        "answers; docs/rl.md)");
  p.add("--rl-default-temperature", &g.rl_default_temperature, "GRPO: sampling temperature of the rollouts (1.0)");
  p.add("--rl-default-top-p", &g.rl_default_top_p, "GRPO: nucleus sampling of the rollouts (0: off)");
  p.add("--rl-default-top-k", &g.rl_default_top_k, "GRPO: top-k sampling of the rollouts (-1: off)");
  p.add_flag("--rl-inference-logprobs-is-correction", &g.rl_inference_logprobs_is_correction,
             "GRPO: weight each generated token's policy term by exp(old - inference log-probability), the "
             "sampler's log-probability of the token when it was generated (docs/rl.md)");
  p.add_false("--no-rl-inference-logprobs-is-correction", &g.rl_inference_logprobs_is_correction,
              "GRPO: no importance-sampling correction (the default)");
  p.add("--rl-importance-sampling-truncation-coef", &g.rl_importance_sampling_truncation_coef,
        "GRPO: with --rl-inference-logprobs-is-correction, the importance weight's upper bound (unset: none)");
  p.add("--rl-prompts-per-eval", &g.rl_prompts_per_eval,
        "GRPO evaluation: the environment's first N prompts, pass@1, pass@max_k and greedy reward at each "
        "--eval-interval and after training, when --eval-iters > 0 (32)");
  p.add("--rl-inference-tensor-model-parallel-size", &g.rl_inference_tensor_model_parallel_size,
        "GRPO: the rollout model's tensor-parallel size; Gale's is 1 (at TP > 1 a whole-model copy of the policy, "
        "refit before each collection: docs/rl.md), the only value accepted");
  p.add_flag("--rl-use-sequence-packing", &g.rl_use_sequence_packing,
             "GRPO: train on the rollouts packed into bins of --seq-length (decreasing length, next-fit; attention "
             "and positions per rollout; needs --micro-batch-size 1; docs/rl.md)");
  p.add_false("--no-rl-use-sequence-packing", &g.rl_use_sequence_packing, "GRPO: one padded row per rollout (the default)");
  p.add("--rl-sequence-packing-max-sequences-per-bin", &g.rl_sequence_packing_max_sequences_per_bin,
        "GRPO sequence packing: the most rollouts in one bin (50)");
  p.add("--rl-sequence-packing-algo", &g.rl_sequence_packing_algo,
        "GRPO sequence packing: how the bins go to the data-parallel ranks: fifo (consecutive runs) or round-robin "
        "(fifo)");
  // Megatron's flags whose request is what Gale's GRPO does anyway.
  p.add_compat("--rl-skip-bos-token", false,
               "Gale's GRPO prompts are the tokenizer's ids as they are; Gale prepends no BOS token to them");
  p.add_unsupported("--no-rl-skip-bos-token",
                    "prepending the tokenizer's BOS token to the RL prompts: Gale's GRPO prompts are the tokenizer's "
                    "ids as they are");
  p.add_compat("--use-same-sampling-seed-across-dp-ranks", false,
               "Gale's rollout draws are keyed by --seed, the collection and the completion, never by the "
               "data-parallel rank: every rank draws the same samples");
  // The group's other flags: one line each on why Gale does not run them.
  const std::string own_model =
      "Gale generates the rollouts on each process with the policy itself, at TP > 1 with its whole-model copy "
      "refit over the TP group; there is no separate inference model or server";
  for (const char* f : {"--rl-partial-rollouts", "--no-rl-partial-rollouts", "--rl-generation-lag",
                        "--rl-max-inflight-requests", "--rl-submission-granularity", "--rl-consumption-granularity"})
    p.add_unsupported(f, "asynchronous (partial) rollouts: Gale's collections are generated whole, between optimizer "
                         "steps, by the policy as it is");
  for (const char* f : {"--rl-durable-rollout-bank", "--rl-rollout-bank-dir", "--rl-rollout-bank-max-bytes"})
    p.add_unsupported(f, "the durable rollout bank: a resumed Gale run regenerates its collection exactly");
  for (const char* f : {"--rl-inference-pipeline-model-parallel-size",
                        "--rl-inference-expert-model-parallel-size",
                        "--rl-inference-expert-tensor-model-parallel-size", "--rl-inference-model-unified-memory-level",
                        "--rl-offload-inference-model-weights-when-idle",
                        "--no-rl-offload-inference-model-weights-when-idle", "--refit-method",
                        "--rl-verify-model-weights-swap", "--no-rl-verify-model-weights-swap", "--rl-inference-parsers"})
    p.add_unsupported(f, own_model);
  for (const char* f : {"--rl-offload-optimizer-during-inference", "--rl-kv-cache-management-mode",
                        "--rl-persist-cuda-graphs", "--no-rl-persist-cuda-graphs", "--rl-training-cuda-graphs",
                        "--no-rl-training-cuda-graphs"})
    p.add_unsupported(f, "GPU memory and CUDA-graph management between rollouts and training");
  for (const char* f : {"--rl-profile", "--rl-profile-dir"})
    p.add_unsupported(f, "RL profiling files (JSONL + CSV); use --profile or --timing-log-level");
}

Status validate_grpo_args(const GrpoArgs& g, const Arguments& a, const ArgParser& p) {
  if (!g.perform_rl_step) {
    for (const char* flag : {"--grpo-prompts-per-step", "--grpo-group-size", "--grpo-iterations",
                             "--grpo-clamp-eps-lower", "--grpo-clamp-eps-upper", "--grpo-kl-beta",
                             "--grpo-entropy-term-weight", "--grpo-filter-groups-with-same-reward",
                             "--langrl-env-config", "--rl-default-temperature", "--rl-default-top-p",
                             "--rl-default-top-k", "--rl-inference-logprobs-is-correction",
                             "--no-rl-inference-logprobs-is-correction", "--rl-importance-sampling-truncation-coef",
                             "--rl-skip-bos-token", "--rl-prompts-per-eval", "--rl-inference-tensor-model-parallel-size",
                             "--rl-use-sequence-packing", "--no-rl-use-sequence-packing",
                             "--rl-sequence-packing-max-sequences-per-bin", "--rl-sequence-packing-algo"})
      if (p.was_set(flag)) return InvalidArgument(flag, " needs --perform-rl-step");
    return Status::Ok();
  }
  if (g.langrl_env_config.empty())
    return InvalidArgument("--perform-rl-step: expected --langrl-env-config FILE (the environment), found none");
  if (g.grpo_prompts_per_step < 1)
    return InvalidArgument("--grpo-prompts-per-step: expected a positive number, found ", g.grpo_prompts_per_step);
  if (g.grpo_group_size < 1)
    return InvalidArgument("--grpo-group-size: expected a positive number, found ", g.grpo_group_size);
  if (g.grpo_iterations < 1)
    return InvalidArgument("--grpo-iterations: expected a positive number, found ", g.grpo_iterations);
  if (!(g.grpo_clamp_eps_lower >= 0.0 && g.grpo_clamp_eps_lower < 1.0))
    return InvalidArgument("--grpo-clamp-eps-lower: expected a number in [0, 1), found ", g.grpo_clamp_eps_lower);
  if (!(g.grpo_clamp_eps_upper >= 0.0))
    return InvalidArgument("--grpo-clamp-eps-upper: expected a non-negative number, found ", g.grpo_clamp_eps_upper);
  if (!(g.grpo_kl_beta >= 0.0))
    return InvalidArgument("--grpo-kl-beta: expected a non-negative number, found ", g.grpo_kl_beta);
  if (!(g.rl_default_temperature >= 0.0))
    return InvalidArgument("--rl-default-temperature: expected a non-negative number (0: greedy), found ",
                           g.rl_default_temperature);
  if (!(g.rl_default_top_p >= 0.0 && g.rl_default_top_p <= 1.0))
    return InvalidArgument("--rl-default-top-p: expected a number in [0, 1], found ", g.rl_default_top_p);
  if (g.rl_default_top_k < -1)
    return InvalidArgument("--rl-default-top-k: expected -1 (off) or a non-negative number, found ", g.rl_default_top_k);
  if (p.was_set("--rl-importance-sampling-truncation-coef") && !(g.rl_importance_sampling_truncation_coef > 0.0))
    return InvalidArgument("--rl-importance-sampling-truncation-coef: expected a positive number, found ",
                           g.rl_importance_sampling_truncation_coef);
  if (g.rl_prompts_per_eval < 1)
    return InvalidArgument("--rl-prompts-per-eval: expected a positive number, found ", g.rl_prompts_per_eval);
  const int64_t samples = g.grpo_prompts_per_step * g.grpo_group_size;
  const int64_t gbs = a.training.global_batch_size;
  if (gbs > 0 && samples % gbs != 0)
    return InvalidArgument("--global-batch-size: expected a divisor of --grpo-prompts-per-step x --grpo-group-size = ",
                           samples, " (each collection trains in whole global batches), found ", gbs);
  if (g.rl_use_sequence_packing && a.training.micro_batch_size != 1)  // Megatron's assertion
    return InvalidArgument("--rl-use-sequence-packing: micro_batch_size must be 1 when using sequence packing. To "
                           "increase compute per micro batch increase the sequence length. (found --micro-batch-size ",
                           a.training.micro_batch_size, ")");
  if (g.rl_use_sequence_packing && (a.model.is_hybrid_model || a.model.experimental_attention_variant == "gdn" ||
                                     a.model.experimental_attention_variant == "gdn2"))
    return Unimplemented("--rl-use-sequence-packing with Mamba or Gated DeltaNet layers: not supported yet (Gale's "
                         "scans run across the packed rollouts' boundaries)");
  if (g.rl_sequence_packing_max_sequences_per_bin < 1)
    return InvalidArgument("--rl-sequence-packing-max-sequences-per-bin: expected a positive number, found ",
                           g.rl_sequence_packing_max_sequences_per_bin);
  if (g.rl_sequence_packing_algo != "fifo" && g.rl_sequence_packing_algo != "round-robin")
    return InvalidArgument("--rl-sequence-packing-algo: expected fifo or round-robin, found '",
                           g.rl_sequence_packing_algo, "'");
  auto refuse = [](const std::string& what) {
    return Unimplemented("--perform-rl-step with ", what, ": not supported yet");
  };
  const ParallelArgs& par = a.parallel;
  if (p.was_set("--rl-inference-tensor-model-parallel-size") && g.rl_inference_tensor_model_parallel_size != 1)
    return InvalidArgument("--rl-inference-tensor-model-parallel-size: expected 1 (Gale generates the rollouts with a "
                           "whole-model copy of the policy on each process), found ",
                           g.rl_inference_tensor_model_parallel_size);
  if (par.dist_train) return refuse("--dist-train");
  if (a.dpo.enabled()) return refuse("--stage dpo");
  if (a.qad.qad_enable) return refuse("--qad-enable");
  if (!a.training.rampup_batch_size.empty())  // Megatron's RL iterator cuts collections by args.global_batch_size
    return Unimplemented("--perform-rl-step with --rampup-batch-size: not supported (Megatron's RL cuts each "
                         "collection into whole --global-batch-size batches; a ramping batch size does not)");
  if (g.rl_use_sequence_packing && a.model.mtp_num_layers != kUnset && a.model.mtp_num_layers > 0)
    return refuse("--rl-use-sequence-packing and --mtp-num-layers (Gale's MTP rolls would cross the packed rollouts)");
  if (!a.data.data_path.empty() || !a.data.data_args_path.empty() || !a.data.train_data_path.empty())
    return InvalidArgument("--data-path with --perform-rl-step: expected none (the prompts come from "
                           "--langrl-env-config)");
  // Checkpoints fall between collections (Megatron's assertions on --save-interval and --exit-interval).
  const int64_t per_collection = gbs > 0 ? g.grpo_iterations * (samples / gbs) : 1;
  if (!a.checkpoint.save.empty() && a.checkpoint.save_interval != kUnset &&
      a.checkpoint.save_interval % per_collection != 0)
    return InvalidArgument("--save-interval: expected a multiple of --grpo-iterations x (--grpo-prompts-per-step x "
                           "--grpo-group-size / --global-batch-size) = ", per_collection,
                           " (a checkpoint falls between rollout collections), found ", a.checkpoint.save_interval);
  if (a.training.exit_interval != kUnset && a.training.exit_interval % per_collection != 0)
    return InvalidArgument("--exit-interval: expected a multiple of --grpo-iterations x (--grpo-prompts-per-step x "
                           "--grpo-group-size / --global-batch-size) = ", per_collection,
                           " (the run exits between rollout collections), found ", a.training.exit_interval);
  if (!a.checkpoint.save.empty() && a.checkpoint.non_persistent_save_interval != kUnset &&
      a.checkpoint.non_persistent_save_interval % per_collection != 0)
    return InvalidArgument("--non-persistent-save-interval: expected a multiple of --grpo-iterations x "
                           "(--grpo-prompts-per-step x --grpo-group-size / --global-batch-size) = ", per_collection,
                           " (a checkpoint falls between rollout collections), found ",
                           a.checkpoint.non_persistent_save_interval);
  return Status::Ok();
}

}  // namespace gale
