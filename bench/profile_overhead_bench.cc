// What --profile costs a training step (README "Profiling"): the same small GPT step, in one
// process, with the op table as it runs without --profile, with the tracing wrappers installed but
// no window open (a --profile run outside its window), and recording at level0 and at level2 with
// --profile-with-memory. The four are interleaved round by round so that they see the same machine
// load; counters are process CPU milliseconds per step (all threads), the robust measure on a
// shared machine, and wall milliseconds.
//
//   build/bench/profile_overhead_bench [--benchmark_min_time=...]
// Model: 4 layers, H 256, 8 heads, F 1024, vocabulary 8192, S 128, B 4, fp32, no dropout, AdamW;
// forward, backward and optimizer each inside a step-phase scope (core/timers.h) as in training.
#include <benchmark/benchmark.h>

#include <time.h>

#include <array>
#include <chrono>

#include "core/timers.h"
#include "core/trace.h"
#include "kernels/cpu/fused_ops.h"
#include "kernels/op_trace.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "bench_models.h"

namespace gale {
namespace {

double process_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

void BM_ProfileOverhead(benchmark::State& state) {
  OpTable plain = reference_ops();
  if (!install_all_fused_kernels(plain, Isa::kAvx512).ok()) {
    state.SkipWithError("no fused kernels");
    return;
  }
  OpTable traced = plain;
  install_op_tracing(&traced);
  OpTable table = plain;
  ModelConfig c = bench::gpt2_small();
  c.num_layers = 4;
  c.hidden = 256;
  c.heads = c.kv_heads = 8;
  c.head_dim = 32;
  c.ffn = 1024;
  c.vocab = 8192;
  c.seq_length = c.max_positions = 128;
  GPTModel model(c, single_process_partition(c), &table);
  model.params().initialize(1);
  OptimizerConfig oc;
  Optimizer opt(oc, &model.params(), &table, make_self_communicator());
  MicroBatch mb = bench::random_batch(c, 4);
  for (int32_t& t : mb.tokens) t %= 8192;
  for (int32_t& t : mb.labels) t %= 8192;
  Timers timers(0, TimingLogOption::kMinMax);
  const uint32_t all = static_cast<uint32_t>(TraceCategory::kStep) | static_cast<uint32_t>(TraceCategory::kKernel) |
                       static_cast<uint32_t>(TraceCategory::kComm);
  const std::array<TraceOptions, 2> recording = {
      TraceOptions{static_cast<uint32_t>(TraceCategory::kStep) | static_cast<uint32_t>(TraceCategory::kKernel), false,
                   false},
      TraceOptions{all, true, true}};
  auto step = [&](int mode) {
    table = mode == 0 ? plain : traced;
    std::unique_ptr<TraceRecorder> rec;
    if (mode >= 2) {
      rec = std::make_unique<TraceRecorder>(recording[static_cast<size_t>(mode - 2)], 0);
      rec->open_window();
    }
    model.params().zero_grads();
    GPTModel::LossSums s;
    {
      ScopedTimer t(&timers, "forward-compute", 2, false, {{"microbatch", 0}, {"chunk", 0}});
      model.forward(0, mb, Tensor(), true, &s);
    }
    {
      ScopedTimer t(&timers, "backward-compute", 2, false, {{"microbatch", 0}, {"chunk", 0}});
      model.backward(0, Tensor(), static_cast<float>(1.0 / s.tokens));
    }
    {
      ScopedTimer t(&timers, "optimizer", 1);
      opt.step(1e-4, 0.01);
    }
    if (rec) {
      rec->close_window();
      state.counters["events"] = static_cast<double>(rec->size());
    }
  };
  for (int mode = 0; mode < 4; ++mode) step(mode);  // warm-up: page faults, oneDNN kernels
  std::array<double, 4> cpu{}, wall{};
  for (auto _ : state) {
    for (int mode = 0; mode < 4; ++mode) {
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = process_cpu_seconds();
      step(mode);
      cpu[static_cast<size_t>(mode)] += process_cpu_seconds() - c0;
      wall[static_cast<size_t>(mode)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  const double n = static_cast<double>(state.iterations());
  const char* names[4] = {"plain", "traced_idle", "level0", "level2_memory"};
  for (int mode = 0; mode < 4; ++mode) {
    state.counters[std::string("cpu_ms_") + names[mode]] = 1e3 * cpu[static_cast<size_t>(mode)] / n;
    state.counters[std::string("ms_") + names[mode]] = 1e3 * wall[static_cast<size_t>(mode)] / n;
  }
}
BENCHMARK(BM_ProfileOverhead)->Unit(benchmark::kMillisecond)->Iterations(20);

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
