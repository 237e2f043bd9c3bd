// Megatron main's offline distillation in the training loop: the teacher's logits saver
// (--logits-save-dir) and the student's cached-logits KD loss (--logits-load-dir), as head logits
// hooks of the last stage's GPTModel (model/head_logits_hook.h) over the library of
// train/cached_logits.h and model/topk_kl.h (docs/model.md "Offline distillation from saved logits").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "model/head_logits_hook.h"
#include "train/cached_logits.h"

namespace gale {

struct Arguments;

// Megatron's compute_dataset_hash inputs of this run: --seed, --seq-length, --train-samples (else
// --train-iters × --global-batch-size, else unknown) and the train blend ((weight, file stem)
// pairs, weights 1 when none are given): --data-path's (or --data-args-path's), else
// --train-data-path's (or --per-split-data-args-path's "train") as Megatron's "blend_per_split",
// else none (--mock-data). Errors: a --data-args-path / --per-split-data-args-path file that
// cannot be read.
StatusOr<LogitsDatasetIdentity> logits_dataset_identity(const Arguments& args);

// Where a hook's training forward is: the iteration (Megatron's curr_iteration: the iterations
// completed before this one) read at each forward.
using IterationFn = std::function<int64_t()>;

// The teacher (Megatron's LogitsSaverHooks): every training forward's logits are gathered over TP,
// their top-K (top-P) log-probabilities selected (select_topk_logprobs) and buffered per iteration;
// TP rank 0 writes this (CP, DP) rank's pending iterations as one shard cp{C}_dp{D}__{I}.tar at
// flush(). It sits on the last pipeline stage's head chunk only (Megatron's); with context
// parallelism each CP rank saves its own sequence chunk ([S/CP, B, K] in its load-balanced order:
// chunks r and 2·CP−1−r); with MTP only the main head's logits are saved. The LM loss is neither differentiated nor reported (Megatron's saver replaces it by
// zero). The iteration's member is encoded when the next iteration's first forward arrives or at flush().
class LogitsSaverHook final : public HeadLogitsHook {
 public:
  LogitsSaverHook(std::string dir, const LogitsSaverSettings& settings, const LogitsDatasetIdentity& id, int cp_rank,
                  int dp_rank, Communicator* tp, IterationFn iteration);
  Result training_logits(const MicroBatch& mb, const Tensor& logits, const std::vector<float>& mask_sb,
                         int64_t vocab_offset) override;
  void training_lm_loss(double, double) override {}
  // Writes the pending iterations (TP rank 0; nothing when none are pending). Megatron's flush points
  // are its checkpoint saves; Gale's are every checkpoint save and the end of training.
  Status flush();
  // take_error(): the first error of a training forward (e.g. a vocabulary above 2^17).

 private:
  Status finish_iteration();
  std::string dir_, meta_;
  LogitsSaverSettings settings_;
  int cp_rank_, dp_rank_;
  Communicator* tp_;
  IterationFn iteration_;
  std::optional<int64_t> current_;          // the iteration being buffered
  std::vector<TopKLogProbs> microbatches_;  // its micro-batches so far (TP rank 0)
  CachedLogitsTar pending_;                 // encoded iterations not yet written
};

// The student (Megatron's LossFuncCallable with CachedLogitsKDLoss): micro-batch m of iteration i
// reads this rank's teacher top-K (CachedLogitsReader: CP rank, DP rank remapped), computes
// kd = Σ mask·kl (topk_kl_forward_backward, TP-aware) and differentiates α·kd + (1 − α)·lm
// (mix_kd_loss). A failing read or shape mismatch is an error (take_error) or, with
// --logits-load-ignore-errors, a warning and that micro-batch's LM loss alone.
class CachedLogitsKdHook final : public HeadLogitsHook {
 public:
  CachedLogitsKdHook(CachedLogitsReader reader, double alpha, bool ignore_errors, Communicator* tp,
                     IterationFn iteration);
  Result training_logits(const MicroBatch& mb, const Tensor& logits, const std::vector<float>& mask_sb,
                         int64_t vocab_offset) override;
  void training_lm_loss(double loss_sum, double tokens) override;
  // Inactive (evaluation) forwards use the LM loss alone (Megatron's eval case).
  // Since the last call: Σ kd and Σ mask of the micro-batches with a KD loss, Σ total and its Σ mask
  // (Megatron's "logits distillation loss" and "total loss" report entries); resets them.
  struct Sums {
    double kd = 0.0, kd_tokens = 0.0, total = 0.0, total_tokens = 0.0;
  };
  Sums take_sums();

 private:
  StatusOr<double> kd_loss(const MicroBatch& mb, const Tensor& logits, const std::vector<float>& mask_sb,
                           int64_t vocab_offset, Tensor* grad);
  CachedLogitsReader reader_;
  double alpha_;
  bool ignore_errors_;
  Communicator* tp_;
  IterationFn iteration_;
  std::optional<int64_t> current_;
  StatusOr<std::vector<TopKLogProbs>> teacher_ = std::vector<TopKLogProbs>{};
  size_t next_mb_ = 0;
  StatusOr<double> last_kd_ = 0.0;  // this forward's KD loss, for training_lm_loss
  Sums sums_;
};

}  // namespace gale
