// Generation on the GPT-2-small benchmark model: a 64-token prompt continued by 64 tokens, with the
// KV cache (the prompt in one pass, then one token per step) and without it (the whole sequence
// again every step, what `gale generate` did before the cache). Reports generated tokens/s.
#include <benchmark/benchmark.h>

#include "bench_models.h"
#include "kernels/cpu/fused_ops.h"
#include "model/kv_cache.h"

namespace gale {
namespace {

constexpr int64_t kPrompt = 64, kNew = 64;

MicroBatch tokens_batch(const std::vector<int32_t>& ids) {
  MicroBatch mb;
  mb.B = 1;
  mb.S = static_cast<int64_t>(ids.size());
  mb.tokens = ids;
  for (int64_t s = 0; s < mb.S; ++s) mb.position_ids.push_back(static_cast<int32_t>(s));
  return mb;
}

int32_t greedy(const Tensor& logits, int64_t row, int64_t V) {
  const float* l = logits.data<float>() + row * V;
  return static_cast<int32_t>(std::max_element(l, l + 50257) - l);
}

void BM_Generate(benchmark::State& state) {
  const bool cached = state.range(0) != 0;
  ModelConfig c = bench::gpt2_small();
  OpTable ops = reference_ops();
  GALE_CHECK_OK(install_all_fused_kernels(ops, detected_isa()));
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(1);
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < kPrompt; ++i) prompt.push_back(static_cast<int32_t>(uniform_at(1, 2, i) * 50257));
  for (auto _ : state) {
    std::vector<int32_t> ids = prompt;
    if (cached) {
      KvCache cache = make_kv_cache(c, model.partition(), 1, c.max_positions);
      Tensor logits = model.forward_logits(tokens_batch(ids), Tensor(), &cache);
      for (int64_t step = 0; step < kNew; ++step) {
        ids.push_back(greedy(logits, logits.size(1) - 1, c.vocab));
        if (step + 1 < kNew) logits = model.forward_logits(tokens_batch({ids.back()}), Tensor(), &cache);
      }
    } else {
      for (int64_t step = 0; step < kNew; ++step) {
        const Tensor logits = model.forward_logits(tokens_batch(ids), Tensor());
        ids.push_back(greedy(logits, static_cast<int64_t>(ids.size()) - 1, c.vocab));
      }
    }
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(kNew), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Generate)->ArgName("kv_cache")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(2);

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
