// The memory one rank holds, in exact bytes: what every rank prints at the end of training, and
// Megatron's memory report line during it.
//
// Gale's allocator (core/allocator.h) counts every tensor's bytes, so these numbers are exact and,
// for a dense model, depend only on the layout and the flags: a --fake-process-group run of rank r
// (comm/fake_communicator.h) reports the parameter, gradient and optimizer-state bytes of rank r of
// the real run (tests/cli/fake_process_group_cli_test.cc compares them).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace gale {

struct Arguments;
struct Engine;

struct RankMemory {
  int64_t parameter_bytes = 0;        // the flat parameter buffers with their GEMM copies (all chunks)
  int64_t gradient_bytes = 0;         // the f32 gradient storage (all chunks)
  int64_t optimizer_state_bytes = 0;  // Optimizer::state_bytes()
  int64_t peak_bytes = 0;             // the allocator's high-water mark since its last reset_peak()
};

// This rank's numbers now.
RankMemory rank_memory(const Engine& engine);

// "[after training] memory of rank 3: parameters N bytes, gradients N bytes, optimizer state N
// bytes, peak N bytes in tensors" (`rank`: the global rank, simulated under --fake-process-group).
std::string format_rank_memory(int rank, const RankMemory& m);

// Megatron's report_memory line, printed by every data-parallel rank 0 after the first log lines
// and every --log-memory-interval iterations:
//   "[Rank R] (after N iterations) memory (MB) | allocated: A | max allocated: M | reserved: X |
//   max reserved: Y"
// torch.cuda's four counters read as the host allocator's (core/allocator.h): live tensor bytes,
// their highest since the process started, the bytes held from the system (live blocks at their
// size class plus the free-block cache), and their highest.
struct AllocatorCounters {
  int64_t allocated = 0, max_allocated = 0, reserved = 0, max_reserved = 0;
};
AllocatorCounters host_allocator_counters();
std::string format_memory_report(int rank, int64_t iteration, const AllocatorCounters& c);

// When Megatron's training_log prints the memory report, for the trainer and the GRPO loop alike:
// after a log line, rank 0 prints the theoretical footprint (train/theoretical_memory.h) and every
// data-parallel rank 0 its report line while Megatron's report_memory_flag holds (up to the first
// log line after the run's first trained iteration, so that it includes the optimizer state), and
// the line again at every --log-memory-interval iteration.
class MemoryReporter {
 public:
  // `args` validated and outliving the reporter; `loaded_iteration` the iteration the run starts at.
  MemoryReporter(const Arguments& args, int64_t loaded_iteration)
      : args_(args), loaded_iteration_(loaded_iteration) {}

  // Call right after the log line of `iteration`; `num_microbatches` the iteration's (Megatron's
  // get_num_microbatches()).
  Status after_log_line(int64_t iteration, int world_rank, int dp_rank, int64_t num_microbatches);

 private:
  const Arguments& args_;
  const int64_t loaded_iteration_;
  bool report_memory_flag_ = true;
};

}  // namespace gale
