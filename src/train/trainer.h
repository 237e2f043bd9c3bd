// The training loop of `gale pretrain`: iterations over global batches, evaluation, logging,
// checkpoint and exit intervals, exactly in Megatron's order and with Megatron's semantics.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/wandb_writer.h"
#include "data/random_sampler.h"
#include "kernels/flop_counter.h"
#include "model/config.h"
#include "schedule/schedules.h"
#include "train/arguments.h"
#include "train/batch_size_rampup.h"
#include "train/engine.h"
#include "train/rerun_state_machine.h"
#include "train/sample_dataset.h"
#include "train/training_log.h"

namespace gale {

// Everything a checkpoint must restore for a resumed run to continue exactly.
class Profiler;
class StragglerDetector;
class FtIntegration;

struct TrainerState {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  // --decrease-batch-size-if-needed: global-batch samples the rounded-down iterations did not run
  // (Megatron's skipped_train_samples; printed as "skipped samples" once non-zero).
  int64_t skipped_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  double floating_point_operations_so_far = 0.0;
  // --rerun-mode validate_results: the rerun state machine's pending rerun
  // (RerunStateMachine::state_dict; null when none).
  nlohmann::json rerun_state_machine;
};

// Result of one training iteration.
struct IterationResult {
  double loss_sum = 0.0, tokens = 0.0;  // over the whole global batch (all DP ranks; last pipeline stage)
  // MoE (Megatron's aux-loss tracker): each auxiliary loss without its coefficient, summed over the
  // micro-batches and divided by their number, averaged over the MoE layers (all pipeline stages)
  // and the data-parallel ranks; 0 when the loss is off. load_balancing_loss by MoeAuxKind
  // (aux_loss, seq_aux_loss, global_aux_loss).
  std::array<double, kMoeAuxKinds> load_balancing_loss{};
  double z_loss = 0.0;
  // --mtp-num-layers (Megatron's MTPLossLoggingHelper): per MTP layer its loss-mask mean
  // cross-entropy, summed over the micro-batches and divided by their number, averaged over the
  // data-parallel ranks; empty without MTP.
  std::vector<double> mtp_losses;
  // --experimental-attention-variant dsa (Megatron's DSAIndexerLossLoggingHelper): the indexer loss
  // (coefficient included) summed over the micro-batches and divided by their number, averaged over
  // the DSA layers (all pipeline stages) and the data-parallel ranks; negative without DSA or
  // without its loss (--dsa-indexer-loss-coeff 0).
  double indexer_loss = -1.0;
  // --qad-enable (MindSpeed's "kl loss" metric): each micro-batch's reduced KL term (without
  // --kl-loss-weight) summed over the micro-batches and divided by their number, averaged over the
  // data-parallel ranks; negative without QAD.
  double kl_loss = -1.0;
  // --logits-load-dir (Megatron's loss-dict entries "logits distillation loss" and "total loss"):
  // Σ over the micro-batches with a KD loss and the data-parallel ranks of kd (and α·kd + (1 − α)·lm)
  // divided by their Σ mask; empty without --logits-load-dir or when no micro-batch had one.
  std::vector<std::pair<std::string, double>> logits_kd_losses;
  // --stage dpo: MindSpeed-LLM's rewards/accuracies (chosen reward > rejected reward), averaged over
  // the pairs, micro-batches and data-parallel ranks; negative without DPO.
  double dpo_accuracy = -1.0;
  // --qk-clip / --log-max-attention-logit (model/qk_clip.h): max(0, the largest pre-softmax attention
  // logit of this rank's heads and decoder layers over the step's forwards), after the MAX over the
  // data-parallel × context-parallel group; 0 without the flags.
  double max_attention_logit = 0.0;
  // The samples this iteration consumed: --global-batch-size, or during --rampup-batch-size the
  // ramp-up's current global batch size.
  int64_t global_batch_size = 0;
  double loss_scale = 1.0;  // --fp16: the loss scale after this iteration's update; else 1
  StepResult step;
  // --op-cal-tflops: the FLOPs this rank's kernels counted during the step (kernels/flop_counter.h).
  FlopCounts flops;
  // --rerun-mode validate_results: the job ends after this iteration's passes, without its
  // optimizer step, with this exit code (0: it goes on), after saving a checkpoint when `checkpoint`.
  RerunStateMachine::Decision rerun;
};

class Trainer {
 public:
  Trainer(const Arguments& args, Engine* engine, const SampleDataset* train, const SampleDataset* valid,
          const SampleDataset* test);

