// One training step (forward, backward, AdamW) of GPTModel on synthetic tokens, per op table:
// a quick way to see where a step's time goes without the data pipeline (bench/train_step is
// the end-to-end comparison with PyTorch).
#include <benchmark/benchmark.h>

#include "core/allocator.h"
#include "core/rng.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "bench_models.h"

namespace gale {
namespace {


void BM_TrainStep(benchmark::State& state) {
  const bool llama = state.range(0) != 0;
  ModelConfig c = bench::gpt2_small(llama);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(1);
  Optimizer opt(OptimizerConfig{}, &model.params(), &ops, make_self_communicator());
  MicroBatch mb = bench::random_batch(c, 4);
  for (auto _ : state) {
    model.params().zero_grads();
    GPTModel::LossSums s;
    model.forward(0, mb, Tensor(), true, &s);
    model.backward(0, Tensor(), static_cast<float>(1.0 / s.tokens));
    opt.step(1e-4, 0.01);
  }
  state.counters["tokens/s"] = benchmark::Counter(4.0 * 256, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_MiB"] = static_cast<double>(host_allocator().peak_bytes()) / (1 << 20);
}
BENCHMARK(BM_TrainStep)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
