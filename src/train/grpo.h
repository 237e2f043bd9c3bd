// Online GRPO (Megatron-LM main's --perform-rl-step: train_rl.py with megatron/rl/rl_utils.py's
// get_grpo_data_iterator and prepare_data_for_update): the training loop of `gale pretrain
// --perform-rl-step`.
//
// Every C = grpo_iterations · (P·G / --global-batch-size) iterations a collection runs
// (train/grpo_rollouts.h) with the policy as it is, then, in evaluation mode (no dropout), the
// per-token log-probabilities of every row under the policy (π_old, kept for the whole collection)
// and under the frozen reference model (the --load or initial weights, copied at start-up).
// Iteration k of the collection is one optimizer step over a global batch: this data-parallel rank
// holds rows [r·R/DP, (r+1)·R/DP) of the R = P·G, read in micro-batches of --micro-batch-size that
// cycle over them (Megatron's itertools.cycle over its DataLoader), gbs / (mbs·DP) per iteration,
// so --grpo-iterations passes over every row; with --rl-use-sequence-packing the rows are this
// rank's bins of packed rollouts instead, one per micro-batch, ceil(gbs / R · bins) per iteration
// (train/grpo_packing.h). The passes run through the layout's schedule (no
// pipelining, 1F1B, interleaved 1F1B over this rank's virtual stages, or DualPipeV): forward-only ones for π_old and the reference, and
// the training one whose MicroBatchLoss, on the loss stage, computes each micro-batch's loss
// (train/grpo_loss.h; current = the training forward's log-probabilities) and lets its gradient
// reach the model through the LM head's per-token loss gradient (GPTModel::scale_loss_mask_tokens),
// averaged over the micro-batches and the data-parallel ranks (Megatron's schedule without
// --calculate-per-token-loss); then Megatron's gradient reduction, clipping and optimizer step.
// Rollouts come from train/grpo_refit.h's rollout model (at TP, PP or CP > 1 a whole-model copy); with
// context parallelism each cp rank runs its positions (the trainer's cut, adaptive_cp_algo's layout
// included: train/context_parallel_batch.h; grpo_scale_policy_loss).
//
// Log lines: at each collection
//   > GRPO collection at iteration I: P prompts x G completions, reward mean X std Y, F groups
//     filtered, mean completion length L tokens
// and at every --log-interval Megatron's training line, its loss-dict entries (token means over
// the global batch, averaged over the interval's iterations; Megatron prints an entry only when
// it is > 0): lm loss (the GRPO loss), rl/kl_term, rl/pi_over_pi_old, rl/entropy_term,
// rl/truncated_from_above, rl/truncated_from_below (MoE policies: then the load-balancing losses
// and z_loss, as the pretraining line); with --eval-iters > 0 the evaluation
// (train/grpo_eval.h) at every --eval-interval and after training.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "model/gpt_model.h"
#include "tokenizer/tokenizer.h"
#include "train/arguments.h"
#include "train/engine.h"
#include "train/grpo_args.h"
#include "train/grpo_loss.h"
#include "train/grpo_rollouts.h"
#include "train/rl_environment.h"
#include "train/trainer.h"