  TrainerState& state() { return state_; }
  int64_t train_iters() const { return train_iters_; }

  // --phase-transition-iterations (train/phase_transitions.h): the phase's training dataset (when
  // pretrain rebuilt it after loading a checkpoint; nullptr keeps the current one) and the samples
  // subtracted from the consumed-samples count to index it (the phase's data starts at its sample 0).
  void set_train_phase(const SampleDataset* train, int64_t sample_offset) {
    if (train) train_ = train;
    train_sample_offset_ = sample_offset;
  }

  // Called at every --save-interval, at --exit-interval and at the end of training.
  using SaveFn = std::function<Status(const TrainerState&)>;
  void set_save_fn(SaveFn fn) { save_fn_ = std::move(fn); }
  // Called at every --non-persistent-save-interval where no persistent save falls (Megatron's
  // checkpoint_and_decide_exit); timed as save-checkpoint-non-persistent. Such a save counts as the
  // iteration's checkpoint for --exit-interval and --exit-duration-in-mins (no second, persistent
  // save there), not for the save at the end of training.
  void set_non_persistent_save_fn(SaveFn fn) { non_persistent_save_fn_ = std::move(fn); }
  // --async-save: finalises the save in flight (AsyncCheckpointSaves::maybe_finalize), called as
  // Megatron calls maybe_finalize_async_save: not blocking at the start of every iteration,
  // blocking at the end of run() (after the final evaluations) and at every early exit.
  using FinalizeSavesFn = std::function<Status(bool blocking)>;
  void set_finalize_saves_fn(FinalizeSavesFn fn) { finalize_saves_fn_ = std::move(fn); }
  // --stage dpo: the frozen reference model's chunks on this rank, the policy's virtual stages
  // (train/dpo.h dpo_iteration). train_step then runs DPO micro-batches of pairs from a
  // PairwiseDataset (data/pairwise_dataset.h) through the layout's schedule: its reported loss sums
  // are Σ over micro-batches of the mean pair loss and the micro-batch count.
  void set_dpo_reference(std::vector<GPTModel*> reference) { dpo_reference_ = std::move(reference); }
  // --tensorboard-dir: the writer of the last rank (nullptr elsewhere, or without the flag).
  void set_tensorboard_writer(TensorBoardWriter* w) { tensorboard_ = w; }
  // --wandb-project: the last rank's W&B run (fed by the TensorBoard writer's scalar observer);
  // written whenever TensorBoard is flushed.
  void set_wandb_writer(WandbWriter* w) { wandb_ = w; }
  // --prof-file (train/auto_settings_profile.h): called after each training iteration (once its
  // train_step returned) with the iteration number and the seconds train_step took on this rank.
  using StepObserver = std::function<void(int64_t iteration, double seconds)>;
  void set_step_observer(StepObserver fn) { step_observer_ = std::move(fn); }
  // --profile / --record-memory-history (train/profiler.h): told of every step, log line and the end.
  void set_profiler(Profiler* profiler) { profiler_ = profiler; }
  // --log-straggler (train/straggler_detector.h): reported at every log line, after it.
  void set_straggler_detector(StragglerDetector* detector) { straggler_ = detector; }
  // --enable-ft-package (train/ft_integration.h): told where each training and evaluation
  // iteration, save and async-save finalisation starts and ends.
  void set_ft(FtIntegration* ft) { ft_ = ft; }

