// The exact per-rank memory reports: after training, and Megatron's line during it (train/memory_report.h).
#include "train/memory_report.h"

#include <cstdio>

#include "core/allocator.h"
#include "core/status.h"
#include "train/engine.h"

namespace gale {

RankMemory rank_memory(const Engine& engine) {
  RankMemory m;
  for (const auto& c : engine.chunks) {
    m.parameter_bytes += c->params().value_bytes();
    m.gradient_bytes += c->params().grad_storage_bytes();
  }
  m.optimizer_state_bytes = engine.optimizer ? engine.optimizer->state_bytes() : 0;
  m.peak_bytes = host_allocator().peak_bytes();
  return m;
}

std::string format_rank_memory(int rank, const RankMemory& m) {
  return str_cat("[after training] memory of rank ", rank, ": parameters ", m.parameter_bytes, " bytes, gradients ",
                 m.gradient_bytes, " bytes, optimizer state ", m.optimizer_state_bytes, " bytes, peak ", m.peak_bytes,
                 " bytes in tensors");
}

AllocatorCounters host_allocator_counters() {
  const Allocator& a = host_allocator();
  return {a.current_bytes(), a.max_live_bytes(), a.reserved_bytes(), a.max_reserved_bytes()};
}

std::string format_memory_report(int rank, int64_t iteration, const AllocatorCounters& c) {
  constexpr double kMegabyte = 1024.0 * 1024.0;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "[Rank %d] (after %lld iterations) memory (MB) | allocated: %.2f | max allocated: %.2f | reserved: "
                "%.2f | max reserved: %.2f",
                rank, static_cast<long long>(iteration), static_cast<double>(c.allocated) / kMegabyte,
                static_cast<double>(c.max_allocated) / kMegabyte, static_cast<double>(c.reserved) / kMegabyte,
                static_cast<double>(c.max_reserved) / kMegabyte);
  return buf;
}

}  // namespace gale