namespace gale {

// Rows [first, first + n) of `rollouts` as one micro-batch: tokens, next-token labels (the last
// position's label the pad token, masked), the loss mask, positions 0..S-1, sample ids `id0 + i`.
MicroBatch grpo_micro_batch(const GrpoRollouts& rollouts, int64_t first, int64_t n, int32_t pad, int64_t id0);

// --mtp-num-layers: Megatron's RL training forward passes no labels and no loss mask, so its MTP
// losses (process_mtp_loss) take the labels from the tokens and every position whose rolled label
// exists. Makes `mb`'s loss mask that: 1 but at each row's last position (whose label is the pad);
// packed (mb.packed_sequences), 1 but at each document's last position (Megatron rolls the tokens
// and the mask within each packed sequence, cu_seqlens). The GRPO policy term keeps the rollouts'
// mask through its per-token weights (zero elsewhere).
void grpo_mtp_loss_mask(MicroBatch* mb);

// log p(label) of every position of `mb` [B, S] from an evaluation forward of `model` (nothing kept).
std::vector<double> grpo_token_logprobs(GPTModel& model, const MicroBatch& mb);

// The whole rows' per-token log-probabilities [B, S] from a forward's per-token losses at this cp
// rank's `positions` (global position of each local one; the forward's token_losses are [B, Sl]),
// summed over `cp` (null or size 1: the rank holds them all).
std::vector<double> grpo_whole_logprobs(const GPTModel::LossSums& sums, int64_t B, int64_t S,
                                        const std::vector<int32_t>& positions, const Comm& cp);

// The GRPO loss of training micro-batch `mb_id` ([B, S] rows with loss mask `mask`) from its
// training forward's per-token losses `sums` (on the loss stage), and the policy's loss mask scaled
// by its gradient so that backward(mb_id, {}, 1) differentiates it (the grad scale carries
// 1 / micro-batches). With context parallelism the forward held this cp rank's `positions` of the
// rows: every cp rank computes the whole micro-batch's loss from the log-probabilities summed over
// `cp` and scales its own positions (empty `positions`: all of 0..S-1). The schedules'
// MicroBatchLoss step of run_grpo.
GrpoMicroBatchLoss grpo_scale_policy_loss(GPTModel& policy, int64_t mb_id, const std::vector<float>& mask, int64_t B,
                                          int64_t S, const GPTModel::LossSums& sums, const std::vector<double>& old,
                                          const std::vector<double>& ref, const std::vector<double>& advantages,
                                          const GrpoLossOptions& o, const std::vector<double>& inference = {},
                                          const std::vector<int32_t>& positions = {}, const Comm& cp = nullptr);

// One training micro-batch: the policy's training forward, the GRPO loss of its log-probabilities
// against `old` / `ref` [B, S] and `advantages` [B] (reduced as one micro-batch: the caller's grad
// scale carries 1 / micro-batches), and the backward of it. Parameter gradients accumulate.
// `inference` [B, S]: the importance-sampling correction's log-probabilities, or empty for none.
GrpoMicroBatchLoss grpo_forward_backward(GPTModel& policy, const MicroBatch& mb, int64_t mb_id,
                                         const std::vector<double>& old, const std::vector<double>& ref,
                                         const std::vector<double>& advantages, const GrpoLossOptions& o,
                                         const std::vector<double>& inference = {});

// Saves a checkpoint of the run at `state` (the pretrain driver's save_checkpoint).
using GrpoSaveFn = std::function<Status(const TrainerState&)>;
// The loop's checkpointing (the pretrain driver's; each may be null): `save` at every
// --save-interval, at --exit-interval (unless just saved) and at the end; `non_persistent`
// (--non-persistent-save-interval, a multiple of the iterations per collection) where `save` did not
// save, as Megatron's checkpoint_and_decide_exit; `finalize` (--async-save: Megatron's
// maybe_finalize_async_save, collective) not blocking before each iteration, blocking at the end.
struct GrpoSaves {
  GrpoSaveFn save, non_persistent;
  std::function<Status(bool blocking)> finalize;
};

// The loop (header comment) until --train-iters (or --exit-interval); `state` advances as the
// trainer's. `reference`: the reference model's chunks of this rank's virtual stages, each with the
// policy chunk's configuration and partition; its weights are read from --pretrained-checkpoint when
// given (Megatron's reference), else copied from the policy now (the --load or initial model).
// `saves` (GrpoSaves): checkpoints at collection boundaries (every interval a multiple of the
// iterations per collection); a run resumed from one collects at once, at the iteration it resumes,
// what the uninterrupted run collected there.
Status run_grpo(const Arguments& args, const GrpoArgs& g, Engine& engine, const std::vector<GPTModel*>& reference,
                const Tokenizer& tokenizer, const RlEnvironment& env, TrainerState* state,
                const GrpoSaves& saves = {});

// `gale pretrain --perform-rl-step` after the engine's setup and --load: loads --langrl-env-config,
// builds the frozen reference model (the policy's configuration without LoRA) and runs run_grpo.
Status run_grpo_training(const Arguments& args, const GrpoArgs& g, Engine& engine, const Tokenizer& tokenizer,
                         TrainerState* state, const GrpoSaves& saves);

}  // namespace gale