  // The whole run: iterations until --train-iters, with logging, evaluation, checkpoints and
  // exits, then the final validation and test evaluations. As Megatron, when --rampup-batch-size
  // changes the global batch size it prints "ramping up batch size from A to B" and, after the
  // first iteration (of this process), saves a checkpoint of the iterations so far before the first
  // iteration at the new size (when --save is given and that iteration was not just saved).
  Status run();
  // 0, or the exit code a --rerun-mode validate_results decision ended run() with (16: resume from
  // the checkpoint on other hardware to finish the diagnosis; 17: failed on result validation).
  int exit_code() const { return exit_code_; }

  // One iteration (forward/backward of every micro-batch, gradient reduction, optimizer step,
  // scheduler step) over the global batch size of the consumed samples so far (ramped up or not);
  // advances consumed samples by it. An error when that size is not a multiple of
  // --micro-batch-size × the data-parallel size (Megatron's check at every step).
  StatusOr<IterationResult> train_step();
  // Mean lm loss over `iters` global batches of `data` starting at sample `*consumed` (advanced);
  // always --global-batch-size samples each (Megatron's evaluation batch, no ramp-up).
  StatusOr<double> evaluate(const SampleDataset& data, int64_t* consumed, int64_t iters);

  FlopsModel flops_model() const;

  // --decoupled-lr: the word embedding's and output layer's rate at the scheduler's current step
  // (the schedule between --decoupled-lr and --decoupled-min-lr, default --min-lr); nullopt without.
  std::optional<double> decoupled_learning_rate() const;

