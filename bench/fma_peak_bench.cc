// FP32 FMA peak of this machine on 1..N threads, AVX-512 and AVX2 (see fma_peak.h for the method).
//
//   build/bench/fma_peak_bench                       # all ISAs, 1..OMP threads
//   build/bench/fma_peak_bench --benchmark_filter='avx512/threads:2$' --benchmark_format=json
//
// The counter GFLOP/s is FLOPs / wall time of the timed region (manual time, warm-up excluded).
#include <benchmark/benchmark.h>

#include <string>

#include "core/threads.h"
#include "fma_peak.h"

namespace {

using gale::bench::FmaIsa;

void BM_FmaPeak(benchmark::State& state, FmaIsa isa, int threads) {
  if (!gale::bench::fma_isa_supported(isa)) {
    state.SkipWithError("this CPU does not support the ISA");
    return;
  }
  const int64_t iterations = int64_t{1} << 20;  // per thread per benchmark iteration (~3 ms)
  float sink = 0;
  double flops = 0;
  for (auto _ : state) {
    state.SetIterationTime(gale::bench::fma_loop_seconds(isa, threads, iterations, &sink));
    flops += static_cast<double>(threads) * iterations * gale::bench::fma_flops_per_iteration(isa);
  }
  benchmark::DoNotOptimize(sink);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s/thread"] = benchmark::Counter(flops * 1e-9 / threads, benchmark::Counter::kIsRate);
}

void register_all() {
  int max_threads = gale::num_threads();
  for (FmaIsa isa : {FmaIsa::kAvx512, FmaIsa::kAvx2}) {
    for (int t = 1; t <= max_threads; ++t) {
      std::string name = std::string("fma_peak/") + gale::bench::fma_isa_name(isa) + "/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(name.c_str(), BM_FmaPeak, isa, t)->UseManualTime()->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
