// Megatron-LM main's --phase-transition-iterations: a run saves and exits at each listed iteration,
// and each phase's training data is a fresh dataset read from its first sample.
//
// Megatron (training.py, get_train_valid_test_num_samples and build_train_valid_test_data_loaders):
// with transitions t1 < t2 < ... and the global batch size G, the phase boundaries in samples are
// 0, t1·G, t2·G, ..., --train-samples. A run at iteration i builds its training dataset with
// next − last samples (last: the largest boundary ≤ i·G, next: the smallest one above it) and reads
// it from sample (i − t_last)·G, t_last being the last transition at or before i (0 if none). The
// validation and test datasets are built and read as without the flag. At each transition the run
// saves a checkpoint (with --save) and exits, as at --exit-interval; the next run, possibly on
// another --data-path, resumes from it. The global batch size must not change across phases (the
// checkpoint's is compared), and Megatron counts the last phase to --train-samples.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

struct Arguments;

// "100, 200,50" -> {50, 100, 200} (Megatron sorts them); an error naming the flag for an entry that
// is not an integer.
StatusOr<std::vector<int64_t>> parse_phase_transition_iterations(const std::string& text);

// The phase a run at `iteration` is in.
struct PhaseSpan {
  int64_t first_iteration = 0;  // the last transition at or before the iteration (0: the first phase)
  int64_t first_sample = 0;     // Megatron's last_transition_sample
  int64_t end_sample = 0;       // Megatron's next_transition_sample (--train-samples for the last phase)
  int64_t samples() const { return end_sample - first_sample; }  // the phase's training dataset size
};
// `transitions` sorted; `global_batch_size` and `train_samples` positive. When no boundary lies
// above iteration·G (training is over) the phase is empty: end_sample = first_sample.
PhaseSpan phase_at(const std::vector<int64_t>& transitions, int64_t iteration, int64_t global_batch_size,
                   int64_t train_samples);

// Whether the run exits (after saving) at this iteration.
bool is_phase_transition(const std::vector<int64_t>& transitions, int64_t iteration);

// The first training sample of the phase's dataset a run resumed at `iteration` with
// `consumed_train_samples` reads (Megatron's consumed_train_samples_in_current_phase), given as the
// offset subtracted from the consumed-samples count: consumed − (iteration − first_iteration)·G.
int64_t phase_sample_offset(const std::vector<int64_t>& transitions, int64_t iteration,
                            int64_t consumed_train_samples, int64_t global_batch_size);

// The iteration `gale pretrain` expects to resume at, to size the training dataset before the
// checkpoint is loaded: --override-ckpt-iteration if given; 0 with --finetune or without --load (or
// --pretrained-checkpoint); else --ckpt-step if given, else the iteration in --load's
// latest_checkpointed_iteration.txt (0 when there is none or it says release). The loaded
// iteration decides in the end (pretrain rebuilds the training data when its phase differs).
StatusOr<int64_t> phase_resume_iteration_hint(const Arguments& a);

}  // namespace gale
