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

namespace gale {

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

}  // namespace gale
