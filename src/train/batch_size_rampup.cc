// Megatron's number-of-micro-batches calculator (constant or --rampup-batch-size).
#include "train/batch_size_rampup.h"

#include <charconv>

#include "train/arguments.h"

namespace gale {

StatusOr<BatchSizeRampup> parse_rampup_batch_size(const std::vector<std::string>& values) {
  if (values.size() != 3)
    return InvalidArgument(
        "--rampup-batch-size: expected 3 values <start batch size> <batch size increment> <ramp-up samples>, found ",
        values.size());
  int64_t parsed[3] = {0, 0, 0};
  const char* names[3] = {"start batch size", "batch size increment", "ramp-up samples"};
  for (int i = 0; i < 3; ++i) {
    const std::string& v = values[static_cast<size_t>(i)];
    const char* end = v.data() + v.size();
    auto [ptr, ec] = std::from_chars(v.data(), end, parsed[i]);
    if (v.empty() || ec != std::errc() || ptr != end)
      return InvalidArgument("--rampup-batch-size: expected an integer ", names[i], ", found '", v, "'");
  }
  return BatchSizeRampup{parsed[0], parsed[1], parsed[2]};
}

StatusOr<NumMicroBatchesCalculator> NumMicroBatchesCalculator::create(int64_t global_batch_size,
                                                                      int64_t micro_batch_size,
                                                                      int64_t data_parallel_size,
                                                                      const BatchSizeRampup* rampup,
                                                                      bool decrease_batch_size_if_needed) {
  if (global_batch_size <= 0)
    return InvalidArgument("--global-batch-size: expected a positive integer, found ", global_batch_size);
  if (micro_batch_size <= 0 || data_parallel_size <= 0)
    return InvalidArgument("--micro-batch-size ", micro_batch_size, " times the data-parallel size ",
                           data_parallel_size, ": expected a positive product");
  NumMicroBatchesCalculator c;
  c.global_batch_size_ = global_batch_size;
  c.micro_batch_size_ = micro_batch_size;
  c.data_parallel_size_ = data_parallel_size;
  c.decrease_if_needed_ = decrease_batch_size_if_needed;
  if (rampup == nullptr) return c;
  const BatchSizeRampup& r = *rampup;
  if (r.start_global_batch_size <= 0)
    return InvalidArgument("--rampup-batch-size: expected a positive start batch size, found ",
                           r.start_global_batch_size);
  if (r.batch_size_increment <= 0)
    return InvalidArgument("--rampup-batch-size: expected a positive batch size increment, found ",
                           r.batch_size_increment);
  if (r.rampup_samples < 0)
    return InvalidArgument("--rampup-batch-size: expected non-negative ramp-up samples, found ", r.rampup_samples);
  const int64_t diff = global_batch_size - r.start_global_batch_size;
  if (diff < 0)
    return InvalidArgument("--rampup-batch-size: the start batch size ", r.start_global_batch_size,
                           " must not exceed --global-batch-size ", global_batch_size);
  if (diff % r.batch_size_increment != 0)
    return InvalidArgument("--rampup-batch-size: --global-batch-size ", global_batch_size, " minus the start batch size ",
                           r.start_global_batch_size, " (", diff, ") must be divisible by the batch size increment ",
                           r.batch_size_increment);
  // Megatron divides the ramp-up samples by the number of increments, then the consumed samples by
  // the quotient: both must be non-zero.
  if (diff == 0)
    return InvalidArgument("--rampup-batch-size: the start batch size equals --global-batch-size ", global_batch_size,
                           "; expected a smaller start batch size (or no --rampup-batch-size)");
  if (r.rampup_samples == 0)
    return InvalidArgument("--rampup-batch-size: expected positive ramp-up samples, found 0");
  c.ramps_up_ = true;
  c.rampup_ = r;
  const int64_t num_increments = diff / r.batch_size_increment;
  c.rampup_samples_per_increment_ = static_cast<double>(r.rampup_samples) / static_cast<double>(num_increments);
  return c;
}

int64_t NumMicroBatchesCalculator::global_batch_size(int64_t consumed_samples) const {
  if (!ramps_up_ || consumed_samples > rampup_.rampup_samples) return global_batch_size_;
  // Python's int() of a non-negative float: truncation.
  const auto steps = static_cast<int64_t>(static_cast<double>(consumed_samples) / rampup_samples_per_increment_);
  return rampup_.start_global_batch_size + steps * rampup_.batch_size_increment;
}

int64_t NumMicroBatchesCalculator::running_global_batch_size(int64_t consumed_samples) const {
  const int64_t gbs = global_batch_size(consumed_samples);
  const int64_t per_step = micro_batch_size_ * data_parallel_size_;
  return decrease_if_needed_ ? gbs / per_step * per_step : gbs;
}

StatusOr<int64_t> NumMicroBatchesCalculator::num_micro_batches(int64_t consumed_samples) const {
  const int64_t gbs = global_batch_size(consumed_samples);
  const int64_t per_step = micro_batch_size_ * data_parallel_size_;
  if (decrease_if_needed_) {
    if (gbs < per_step)
      return InvalidArgument("--decrease-batch-size-if-needed: the global batch size ", gbs, " after ",
                             consumed_samples, " consumed samples is smaller than --micro-batch-size ",
                             micro_batch_size_, " times the data-parallel size ", data_parallel_size_,
                             ": no micro-batch to run");
    return gbs / per_step;
  }
  if (gbs % per_step != 0 && !ramps_up_)
    return InvalidArgument("--global-batch-size ", gbs, " must be a multiple of --micro-batch-size ", micro_batch_size_,
                           " times the data-parallel size ", data_parallel_size_);
  if (gbs % per_step != 0)
    return InvalidArgument("--rampup-batch-size: the global batch size ", gbs, " after ", consumed_samples,
                           " consumed samples is not divisible by --micro-batch-size ", micro_batch_size_,
                           " times the data-parallel size ", data_parallel_size_);
  return gbs / per_step;
}

int64_t NumMicroBatchesCalculator::train_iters_for_samples(int64_t train_samples) const {
  if (!ramps_up_) return train_samples / global_batch_size_;
  int64_t iterations = 0, consumed = 0;
  while (consumed <= rampup_.rampup_samples && consumed <= train_samples) {
    consumed += global_batch_size(consumed);
    ++iterations;
  }
  if (train_samples > consumed) iterations += (train_samples - consumed) / global_batch_size_;
  return iterations;
}

StatusOr<NumMicroBatchesCalculator> num_micro_batches_calculator_from_args(const Arguments& a) {
  const TrainingArgs& t = a.training;
  if (t.rampup_batch_size.empty())
    return NumMicroBatchesCalculator::create(t.global_batch_size, t.micro_batch_size, a.parallel.data_parallel_size,
                                             nullptr, t.decrease_batch_size_if_needed);
  GALE_ASSIGN_OR_RETURN(BatchSizeRampup rampup, parse_rampup_batch_size(t.rampup_batch_size));
  return NumMicroBatchesCalculator::create(t.global_batch_size, t.micro_batch_size, a.parallel.data_parallel_size,
                                           &rampup, t.decrease_batch_size_if_needed);
}

}  // namespace gale
