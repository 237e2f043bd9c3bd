// The exact per-rank memory report printed after training (train/memory_report.h).
#include "train/memory_report.h"

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

}  // namespace gale
