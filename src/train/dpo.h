// Offline DPO (MindSpeed-LLM's `--stage dpo`, its DPOTrainer): the preference loss of chosen and
// rejected responses under the trained policy and a frozen reference model, and one micro-batch's
// forward and backward.
//
// A DPO micro-batch holds B = 2·n sequences: rows 0..n-1 the chosen responses of n prompts, rows
// n..2n-1 the rejected ones of the same prompts (MindSpeed-LLM's PairwiseDataCollatorWithPadding).
// Each sequence's log-probability log π(y|x) is the sum over its label (response) tokens, those
// with loss mask 1, of log p(label | prefix) = -ℓ (the model's per-token cross-entropy). With
// x = (πc − πr) − (refc − refr), β = --dpo-beta, ε = --dpo-label-smoothing, the pair's loss is
//   sigmoid: −(1−ε)·logσ(β·x) − ε·logσ(−β·x)
//   hinge:   relu(1 − β·x)
//   ipo:     (x − 1/(2β))², with every log-probability first divided by its label count (≥ 1)
// plus, when --pref-ftx > 1e-6, pref_ftx · (−πc / nc) (nc: the chosen label count; with ipo πc is
// already the average, as MindSpeed-LLM divides twice there). Rewards: β·(πc − refc) and
// β·(πr − refr); accuracy: chosen reward > rejected reward. A micro-batch's loss is the mean over
// its n pairs; the differentiated objective is the mean over the iteration's micro-batches
// (Megatron's schedule), averaged over data parallelism by the gradient reduction.
//
// Backward: d loss / d ℓ_t = −(d loss / d log π) for every label token of a sequence, so the
// policy's fused LM-head + cross-entropy backward runs with each sequence's loss mask scaled by
// that coefficient (GPTModel::scale_loss_mask) — no logits are materialised.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/gpt_model.h"
#include "model/micro_batch.h"
#include "schedule/schedules.h"

namespace gale {

struct DpoOptions {
  std::string loss_type = "sigmoid";  // --dpo-loss-type: sigmoid, hinge, ipo
  double beta = 0.1;                  // --dpo-beta
  double label_smoothing = 0.0;       // --dpo-label-smoothing
  double pref_ftx = 0.0;              // --pref-ftx
};

// One pair's log-probabilities (sums over label tokens) and label counts.
struct DpoPairInput {
  double policy_chosen = 0.0, policy_rejected = 0.0, reference_chosen = 0.0, reference_rejected = 0.0;
  double chosen_labels = 0.0, rejected_labels = 0.0;
};

// The pair's loss, its derivatives with respect to the policy's summed log-probabilities, and the
// rewards (header comment).
struct DpoPairLoss {
  double loss = 0.0, d_policy_chosen = 0.0, d_policy_rejected = 0.0;
  double chosen_reward = 0.0, rejected_reward = 0.0;
};
DpoPairLoss dpo_pair_loss(const DpoPairInput& in, const DpoOptions& o);

// Means over one micro-batch's pairs.
struct DpoMicroBatchStats {
  double loss = 0.0;      // the micro-batch's loss (what MindSpeed-LLM logs as lm loss)
  double accuracy = 0.0;  // rewards/accuracies
};

// Forward of `reference` (evaluation mode, nothing kept) and of `policy` (training) on `mb`
// (B = 2n, header comment), then the policy's backward with the objective's per-token gradients,
// 1 / num_microbatches of the micro-batch loss. One model chunk each, the whole model (no pipeline
// parallelism: dpo_iteration runs any layout); with tensor or context parallelism every rank of
// the group computes the same pair losses from the models' whole-sequence sums. Parameter
// gradients accumulate in `policy`.
// MoE models: the policy's auxiliary losses (load balancing, z-loss) add their gradients scaled
// by the model's grad scale / num_microbatches, as Megatron's MoEAuxLossAutoScaler does in a DPO
// micro-batch of MindSpeed-LLM; the reference model runs in evaluation mode and adds none.
DpoMicroBatchStats dpo_forward_backward(GPTModel& policy, GPTModel& reference, const MicroBatch& mb, int64_t mb_id,
                                        int64_t num_microbatches, const DpoOptions& o);

// Evaluation of one micro-batch (MindSpeed-LLM evaluates with the training loss function, forward
// only): both models' forwards in evaluation mode (no dropout, nothing kept, no auxiliary losses)
// and the micro-batch's loss and accuracy. Nothing accumulates in either model.
DpoMicroBatchStats dpo_forward(GPTModel& policy, GPTModel& reference, const MicroBatch& mb, const DpoOptions& o);

// Runs one pass over the iteration's micro-batches: the layout's schedule (schedule/schedules.h
// forward_backward, the same micro-batch source every call) over `chunks` with the micro-batch
// loss `loss`, forward only or forward and backward.
using DpoSchedule = std::function<StatusOr<ForwardBackwardResult>(const std::vector<GPTModel*>& chunks,
                                                                  bool forward_only, const MicroBatchLoss& loss)>;

// Sums over one iteration's micro-batches, on the ranks holding the loss (the last pipeline stage;
// zeros and no losses elsewhere).
struct DpoIterationStats {
  double loss_sum = 0.0;      // Σ of the micro-batches' losses
  double accuracy_sum = 0.0;  // Σ of their accuracies
  double micro_batches = 0.0;
  std::vector<double> micro_batch_losses;  // training: each micro-batch's loss, by micro-batch
};

// One DPO iteration with any parallel layout, pipeline parallelism included: `policy` and
// `reference` are this rank's chunks of the two models (the same virtual stages, so the same
// partitions). First the reference model's forwards of all the micro-batches run through `run`
// (forward only), keeping each micro-batch's per-sequence sums where the loss is; then the
// policy's pass (training: forward and backward, as dpo_forward_backward; `forward_only`:
// evaluation, as dpo_forward) with the pair loss as its micro-batch loss: on the chunk holding the
// LM head it pairs the policy's sums with the reference's and, training, scales the loss mask by
// each sequence's per-token gradient, its backward starting from scale 1 (the 1 / num_microbatches
// in the policy's grad scale while the pass runs, as dpo_forward_backward). Parameter gradients
// accumulate in `policy`; `reference` keeps nothing.
StatusOr<DpoIterationStats> dpo_iteration(const std::vector<GPTModel*>& policy, const std::vector<GPTModel*>& reference,
                                          int64_t num_microbatches, bool forward_only, const DpoOptions& o,
                                          const DpoSchedule& run);

}  // namespace gale
