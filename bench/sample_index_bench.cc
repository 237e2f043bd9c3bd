// Building GPTDataset indices (document, sample and shuffle index) for 10^8 tokens, as Megatron
// does at start-up for every dataset and split. Target: well under 1 s.
//   build/bench/sample_index_bench
#include <benchmark/benchmark.h>

#include <vector>

#include "data/gpt_indices.h"
#include "data/numpy_random.h"

namespace gale {
namespace {

// Document lengths uniform in [1, 2*mean) (numpy default_rng(0) draws) until 10^8 tokens.
std::vector<int32_t> lengths_for(int64_t total_tokens, int32_t mean) {
  NumpyDefaultRng rng(0);
  std::vector<int32_t> out;
  int64_t sum = 0;
  while (sum < total_tokens) {
    std::vector<int32_t> batch = rng.integers_int32(1, 2 * mean, 4096);
    for (int32_t l : batch) {
      out.push_back(l);
      sum += l;
      if (sum >= total_tokens) break;
    }
  }
  return out;
}

// Args: mean document length, sequence length, epochs of samples requested (1 = one epoch).
void BM_BuildGptIndices(benchmark::State& state) {
  const int64_t kTokens = 100'000'000;
  std::vector<int32_t> sizes = lengths_for(kTokens, static_cast<int32_t>(state.range(0)));
  UnalignedArray<int32_t> view(sizes.data(), static_cast<int64_t>(sizes.size()));
  GptIndexParams p;
  p.seq_length = state.range(1);
  p.num_samples = state.range(2) * (kTokens / p.seq_length) - 10;  // needs range(2) epochs
  int64_t samples = 0;
  for (auto _ : state) {
    auto g = build_gpt_indices(view, 0, view.size(), p, "bench");
    if (!g.ok()) state.SkipWithError(g.status().message().c_str());
    samples = g->size();
    benchmark::DoNotOptimize(g->shuffle_index.data());
  }
  state.counters["documents"] = static_cast<double>(sizes.size());
  state.counters["samples"] = static_cast<double>(samples);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(kTokens) * state.range(2), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_BuildGptIndices)
    ->ArgNames({"mean_doc", "seq", "epochs"})
    ->Args({2048, 2048, 1})
    ->Args({500, 2048, 1})
    ->Args({500, 1024, 3})
    ->Args({100, 128, 1})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
