// Attention alone at long sequences: reference (full [S, S] score rows per head) vs flash attention,
// time and peak memory. B 1, 12 heads of 64, causal, no dropout, S 4096 and 8192.
//
//   build/bench/attention_bench
// Arguments: S, pass (0 forward, 1 forward + backward), impl (0 reference, 1 fused-scalar,
// 2 fused-avx2, 3 fused-avx512). Counters: GFLOP/s of the visible (causal) pairs (forward 4·HD,
// backward 8·HD per pair); peak_MiB = growth of the process's peak resident set during the run
// (VmHWM, reset through /proc/self/clear_refs), so it covers the reference's std::vector score
// buffers too; alloc_MiB = peak of Gale's counting allocator above the inputs (flash scratch).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <numeric>
#include <vector>

#include "core/allocator.h"
#include "core/rng.h"
#include "kernels/cpu/fused_ops.h"
#include "kernels/op_table.h"

namespace gale {
namespace {

constexpr int64_t kB = 1, kNH = 12, kHD = 64;

bool reset_peak_rss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  std::fclose(f);
  return ok;
}

void BM_LongAttention(benchmark::State& state) {
  const int64_t S = state.range(0);
  const bool backward = state.range(1) != 0;
  const int64_t impl = state.range(2);
  OpTable ops = reference_ops();
  if (impl > 0) {
    const Isa isa = static_cast<Isa>(impl - 1);
    if (fused_kernel_set(isa) == nullptr) {
      state.SkipWithError("ISA not supported by this CPU");
      return;
    }
    if (!install_fused_kernel(ops, "attention", isa).ok()) return;
  }
  state.SetLabel(ops.impl["attention"]);
  const int64_t T = S * kB, row = 3 * kNH * kHD;
  std::vector<float> qkv(T * row), out(T * kNH * kHD), lse(kB * kNH * S), dout(out.size()), dqkv(qkv.size());
  fill_uniform(qkv.data(), static_cast<int64_t>(qkv.size()), 1, 1, 0);
  fill_uniform(dout.data(), static_cast<int64_t>(dout.size()), 2, 1, 0);
  std::vector<int64_t> samples(kB);
  std::iota(samples.begin(), samples.end(), 0);
  AttentionProblem p;
  p.B = kB;
  p.Sq = p.Sk = S;
  p.NH = p.KV = kNH;
  p.HD = kHD;
  p.scale = 0.125f;
  p.sample_ids = samples.data();
  p.heads_total = kNH;
  p.max_positions = S;
  const HeadLayout ql = qkv_query_layout(kNH, kNH, kHD), kl = qkv_key_layout(kNH, kNH, kHD),
                   vl = qkv_value_layout(kNH, kNH, kHD);
  const float* q = qkv.data();
  float* d = dqkv.data();
  if (backward) ops.attention_forward(p, q, ql, q, kl, q, vl, out.data(), lse.data());  // lse and out for backward
  const int64_t rss_before = current_rss_bytes();
  const bool rss_ok = reset_peak_rss();
  host_allocator().reset_peak();
  const int64_t alloc_before = host_allocator().current_bytes();
  for (auto _ : state) {
    if (backward)
      ops.attention_backward(p, q, ql, q, kl, q, vl, out.data(), lse.data(), dout.data(), d, d, d);
    else
      ops.attention_forward(p, q, ql, q, kl, q, vl, out.data(), lse.data());
  }
  const double pairs = static_cast<double>(kB * kNH) * S * (S + 1) / 2;
  state.counters["GFLOP/s"] =
      benchmark::Counter((backward ? 8.0 : 4.0) * pairs * kHD * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (rss_ok) state.counters["peak_MiB"] = static_cast<double>(peak_rss_bytes() - rss_before) / (1 << 20);
  state.counters["alloc_MiB"] = static_cast<double>(host_allocator().peak_bytes() - alloc_before) / (1 << 20);
}
BENCHMARK(BM_LongAttention)
    ->ArgsProduct({{4096, 8192}, {0, 1}, {0, 3}})
    ->ArgNames({"S", "backward", "impl"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
