// fp32 sgemm vs bf16 GEMM (oneDNN matmul, f32 accumulation) on GPT-2-small's shapes, and the
// f32 <-> bf16 conversion kernels.
//
//   build/bench/kernels_gemm_bench
// Shapes (T = 1024 tokens): QKV 768->2304, proj 768->768, fc1 768->3072, fc2 3072->768, LM head
// 768->50304, each as forward (x·Wᵀ), data gradient (dy·W) and weight gradient (dyᵀ·x). The label
// of a bf16 run is oneDNN's implementation (e.g. "brg:avx512_core_amx" when AMX is used).
#include <benchmark/benchmark.h>

#include <vector>

#include "core/rng.h"
#include "kernels/cpu/gemm.h"

namespace gale {
namespace {

constexpr int64_t kT = 1024;

struct Shape {
  const char* name;
  int64_t in, out;
};
constexpr Shape kShapes[] = {{"qkv", 768, 2304}, {"proj", 768, 768}, {"fc1", 768, 3072}, {"fc2", 3072, 768},
                             {"lm_head", 768, 50304}};

std::vector<float> rand_vec(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  fill_uniform(v.data(), n, seed, 1, 0);
  return v;
}

// state.range(0): shape, range(1): 0 forward, 1 data gradient, 2 weight gradient, range(2): 0 fp32, 1 bf16.
void BM_Gemm(benchmark::State& state) {
  const Shape s = kShapes[state.range(0)];
  const int pass = static_cast<int>(state.range(1));
  const bool bf = state.range(2) != 0;
  // M, N, K and operands per pass: forward y[T,out] = x[T,in]·W[out,in]ᵀ; data dx[T,in] = dy[T,out]·W;
  // weight dW[out,in] = dyᵀ[out,T]·x[T,in].
  const int64_t M = pass == 2 ? s.out : kT, N = pass == 0 ? s.out : s.in, K = pass == 0 ? s.in : pass == 1 ? s.out : kT;
  const bool ta = pass == 2, tb = pass == 0;
  const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  auto a = rand_vec(a_rows * a_cols, 1), b = rand_vec(b_rows * b_cols, 2);
  std::vector<float> c(M * N);
  std::vector<bf16> ah(a.size()), bh(b.size());
  convert_f32_to_bf16(a.data(), ah.data(), static_cast<int64_t>(a.size()));
  convert_f32_to_bf16(b.data(), bh.data(), static_cast<int64_t>(b.size()));
  if (bf)  // the path gemm_bf16 takes here: oneDNN's matmul (named by its kernel) or sgemm on widened inputs
    state.SetLabel(bf16_gemm_path() == Bf16GemmPath::kMatmul ? gemm_bf16_implementation(M, N, K)
                                                             : std::string("sgemm on widened bf16"));
  for (auto _ : state) {
    if (bf)
      gemm_bf16(ta, tb, M, N, K, 1.0f, ah.data(), a_cols, bh.data(), b_cols, 0.0f, c.data(), N);
    else
      sgemm(ta, tb, M, N, K, 1.0f, a.data(), a_cols, b.data(), b_cols, 0.0f, c.data(), N);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Gemm)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {0, 1, 2}, {0, 1}})
    ->ArgNames({"shape", "pass", "bf16"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_ConvertF32ToBf16(benchmark::State& state) {
  const int64_t n = 16ll << 20;
  auto x = rand_vec(n, 3);
  std::vector<bf16> y(n);
  for (auto _ : state) convert_f32_to_bf16(x.data(), y.data(), n);
  state.counters["GB/s"] = benchmark::Counter(6.0 * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ConvertF32ToBf16)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ConvertBf16ToF32(benchmark::State& state) {
  const int64_t n = 16ll << 20;
  auto x = rand_vec(n, 4);
  std::vector<bf16> h(n);
  convert_f32_to_bf16(x.data(), h.data(), n);
  for (auto _ : state) convert_bf16_to_f32(h.data(), x.data(), n);
  state.counters["GB/s"] = benchmark::Counter(6.0 * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ConvertBf16ToF32)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
