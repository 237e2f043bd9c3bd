// GRPO's math as Megatron-LM main computes it (megatron/rl/rl_utils.py calculate_grpo_advantages,
// calculate_grpo_loss; train_rl.py loss_func): group-normalised advantages, the per-token loss and
// its derivative with respect to the current policy's log-probability, and a micro-batch's reduction.
//
// Advantages. rewards[g][i] is the reward of completion i of prompt g (every group the same size G):
//   A[g][i] = (r[g][i] − mean_g) / (1e-4 + std_g)
// with the group's mean and population standard deviation (÷ G), flattened group-major.
//
// Per-token loss. With lp = log π(token) under the current policy, old = under the policy that
// generated the rollouts (π_old, computed once per collection), ref = under the frozen reference,
// A the sequence's advantage, ε_l / ε_u = --grpo-clamp-eps-lower / -upper, β = --grpo-kl-beta,
// w = --grpo-entropy-term-weight:
//   ratio = exp(lp − old),  clamped = clamp(ratio, 1 − ε_l, 1 + ε_u)
//   kl    = exp(ref − lp) − (ref − lp) − 1            (the k3 estimator of KL(π ‖ π_ref); ≥ 0)
//   ent   = −exp(lp)·lp
//   loss  = −min(ratio·A, clamped·A) + β·kl − w·ent
// truncated_from_above = ratio > 1 + ε_u, truncated_from_below = ratio < 1 − ε_l (logged only).
//
// Importance sampling (--rl-inference-logprobs-is-correction): with inf = the token's
// log-probability under the sampler that generated it (the inference engine's raw logits),
//   w = exp(old − inf),  truncated to min(w, c) with c = --rl-importance-sampling-truncation-coef,
//   loss = −w·min(ratio·A, clamped·A) + β·kl − w_e·ent
// (w = 1 without the correction). w depends on old and inf only, so it scales the policy term's
// derivative and nothing else.
//
// Derivative (torch's autograd of that expression: min passes the gradient to the smaller
// operand, half to each on a tie; clamp passes it inside [lo, hi], bounds included):
//   d loss / d lp = −w·A·ratio·[the unclamped operand is taken, or ratio ∈ [1 − ε_l, 1 + ε_u]]
//                   + β·(1 − exp(ref − lp)) + w·exp(lp)·(lp + 1)
//
// Micro-batch reduction (loss_func returning (Σ loss·mask, Σ mask) and Megatron's schedule without
// --calculate-per-token-loss): mb_loss = Σ loss·mask / max(Σ mask, 1) / num_microbatches; the
// logged terms (lm loss, kl, ratio, entropy, truncated) are token means over the global batch.
// With --calculate-per-token-loss (GrpoLossOptions::per_token_loss) the schedule keeps the sum,
// mb_loss = Σ loss·mask, and finalize_model_grads divides the gradients by the global batch's
// Σ max(Σ mask, 1) over its micro-batches (train/grad_sync.h): every token weighs the same.
#pragma once

#include <cstdint>
#include <vector>

namespace gale {

struct GrpoLossOptions {
  double clamp_eps_lower = 0.01;   // --grpo-clamp-eps-lower
  double clamp_eps_upper = 0.01;   // --grpo-clamp-eps-upper
  double kl_beta = 0.001;          // --grpo-kl-beta
  double entropy_weight = 0.0;     // --grpo-entropy-term-weight
  // --rl-importance-sampling-truncation-coef: the importance weight's upper bound; ≤ 0: none
  // (Megatron's None). Applies only where inference log-probabilities are given.
  double is_truncation_coef = 0.0;
  // --calculate-per-token-loss: mb_loss is the micro-batch's masked sum (header comment).
  bool per_token_loss = false;
};

// Megatron's calculate_grpo_advantages for single-turn rollouts: one flat advantage per completion,
// group-major. Every group must hold the same number (> 0) of rewards.
std::vector<double> grpo_advantages(const std::vector<std::vector<double>>& rewards);

// One token's terms (header comment).
struct GrpoTokenLoss {
  double loss = 0.0, kl_term = 0.0, ratio = 0.0, entropy_term = 0.0;
  bool truncated_from_above = false, truncated_from_below = false;
  double is_weight = 1.0;         // the importance weight w (1 without inference log-probabilities)
  double d_loss_d_current = 0.0;  // d loss / d lp
};
// `inference`: the token's inference log-probability (--rl-inference-logprobs-is-correction), or
// null for none.
GrpoTokenLoss grpo_token_loss(double current, double old, double ref, double advantage, const GrpoLossOptions& o,
                              const double* inference = nullptr);

// A micro-batch of B rows of S log-probability positions, every array [B, S] sample-major and
// `advantages` [B] (one per row: each row one sequence) or [B, S] (each position's sequence's
// advantage: rows packed with several sequences, Megatron's calculate_grpo_loss with seq_starts): the masked sums of every term (what loss_func reports) and the gradient of
// mb_loss (header comment) with respect to each current log-probability, 0 where the mask is 0.
// `inference` [B, S]: the inference log-probabilities of the importance-sampling correction, or
// empty for none.
struct GrpoMicroBatchLoss {
  double loss_sum = 0.0, kl_sum = 0.0, ratio_sum = 0.0, entropy_sum = 0.0;
  double truncated_above_sum = 0.0, truncated_below_sum = 0.0;
  double tokens = 0.0;        // Σ mask (0 when every token is masked; the loss then divides by 1)
  double mb_loss = 0.0;       // the differentiated micro-batch loss
  std::vector<double> grad;   // d mb_loss / d current, [B, S]
};
GrpoMicroBatchLoss grpo_micro_batch_loss(const std::vector<double>& current, const std::vector<double>& old,
                                         const std::vector<double>& ref, const std::vector<double>& advantages,
                                         const std::vector<float>& mask, int64_t B, int64_t S,
                                         int64_t num_microbatches, const GrpoLossOptions& o,
                                         const std::vector<double>& inference = {});

}  // namespace gale
