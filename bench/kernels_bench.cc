// Reference vs fused kernels at GPT-2-small shapes (T = S·B = 256·4 tokens, H 768, F 3072, 12 heads
// of 64, V 50304), with achieved GB/s (memory-bound kernels) or GFLOP/s (attention, LM head).
//
//   build/bench/kernels_bench [--benchmark_filter=Attention]
// Every benchmark's last argument is the implementation: 0 reference, 1 fused-scalar, 2 fused-avx2,
// 3 fused-avx512 (skipped when the CPU lacks it). The first benchmark, MemoryCopy, measures this
// machine's copy bandwidth (read + write bytes), the roof for the memory-bound kernels.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/rng.h"
#include "core/threads.h"
#include "kernels/cpu/fused_geglu.h"
#include "kernels/cpu/fused_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/quant_states.h"
#include "kernels/op_table.h"

namespace gale {
namespace {

constexpr int64_t kS = 256, kB = 4, kT = kS * kB, kH = 768, kF = 3072, kNH = 12, kHD = 64, kV = 50304;

std::vector<float> rand_vec(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  fill_uniform(v.data(), n, seed, 1, 0);
  for (auto& x : v) x = scale * (2.0f * x - 1.0f);
  return v;
}

// The op table of implementation `impl` (see the file comment), or false when unavailable.
bool table_for(benchmark::State& state, int64_t impl, OpTable* table) {
  *table = reference_ops();
  if (impl == 0) return true;
  const Isa isa = static_cast<Isa>(impl - 1);
  if (fused_kernel_set(isa) == nullptr) {
    state.SkipWithError("ISA not supported by this CPU");
    return false;
  }
  const Status st = install_all_fused_kernels(*table, isa);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return false;
  }
  state.SetLabel(table->impl["norm"]);
  return true;
}

void set_bytes(benchmark::State& state, double bytes_per_iter) {
  state.counters["GB/s"] = benchmark::Counter(bytes_per_iter * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
void set_flops(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops_per_iter * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void ImplArgs(benchmark::internal::Benchmark* b) {
  for (int impl : {0, 1, 2, 3}) b->Arg(impl);
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

// ---- machine roof

void BM_MemoryCopy(benchmark::State& state) {
  const int64_t n = 64ll << 20;  // 256 MiB each way
  std::vector<float> a = rand_vec(n, 1), b(n);
  for (auto _ : state) {
    parallel_for(n, 1 << 16, [&](int64_t i0, int64_t i1) {
      std::memcpy(b.data() + i0, a.data() + i0, sizeof(float) * static_cast<size_t>(i1 - i0));
    });
    benchmark::DoNotOptimize(b.data());
  }
  set_bytes(state, 2.0 * 4 * n);
}
BENCHMARK(BM_MemoryCopy)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Sgemm(benchmark::State& state) {  // the fc1 GEMM, T x F x H
  auto x = rand_vec(kT * kH, 2), w = rand_vec(kF * kH, 3);
  std::vector<float> y(kT * kF);
  for (auto _ : state) sgemm(false, true, kT, kF, kH, 1.0f, x.data(), kH, w.data(), kH, 0.0f, y.data(), kF);
  set_flops(state, 2.0 * kT * kF * kH);
}
BENCHMARK(BM_Sgemm)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- norms and the residual stream

void BM_LayerNormForward(benchmark::State& state) {
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  auto x = rand_vec(kT * kH, 4), w = rand_vec(kH, 5), b = rand_vec(kH, 6);
  std::vector<float> y(kT * kH), st(2 * kT);
  for (auto _ : state) t.norm_forward(NormSpec{}, x.data(), w.data(), b.data(), y.data(), st.data(), kT, kH);
  set_bytes(state, 2.0 * 4 * kT * kH);
}
BENCHMARK(BM_LayerNormForward)->Apply(ImplArgs);

void BM_LayerNormBackward(benchmark::State& state) {
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  auto x = rand_vec(kT * kH, 4), w = rand_vec(kH, 5), dy = rand_vec(kT * kH, 7);
  std::vector<float> y(kT * kH), st(2 * kT), dx(kT * kH), dw(kH), db(kH);
  reference_ops().norm_forward(NormSpec{}, x.data(), w.data(), nullptr, y.data(), st.data(), kT, kH);
  for (auto _ : state)
    t.norm_backward(NormSpec{}, dy.data(), x.data(), w.data(), st.data(), dx.data(), dw.data(), db.data(), kT, kH);
  set_bytes(state, 3.0 * 4 * kT * kH);
}
BENCHMARK(BM_LayerNormBackward)->Apply(ImplArgs);

void BM_RMSNormForwardBackward(benchmark::State& state) {
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  const NormSpec rms{true, 1e-5f};
  auto x = rand_vec(kT * kH, 4), w = rand_vec(kH, 5), dy = rand_vec(kT * kH, 7);
  std::vector<float> y(kT * kH), st(kT), dx(kT * kH), dw(kH);
  for (auto _ : state) {
    t.norm_forward(rms, x.data(), w.data(), nullptr, y.data(), st.data(), kT, kH);
    t.norm_backward(rms, dy.data(), x.data(), w.data(), st.data(), dx.data(), dw.data(), nullptr, kT, kH);
  }
  set_bytes(state, 5.0 * 4 * kT * kH);
}
BENCHMARK(BM_RMSNormForwardBackward)->Apply(ImplArgs);

struct DropoutRows {
  std::vector<int64_t> ids = std::vector<int64_t>(kT);
  DropoutSpec spec;
  explicit DropoutRows(float p) {
    std::iota(ids.begin(), ids.end(), 0);
    spec.p = p;
    spec.seed = 1;
    spec.stream = 2;
    spec.row_ids = ids.data();
    spec.cols_total = kH;
  }
};

void BM_BiasDropoutAdd(benchmark::State& state) {  // the end of the MLP block, dropout 0.1
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  DropoutRows d(0.1f);
  auto x = rand_vec(kT * kH, 8), bias = rand_vec(kH, 9), res = rand_vec(kT * kH, 10);
  std::vector<float> scratch(kT * kH), out(kT * kH);
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(scratch.data(), x.data(), sizeof(float) * scratch.size());  // the reference overwrites x
    state.ResumeTiming();
    t.bias_dropout_add(scratch.data(), bias.data(), res.data(), out.data(), kT, kH, d.spec);
  }
  set_bytes(state, 3.0 * 4 * kT * kH);
}
BENCHMARK(BM_BiasDropoutAdd)->Apply(ImplArgs);

void BM_BiasDropoutAddBackward(benchmark::State& state) {
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  DropoutRows d(0.1f);
  auto dout = rand_vec(kT * kH, 11);
  std::vector<float> dx(kT * kH), db(kH);
  for (auto _ : state) t.bias_dropout_add_backward(dout.data(), dx.data(), db.data(), kT, kH, d.spec);
  set_bytes(state, 2.0 * 4 * kT * kH);
}
BENCHMARK(BM_BiasDropoutAddBackward)->Apply(ImplArgs);

void BM_BiasDropoutAddNorm(benchmark::State& state) {  // x_mid = x + dropout(proj + b); LayerNorm(x_mid)
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  DropoutRows d(0.1f);
  auto x = rand_vec(kT * kH, 8), bias = rand_vec(kH, 9), res = rand_vec(kT * kH, 10), w = rand_vec(kH, 12);
  std::vector<float> scratch(kT * kH), out(kT * kH), y(kT * kH), st(2 * kT);
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(scratch.data(), x.data(), sizeof(float) * scratch.size());
    state.ResumeTiming();
    t.bias_dropout_add_norm(scratch.data(), bias.data(), res.data(), out.data(), NormSpec{}, w.data(), bias.data(),
                            y.data(), st.data(), kT, kH, d.spec);
  }
  set_bytes(state, 4.0 * 4 * kT * kH);
}
BENCHMARK(BM_BiasDropoutAddNorm)->Apply(ImplArgs);

// ---- MLP activations

void BM_GeluForward(benchmark::State& state) {
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  auto u0 = rand_vec(kT * kF, 13, 3.0f), bias = rand_vec(kF, 14, 0.01f);
  std::vector<float> u = u0, act(kT * kF);
  for (auto _ : state) t.gelu_forward(u.data(), bias.data(), act.data(), kT, kF);  // u drifts by the bias: harmless
  set_bytes(state, 3.0 * 4 * kT * kF);
}
BENCHMARK(BM_GeluForward)->Apply(ImplArgs);

void BM_GeluBackward(benchmark::State& state) {
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  auto u = rand_vec(kT * kF, 13, 3.0f), dact = rand_vec(kT * kF, 15);
  std::vector<float> du(kT * kF), db(kF);
  for (auto _ : state) t.gelu_backward(dact.data(), u.data(), du.data(), db.data(), kT, kF);
  set_bytes(state, 3.0 * 4 * kT * kF);
}
BENCHMARK(BM_GeluBackward)->Apply(ImplArgs);

void BM_SwigluForwardBackward(benchmark::State& state) {  // LLaMA-style MLP, F = 2048 (fc1 2F = 4096)
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  const int64_t F = 2048;
  auto u = rand_vec(kT * 2 * F, 16, 3.0f), dact = rand_vec(kT * F, 17);
  std::vector<float> act(kT * F), du(kT * 2 * F);
  for (auto _ : state) {
    t.swiglu_forward(u.data(), nullptr, act.data(), kT, F);
    t.swiglu_backward(dact.data(), u.data(), du.data(), nullptr, kT, F);
  }
  set_bytes(state, 4 * (3.0 * kT * F + 5.0 * kT * F));
}
BENCHMARK(BM_SwigluForwardBackward)->Apply(ImplArgs);

// Gemma's MLP (MindSpeed-LLM's --gelu-tanh, and the exact --geglu), the SwiGLU shape: the kernels
// table.impl["geglu"] names (the reference, or the fused build installed with the swiglu group).
void geglu_forward_backward(benchmark::State& state, GegluGate gate) {
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  const GegluKernels k = geglu_kernels(t);
  const int64_t F = 2048;
  auto u = rand_vec(kT * 2 * F, 16, 3.0f), dact = rand_vec(kT * F, 17);
  std::vector<float> act(kT * F), du(kT * 2 * F);
  for (auto _ : state) {
    k.forward(gate, u.data(), nullptr, act.data(), kT, F);
    k.backward(gate, dact.data(), u.data(), du.data(), nullptr, kT, F);
  }
  set_bytes(state, 4 * (3.0 * kT * F + 5.0 * kT * F));
}
void BM_GegluTanhForwardBackward(benchmark::State& state) { geglu_forward_backward(state, GegluGate::kTanh); }
BENCHMARK(BM_GegluTanhForwardBackward)->Apply(ImplArgs);
void BM_GegluErfForwardBackward(benchmark::State& state) { geglu_forward_backward(state, GegluGate::kErf); }
BENCHMARK(BM_GegluErfForwardBackward)->Apply(ImplArgs);

// ---- RoPE, embedding, AdamW

void BM_RopeForward(benchmark::State& state) {  // q and k heads inside the packed QKV rows
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  const RopeTables tables = make_rope_tables(kS, kHD, 10000.0);
  auto qkv = rand_vec(kT * 3 * kH, 18);
  std::vector<int32_t> pos(kB * kS);
  for (int64_t i = 0; i < kB * kS; ++i) pos[i] = static_cast<int32_t>(i % kS);
  const HeadLayout ql = qkv_query_layout(kNH, kNH, kHD), kl = qkv_key_layout(kNH, kNH, kHD);
  for (auto _ : state) {
    t.rope_forward(qkv.data(), ql, kNH, kS, kB, kHD, pos.data(), tables);
    t.rope_forward(qkv.data(), kl, kNH, kS, kB, kHD, pos.data(), tables);
  }
  set_bytes(state, 2.0 * 2 * 4 * kT * kH);
}
BENCHMARK(BM_RopeForward)->Apply(ImplArgs);

void BM_EmbeddingForwardBackward(benchmark::State& state) {
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  std::vector<int32_t> ids(kT);
  for (int64_t i = 0; i < kT; ++i) ids[i] = static_cast<int32_t>((i * 7919) % kV);
  auto W = rand_vec(kV * kH, 19), dout = rand_vec(kT * kH, 20);
  std::vector<float> out(kT * kH), dW(kV * kH);
  for (auto _ : state) {
    t.embedding_forward(ids.data(), kT, W.data(), 0, kV, kH, out.data());
    t.embedding_backward(ids.data(), kT, dout.data(), 0, kV, kH, dW.data());
  }
  set_bytes(state, 4.0 * 4 * kT * kH);
}
BENCHMARK(BM_EmbeddingForwardBackward)->Apply(ImplArgs);

void BM_AdamW(benchmark::State& state) {  // 16 M parameters (GPT-2 small has 124 M)
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  const int64_t n = 16ll << 20;
  auto p = rand_vec(n, 21), g = rand_vec(n, 22, 0.01f);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  AdamWHyper h;
  h.lr = 1e-4f;
  h.weight_decay = 0.1f;
  for (auto _ : state) {
    t.adamw_step(p.data(), g.data(), m.data(), v.data(), n, h);
    ++h.step;
  }
  set_bytes(state, 7.0 * 4 * n);  // read p, g, m, v; write p, m, v
}
BENCHMARK(BM_AdamW)->Apply(ImplArgs)->Unit(benchmark::kMillisecond);

// --optimizer-selection fused_ema_adamw: the same step plus the parameters' EMA in one pass.
void BM_EmaAdamW(benchmark::State& state) {  // 16 M parameters, as BM_AdamW
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  const int64_t n = 16ll << 20;
  auto p = rand_vec(n, 21), g = rand_vec(n, 22, 0.01f);
  std::vector<float> m(n, 0.0f), v(n, 0.0f), s = p;
  AdamWHyper h;
  h.lr = 1e-4f;
  h.weight_decay = 0.1f;
  for (auto _ : state) {
    t.ema_adamw_step(p.data(), g.data(), m.data(), v.data(), s.data(), n, h, 0.9999f);
    ++h.step;
  }
  set_bytes(state, 9.0 * 4 * n);  // read p, g, m, v, s; write p, m, v, s
}
BENCHMARK(BM_EmaAdamW)->Apply(ImplArgs)->Unit(benchmark::kMillisecond);

// --quant-states fp8 (arg 1 = 0: E4M3/E5M2 codes, f32 scale per 128), mxfp8 (1: k-scaled, E8M0
// scale per 32) and hif8 (2: HiFloat8 codes, f32 scale per 128): AdamW over 8-bit-coded moments,
// 4 M parameters (the reference is slow). Bytes: read p, g, both codes; write p, both codes (scales
// not counted).
void BM_QuantisedAdamW(benchmark::State& state) {
  const int64_t impl = state.range(0);
  const QuantLayout layout = state.range(1) == 0   ? QuantLayout{QuantMode::kLinear, 128, 128}
                             : state.range(1) == 1 ? QuantLayout{QuantMode::kMx, 32, 32}
                                                   : QuantLayout{QuantMode::kHiF8, 128, 128};
  if (impl > 0 && static_cast<int>(impl - 1) > static_cast<int>(hardware_isa())) {
    state.SkipWithError("ISA not supported by this CPU");
    return;
  }
  const int64_t n = 4ll << 20, sb = quant_num_blocks(n, layout) * quant_scale_bytes(layout.mode);
  auto p = rand_vec(n, 21), g = rand_vec(n, 22, 0.01f);
  std::vector<uint8_t> mc(n), vc(n), ms(sb), vs(sb);
  const bool hif8 = layout.mode == QuantMode::kHiF8;
  const QuantStateRef m{mc.data(), ms.data(), hif8 ? Fp8Format::kHiF8 : Fp8Format::kE4M3, kHiF8TargetExpAvg};
  const QuantStateRef v{vc.data(), vs.data(), hif8 ? Fp8Format::kHiF8 : Fp8Format::kE5M2, kHiF8TargetExpAvgSq};
  const std::vector<float> zero(n, 0.0f);
  quantise_state_ref(zero.data(), n, layout, m);
  quantise_state_ref(zero.data(), n, layout, v);
  AdamWHyper h;
  h.lr = 1e-4f;
  h.weight_decay = 0.1f;
  state.SetLabel(impl == 0 ? "reference" : isa_name(static_cast<Isa>(impl - 1)));
  for (auto _ : state) {
    if (impl == 0)
      adamw_step_quantised_ref(p.data(), g.data(), m, v, n, layout, h);
    else
      adamw_step_quantised_isa(static_cast<Isa>(impl - 1), p.data(), g.data(), m, v, n, layout, h);
    ++h.step;
  }
  set_bytes(state, 14.0 * n);
}
BENCHMARK(BM_QuantisedAdamW)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1, 2}})
    ->ArgNames({"impl", "mode"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_SumOfSquares(benchmark::State& state) {  // the gradient norm for --clip-grad, over 64 M values
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  const int64_t n = 64ll << 20;
  auto g = rand_vec(n, 23, 0.01f);
  for (auto _ : state) benchmark::DoNotOptimize(t.sum_of_squares(g.data(), n));
  set_bytes(state, 4.0 * n);
}
BENCHMARK(BM_SumOfSquares)->Apply(ImplArgs)->Unit(benchmark::kMillisecond);

// ---- attention (B 4, S 256, 12 heads of 64, causal, as in the GPT-2 config), dropout off / 0.1

struct AttentionSetup {
  std::vector<float> qkv, out, lse, dout, dqkv;
  std::vector<int64_t> samples = std::vector<int64_t>(kB);
  AttentionProblem p;
  HeadLayout ql = qkv_query_layout(kNH, kNH, kHD), kl = qkv_key_layout(kNH, kNH, kHD),
             vl = qkv_value_layout(kNH, kNH, kHD);
  explicit AttentionSetup(float dropout) {
    qkv = rand_vec(kT * 3 * kH, 23);
    out.resize(kT * kH);
    lse.resize(kB * kNH * kS);
    dout = rand_vec(kT * kH, 24);
    dqkv.resize(qkv.size());
    std::iota(samples.begin(), samples.end(), 0);
    p.B = kB;
    p.Sq = p.Sk = kS;
    p.NH = p.KV = kNH;
    p.HD = kHD;
    p.scale = 0.125f;
    p.dropout_p = dropout;
    p.dropout_seed = 3;
    p.sample_ids = samples.data();
    p.heads_total = kNH;
    p.max_positions = kS;
  }
  // Useful FLOPs of the visible (causal) pairs: 4·pairs·HD forward, 8·pairs·HD backward.
  double pairs() const { return static_cast<double>(kB * kNH) * kS * (kS + 1) / 2; }
};

void BM_AttentionForward(benchmark::State& state) {
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  AttentionSetup a(state.range(1) ? 0.1f : 0.0f);
  const float* q = a.qkv.data();
  for (auto _ : state) t.attention_forward(a.p, q, a.ql, q, a.kl, q, a.vl, a.out.data(), a.lse.data());
  set_flops(state, 4.0 * a.pairs() * kHD);
}
BENCHMARK(BM_AttentionForward)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}})
    ->ArgNames({"impl", "dropout"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_AttentionBackward(benchmark::State& state) {
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  AttentionSetup a(state.range(1) ? 0.1f : 0.0f);
  const float* q = a.qkv.data();
  t.attention_forward(a.p, q, a.ql, q, a.kl, q, a.vl, a.out.data(), a.lse.data());
  float* d = a.dqkv.data();
  for (auto _ : state)
    t.attention_backward(a.p, q, a.ql, q, a.kl, q, a.vl, a.out.data(), a.lse.data(), a.dout.data(), d, d, d);
  set_flops(state, 8.0 * a.pairs() * kHD);
}
BENCHMARK(BM_AttentionBackward)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}})
    ->ArgNames({"impl", "dropout"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- LM head + cross-entropy, forward + backward (T 1024, V 50304, H 768); 3 GEMMs of 2·T·V·H.
// eager 1: dloss given at forward time (single vocabulary slice); 0: backward recomputes logits.

void BM_LmHeadLoss(benchmark::State& state) {
  OpTable t;
  if (!table_for(state, state.range(0), &t)) return;
  const bool eager = state.range(1) != 0;
  auto x = rand_vec(kT * kH, 25), W = rand_vec(kV * kH, 26, 0.05f);
  std::vector<int32_t> targets(kT);
  for (int64_t i = 0; i < kT; ++i) targets[i] = static_cast<int32_t>((i * 31) % kV);
  std::vector<float> dloss(kT, 1.0f / kT), st(3 * kT), lse(kT), dx(kT * kH), dW(kV * kH, 0.0f);
  for (auto _ : state) {
    LmHeadProblem p{kT,
                    kH,
                    kV,
                    0,
                    x.data(),
                    W.data(),
                    targets.data(),
                    true,
                    eager ? dloss.data() : nullptr,
                    eager ? dW.data() : nullptr};
    Tensor saved;
    t.lm_head_loss_forward(p, st.data(), st.data() + kT, st.data() + 2 * kT, &saved);
    for (int64_t i = 0; i < kT; ++i) lse[i] = st[i] + std::log(st[kT + i]);
    t.lm_head_loss_backward(p, lse.data(), dloss.data(), dx.data(), dW.data(), &saved);
  }
  set_flops(state, 3.0 * 2.0 * kT * kV * kH);
}
BENCHMARK(BM_LmHeadLoss)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}})
    ->ArgNames({"impl", "eager"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
