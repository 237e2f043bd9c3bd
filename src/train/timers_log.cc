// The across-ranks timer report of `gale pretrain` (Megatron's Timers.log / Timers.write).
#include "train/timers_log.h"

#include "core/log.h"

namespace gale {

std::vector<std::string> training_timer_names(int level) {
  std::vector<std::string> names;
  if (level >= 1)
    names = {"forward-backward",
             "layernorm-grads-all-reduce",
             "embedding-grads-all-reduce",
             "all-grads-sync",
             "params-all-gather",
             "optimizer-copy-to-main-grad",
             "optimizer-unscale-and-check-inf",
             "optimizer-clip-main-grad",
             "optimizer-count-zeros",
             "optimizer-inner-step",
             "optimizer-copy-main-to-model-params",
             "optimizer"};
  if (level >= 2)
    for (const char* n : {"batch-generator", "forward-compute", "backward-compute", "forward-recv", "forward-send",
                          "backward-recv", "backward-send", "forward-send-forward-recv", "forward-send-backward-recv",
                          "backward-send-forward-recv", "backward-send-backward-recv",
                          "forward-backward-send-forward-backward-recv"})
      names.emplace_back(n);
  return names;
}

GatheredTimes gather_timers(Timers& timers, const std::vector<std::string>& names, Communicator& world,
                            bool reset) {
  GatheredTimes g;
  g.names = names;
  g.world_size = world.size();
  g.times.assign(static_cast<size_t>(world.size()) * names.size(), 0.0f);
  if (names.empty()) return g;
  const std::vector<double> mine = timers.elapsed(names, reset);
  std::vector<float> row(mine.begin(), mine.end());
  // Megatron all-gathers (rather than gathers on the printing rank): every rank gets the matrix.
  world.all_gather(row.data(), g.times.data(), static_cast<int64_t>(row.size()), DType::kF32);
  return g;
}

void print_timers(const Timers& timers, const GatheredTimes& gathered, double normalizer) {
  if (!is_last_rank()) return;
  std::optional<std::string> report = format_timers(timers.log_option(), gathered, normalizer);
  if (report) print_rank_last(*report);
}

void log_timers(Timers& timers, const std::vector<std::string>& names, Communicator& world, double normalizer,
                bool reset) {
  print_timers(timers, gather_timers(timers, names, world, reset), normalizer);
}

void write_timers(const GatheredTimes& gathered, TensorBoardWriter* writer, int64_t iteration, double normalizer) {
  if (!writer) return;
  for (const TimerMinMax& m : timers_min_max(gathered, normalizer))
    writer->add_scalar(m.name + "-time", m.max, iteration);
}

}  // namespace gale
