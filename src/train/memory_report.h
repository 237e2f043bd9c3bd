// The memory one rank holds after training, in exact bytes: what every rank prints at the end.
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

}  // namespace gale
