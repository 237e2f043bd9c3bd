// Megatron's number-of-micro-batches calculator: the global batch size of each iteration as a
// function of the samples consumed so far, constant or ramped up (--rampup-batch-size).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

// --rampup-batch-size <start batch size> <batch size increment> <ramp-up samples>.
struct BatchSizeRampup {
  int64_t start_global_batch_size = 0;
  int64_t batch_size_increment = 0;
  int64_t rampup_samples = 0;
};

// The flag's values as Megatron reads them (three integers). Errors name the flag.
StatusOr<BatchSizeRampup> parse_rampup_batch_size(const std::vector<std::string>& values);

// Megatron's ConstantNumMicroBatchesCalculator / RampupBatchsizeNumMicroBatchesCalculator
// (megatron/core/num_microbatches_calculator.py).
//
// With a ramp-up from S by increments I over R samples to the final global batch size G, there are
// n = (G - S) / I increments of R / n samples each (a real number); after c consumed samples the
// global batch size is G when c > R, else S + I · int(c / (R / n)) (double arithmetic, as Python's).
// Each iteration consumes the global batch size of the samples consumed before it; a data-parallel
// rank runs global / (micro-batch size · DP) micro-batches, which must divide exactly at every step —
// unless --decrease-batch-size-if-needed: then the iteration runs (and consumes) the *running*
// global batch size, the global one rounded down to a multiple of micro-batch size · DP, and the
// difference counts as skipped samples (Megatron's skipped_train_samples).
class NumMicroBatchesCalculator {
 public:
  // Constant global batch size (no ramp-up). Megatron's checks of the ramp-up (positive start and
  // increment, non-negative samples, start <= G, G - start divisible by the increment) are errors
  // naming --rampup-batch-size; so are the two inputs on which Megatron's own code divides by zero
  // (start == G: no increments; zero ramp-up samples).
  static StatusOr<NumMicroBatchesCalculator> create(int64_t global_batch_size, int64_t micro_batch_size,
                                                    int64_t data_parallel_size, const BatchSizeRampup* rampup,
                                                    bool decrease_batch_size_if_needed = false);

  bool ramps_up() const { return ramps_up_; }
  int64_t final_global_batch_size() const { return global_batch_size_; }

  // The global batch size of the iteration that starts after `consumed_samples` samples
  // (Megatron's update(consumed_samples) then get_current_global_batch_size()).
  int64_t global_batch_size(int64_t consumed_samples) const;

  // The samples that iteration runs: global_batch_size(consumed_samples), or with
  // --decrease-batch-size-if-needed that rounded down to a multiple of micro-batch size · DP.
  int64_t running_global_batch_size(int64_t consumed_samples) const;

  // That iteration's micro-batches per data-parallel rank (running size / (micro-batch size · DP)),
  // with Megatron's consistency check: an error naming the flags when the global batch size is not a
  // multiple of micro-batch size · DP (without --decrease-batch-size-if-needed), or when the running
  // size is 0 (with it).
  StatusOr<int64_t> num_micro_batches(int64_t consumed_samples) const;

  // Megatron's update_train_iters for --train-samples: iterations of the ramp-up while the consumed
  // samples are <= both the ramp-up samples and `train_samples`, then whole final global batches of
  // the remaining samples (a partial last batch is dropped).
  int64_t train_iters_for_samples(int64_t train_samples) const;

 private:
  int64_t global_batch_size_ = 0, micro_batch_size_ = 0, data_parallel_size_ = 0;
  bool ramps_up_ = false;
  bool decrease_if_needed_ = false;
  BatchSizeRampup rampup_;
  double rampup_samples_per_increment_ = 0.0;
};

struct Arguments;

// The calculator of a validated pretrain command line: --global-batch-size, --micro-batch-size,
// the data-parallel size and --rampup-batch-size (when given).
StatusOr<NumMicroBatchesCalculator> num_micro_batches_calculator_from_args(const Arguments& a);

}  // namespace gale
