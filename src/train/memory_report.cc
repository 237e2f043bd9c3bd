// The exact per-rank memory reports: after training, and Megatron's line during it (train/memory_report.h).
#include "train/memory_report.h"

#include <cstdio>

#include "core/allocator.h"
#include "core/log.h"
#include "core/status.h"
#include "train/engine.h"
#include "train/theoretical_memory.h"

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

Status MemoryReporter::after_log_line(int64_t iteration, int world_rank, int dp_rank, int64_t num_microbatches) {
  const int64_t every = args_.logging.log_memory_interval;
  const bool interval = every != kUnset && iteration % every == 0;
  if (!report_memory_flag_ && !interval) return Status::Ok();
  if (report_memory_flag_ && world_rank == 0) {
    GALE_ASSIGN_OR_RETURN(TheoreticalMemory theory, theoretical_memory(args_, num_microbatches));
    for (const std::string& line : theory.lines) print_here(line);
  }
  if (dp_rank == 0) print_here(format_memory_report(world_rank, iteration, host_allocator_counters()));
  if (report_memory_flag_ && iteration > loaded_iteration_ + 1) report_memory_flag_ = false;
  return Status::Ok();
}

}  // namespace gale