 private:
  // The samples of this data-parallel rank's micro-batch that starts after `consumed` samples of
  // `data` (all ranks): with --dataloader-type single consumed + dp_rank·mbs + [0, mbs)
  // (MegatronPretrainingSampler), with cyclic the sampler's (data/random_sampler.h). `ids` are the
  // samples' global ids for the dropout streams: the index, plus epoch × len(data) when cyclic.
  Status micro_batch_samples(const SampleDataset& data, int64_t consumed, std::vector<int64_t>* indices,
                             std::vector<int64_t>* ids);
  Status load_micro_batch(const SampleDataset& data, const std::vector<int64_t>& indices,
                          const std::vector<int64_t>& ids, MicroBatch* mb) const;
  // --iterations-to-skip with --fim-data: reads (and drops) this rank's samples of the skipped
  // iteration's `micro_batches`, as Megatron's dummy_train_step pulls them through the data loader,
  // so the FIM datasets' random streams advance past them (data/fim_dataset.h).
  Status read_skipped_micro_batches(int64_t micro_batches);
  // --stage dpo: the pairs `indices` of a PairwiseDataset as one micro-batch of 2·mbs sequences
  // (chosen ones first, then the rejected ones in the same order; sample ids 2·id and 2·id + 1).
  Status load_pair_micro_batch(const SampleDataset& data, const std::vector<int64_t>& indices,
                               const std::vector<int64_t>& ids, MicroBatch* mb) const;
  // --stage dpo: the iteration's micro-batches (train/dpo.h dpo_iteration); fills the loss sums
  // and *accuracy (on every rank).
  StatusOr<ForwardBackwardResult> dpo_forward_backward_all(int64_t consumed, double* accuracy);
  // The averaged loss dict of `iters` evaluation batches of `data` from sample `*consumed`
  // (advanced): {lm loss}, or with --stage dpo (train/dpo.h dpo_iteration on pairs) MindSpeed-LLM's
  // {rewards/accuracies, lm loss}, each the mean over the micro-batches of every DP rank.
  StatusOr<LossDict> evaluate_losses(const SampleDataset& data, int64_t* consumed, int64_t iters);
  // The sequence length of a micro-batch of these samples: --seq-length, or with
  // --variable-seq-lengths the longest sample's unpadded length, rounded up to a multiple of TP
  // under --sequence-parallel.
  int64_t micro_batch_length(const std::vector<TrainingSample>& samples) const;
  // Evaluates, prints Megatron's validation block and, with `to_tensorboard`, writes its scalars.
  Status evaluate_and_print(const SampleDataset& data, int64_t* consumed, const std::string& prefix,
                            bool to_tensorboard);
  // Writes pending TensorBoard records; a write error names --tensorboard-dir.
  Status flush_tensorboard();
  // The end of run(), normal or early: flushes TensorBoard, then finalises asynchronous saves (blocking).
  Status finish_run();
  // --check-weight-hash-across-dp-replicas-interval: completes a parameter all-gather in flight,
  // compares the parameter hashes across the data-parallel replicas (train/param_hash.h; an error
  // when they differ) and prints Megatron's ">>> Weight hashes match after N iterations...".
  Status check_weight_hashes();
  // --test-mode: completes a parameter all-gather in flight and checks the --qk-layernorm
  // parameters across the data- and tensor-parallel replicas (train/param_hash.h).
  Status run_realtime_tests();
  // Sums `n` sums (loss, tokens; DPO: and accuracy) over the data-parallel group and shares them
  // from the pipeline stage holding the loss.
  void reduce_losses(double* sums, int n = 2) const;
  // The iteration's MoE auxiliary losses as Megatron logs them (IterationResult), on every rank.
  void reduce_moe_losses(IterationResult* r) const;
  // The iteration's MTP losses as Megatron logs them (IterationResult), on every rank.
  void reduce_mtp_losses(IterationResult* r) const;
  void reduce_dsa_losses(IterationResult* r) const;
  // --qad-enable: the iteration's KL term as MindSpeed logs it (IterationResult::kl_loss), on every rank.
  void reduce_qad_losses(IterationResult* r) const;
  // --logits-save-dir / --logits-load-dir (train/logits_kd_hooks.h): the hooks' errors (any rank's
  // stops every rank before the optimizer step) and the student's loss entries, over DP.
  Status reduce_logits_kd_losses(IterationResult* r) const;
  // Megatron's checks of an iteration's passes (loss_func's and the gradient buffer's), through the
  // rerun state machine: NaN/Inf local losses and gradient norms with
  // --check-for-nan-in-loss-and-grad under --rerun-mode validate_results or report_stats (disabled:
  // the optimizer step's check stays the one), --check-for-spiky-loss, --check-for-large-grads.
  Status validate_passes(const ForwardBackwardResult& fb);
  // Drops what a discarded run of the passes summed into the model (auxiliary-loss trackers).
  void discard_pass_sums();
  // --microbatch-group-size-per-virtual-pipeline-stage, 0 when unset (the schedule's default P).
  int64_t microbatch_group() const {
    const int64_t g = args_.parallel.microbatch_group_size_per_virtual_stage;
    return g > 0 ? g : 0;
  }

  const Arguments& args_;
  Engine* engine_;
  const SampleDataset* train_;
  int64_t train_sample_offset_ = 0;  // set_train_phase
  const SampleDataset* valid_;
  const SampleDataset* test_;
  TrainerState state_;
  SaveFn save_fn_;
  SaveFn non_persistent_save_fn_;
  FinalizeSavesFn finalize_saves_fn_;
  StepObserver step_observer_;
  Profiler* profiler_ = nullptr;
  StragglerDetector* straggler_ = nullptr;
  FtIntegration* ft_ = nullptr;
  TensorBoardWriter* tensorboard_ = nullptr;
  WandbWriter* wandb_ = nullptr;
  std::vector<GPTModel*> dpo_reference_;
  int64_t train_iters_ = 0;
  NumMicroBatchesCalculator calculator_;
  int64_t num_microbatches_ = 0;       // of the current (or last) training iteration, per DP rank
  int64_t eval_num_microbatches_ = 0;  // --global-batch-size / (micro-batch size × DP)
  // --dataloader-type cyclic: one sampler per dataset read, made at its first micro-batch (Megatron
  // builds its loaders with the consumed samples at start-up).
  std::map<const SampleDataset*, std::unique_ptr<PretrainingRandomSampler>> samplers_;
  std::unique_ptr<RerunStateMachine> rerun_;
  int exit_code_ = 0;
};

}  // namespace gale
