// Megatron's Timers.log and Timers.write for `gale pretrain`: this rank's timers gathered over the
// world group (one all-gather), reported on the last rank and written to its TensorBoard file.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensorboard_writer.h"
#include "core/timers.h"

namespace gale {

// The timers training_log reports at --timing-log-level `level`, in Megatron's order (level 1:
// forward-backward, the gradient reductions and the optimizer's; level 2 adds the batch generator,
// forward/backward compute and the pipeline transfers). Empty at level 0.
std::vector<std::string> training_timer_names(int level);

// Every rank's elapsed seconds of `names` (float32, as Megatron gathers them), read and, with
// `reset`, cleared on this rank. A collective over `world`: every rank calls it with the same
// names (none when `names` is empty).
GatheredTimes gather_timers(Timers& timers, const std::vector<std::string>& names, Communicator& world,
                            bool reset);

// Megatron's Timers.log: prints format_timers of the gathered times divided by `normalizer` on the
// last rank (nothing when no timer ran).
void print_timers(const Timers& timers, const GatheredTimes& gathered, double normalizer);

// Gathers, then prints (Megatron's timers.log(names, normalizer, reset)).
void log_timers(Timers& timers, const std::vector<std::string>& names, Communicator& world,
                double normalizer = 1.0, bool reset = true);

// Megatron's Timers.write: '<name>-time' = the maximum across ranks of the gathered seconds
// divided by `normalizer`, at step `iteration`, for each timer some rank ran. `writer` may be null
// (ranks that do not write TensorBoard).
void write_timers(const GatheredTimes& gathered, TensorBoardWriter* writer, int64_t iteration, double normalizer);

}  // namespace gale
