// Where a GPT-2-small training step's time goes: every OpTable entry is wrapped with a steady-clock
// timer, so each op group's share of the step is measured inside the real model (forward, backward
// and the AdamW step), for the reference table and for the fused table of each ISA.
//
//   build/bench/kernels_step_profile_bench [--benchmark_filter=impl:3]
// Config: 12 layers, H 768, 12 heads, F 3072, V 50304, S 256, B 4 (T = 1024 tokens), fp32, dropout
// 0.1 (hidden and attention, Megatron's defaults), AdamW with clipping 1.0. Counters are ms per step
// (wall clock): one per op group, `other` = the rest of the step (the GEMMs of the linear layers,
// which are not OpTable entries, plus the model's own glue and the optimizer's norm and clipping
// passes), and tokens/s; the same with a `cpu_` prefix in process CPU time (all threads), the
// robust measure when other processes share the machine (run with OMP_NUM_THREADS=1 to compare).
#include <benchmark/benchmark.h>

#include <time.h>

#include <array>
#include <chrono>

#include <string>

#include "core/rng.h"
#include "kernels/cpu/fused_ops.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "bench_models.h"

namespace gale {
namespace {

enum Slot { kNorm, kBda, kBdaNorm, kGelu, kSwiglu, kRope, kAttnFwd, kAttnBwd, kEmbedding, kLmHead, kAdamW, kSlots };
constexpr const char* kSlotNames[kSlots] = {
    "norm",          "bias_dropout_add", "bias_dropout_add_norm", "gelu", "swiglu", "rope", "attention_fwd",
    "attention_bwd", "embedding",        "lm_head_loss",          "adamw"};

OpTable g_inner;
std::array<double, kSlots> g_seconds, g_cpu_seconds;

double process_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

template <auto Member, int kSlot, class Fn>
struct Timed;
template <auto Member, int kSlot, class R, class... A>
struct Timed<Member, kSlot, R (*)(A...)> {
  static R call(A... a) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
    (g_inner.*Member)(a...);
    g_cpu_seconds[kSlot] += process_cpu_seconds() - c0;
    g_seconds[kSlot] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

#define GALE_TIME(entry, slot) t.entry = &Timed<&OpTable::entry, slot, decltype(t.entry)>::call

OpTable timed_table(const OpTable& inner) {
  g_inner = inner;
  OpTable t = inner;
  GALE_TIME(norm_forward, kNorm);
  GALE_TIME(norm_backward, kNorm);
  GALE_TIME(bias_dropout_add, kBda);
  GALE_TIME(bias_dropout_add_backward, kBda);
  GALE_TIME(dropout, kBda);  // the embeddings' dropout, same kernels
  GALE_TIME(bias_dropout_add_norm, kBdaNorm);
  GALE_TIME(gelu_forward, kGelu);
  GALE_TIME(gelu_backward, kGelu);
  GALE_TIME(swiglu_forward, kSwiglu);
  GALE_TIME(swiglu_backward, kSwiglu);
  GALE_TIME(rope_forward, kRope);
  GALE_TIME(rope_backward, kRope);
  GALE_TIME(attention_forward, kAttnFwd);
  GALE_TIME(attention_backward, kAttnBwd);
  GALE_TIME(embedding_forward, kEmbedding);
  GALE_TIME(embedding_backward, kEmbedding);
  GALE_TIME(lm_head_loss_forward, kLmHead);
  GALE_TIME(lm_head_loss_backward, kLmHead);
  GALE_TIME(adamw_step, kAdamW);
  return t;
}


// range(0): 0 reference, 1 fused-scalar, 2 fused-avx2, 3 fused-avx512.
void BM_StepProfile(benchmark::State& state) {
  OpTable inner = reference_ops();
  if (state.range(0) > 0) {
    const Isa isa = static_cast<Isa>(state.range(0) - 1);
    if (fused_kernel_set(isa) == nullptr) {
      state.SkipWithError("ISA not supported by this CPU");
      return;
    }
    if (!install_all_fused_kernels(inner, isa).ok()) return;
  }
  state.SetLabel(inner.impl["attention"]);
  const ModelConfig c = bench::gpt2_small(/*llama=*/false, /*dropout=*/0.1f);
  const OpTable ops = timed_table(inner);
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(1);
  OptimizerConfig oc;
  oc.clip_grad = 1.0f;
  Optimizer opt(oc, &model.params(), &ops, make_self_communicator());
  const MicroBatch mb = bench::random_batch(c, 4);
  auto step = [&] {
    model.params().zero_grads();
    GPTModel::LossSums s;
    model.forward(0, mb, Tensor(), true, &s);
    model.backward(0, Tensor(), static_cast<float>(1.0 / s.tokens));
    opt.step(1e-4, 0.01);
  };
  step();  // warm-up: first-touch page faults, oneDNN kernel generation
  g_seconds.fill(0.0);
  g_cpu_seconds.fill(0.0);
  double total = 0.0, cpu_total = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
    step();
    cpu_total += process_cpu_seconds() - c0;
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double steps = static_cast<double>(state.iterations());
  double ops_total = 0.0, ops_cpu = 0.0;
  for (int s = 0; s < kSlots; ++s) {
    state.counters[kSlotNames[s]] = 1e3 * g_seconds[s] / steps;
    state.counters[std::string("cpu_") + kSlotNames[s]] = 1e3 * g_cpu_seconds[s] / steps;
    ops_total += g_seconds[s];
    ops_cpu += g_cpu_seconds[s];
  }
  state.counters["other"] = 1e3 * (total - ops_total) / steps;
  state.counters["cpu_other"] = 1e3 * (cpu_total - ops_cpu) / steps;
  state.counters["step"] = 1e3 * total / steps;
  state.counters["cpu_step"] = 1e3 * cpu_total / steps;
  state.counters["tokens/s"] = 4.0 * 256 * steps / total;
}
BENCHMARK(BM_StepProfile)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->ArgName("impl")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
