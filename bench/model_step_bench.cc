// One training step (forward, backward, AdamW) of GPTModel on synthetic tokens, per op table:
// a quick way to see where a step's time goes without the data pipeline (bench/train_step is
// the end-to-end comparison with PyTorch).
#include <benchmark/benchmark.h>

#include "core/allocator.h"
#include "core/rng.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"

namespace gale {
namespace {

ModelConfig gpt2_small(bool llama) {
  ModelConfig c;
  c.num_layers = 12;
  c.hidden = 768;
  c.heads = 12;
  c.kv_heads = llama ? 4 : 12;
  c.head_dim = 64;
  c.ffn = llama ? 2048 : 3072;
  c.vocab = 50304;
  c.seq_length = 256;
  c.max_positions = 256;
  if (llama) {
    c.rms_norm = true;
    c.swiglu = true;
    c.add_bias_linear = false;
    c.tied_embeddings = false;
    c.position = PositionEmbedding::kRope;
  }
  return c;
}

MicroBatch batch(const ModelConfig& c, int64_t B) {
  MicroBatch mb;
  mb.B = B;
  mb.S = c.seq_length;
  for (int64_t i = 0; i < B * mb.S; ++i) {
    mb.tokens.push_back(static_cast<int32_t>(uniform_at(1, 2, i) * 50257));
    mb.labels.push_back(static_cast<int32_t>(uniform_at(1, 3, i) * 50257));
    mb.loss_mask.push_back(1.0f);
    mb.position_ids.push_back(static_cast<int32_t>(i % mb.S));
  }
  return mb;
}

void BM_TrainStep(benchmark::State& state) {
  const bool llama = state.range(0) != 0;
  ModelConfig c = gpt2_small(llama);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(1);
  Optimizer opt(OptimizerConfig{}, &model.params(), &ops, make_self_communicator());
  MicroBatch mb = batch(c, 4);
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
