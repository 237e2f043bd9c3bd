// Measures the machine's FP32 fused-multiply-add peak (the denominator of every "% of peak" figure).
//
// Each thread runs a loop of independent FMA chains held in registers: 16 (AVX-512) or 12 (AVX2)
// accumulators per thread, more than the latency (4 cycles) x FMA ports (2) = 8 needed to keep
// both ports busy every cycle, so the loop is bound by FMA throughput alone. Each FMA is a*m + c with m slightly below
// 1, so the values converge to c/(1-m) = 1 and never become denormal or infinite. The timed
// region starts after a warm-up so that the core has settled at its AVX-512 (or AVX2) frequency.
// The ISA-specific loops use function target attributes, so this header needs no -m flags and
// the caller must check `fma_isa_supported` first.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace gale::bench {

enum class FmaIsa { kAvx512, kAvx2 };

inline const char* fma_isa_name(FmaIsa isa) { return isa == FmaIsa::kAvx512 ? "avx512" : "avx2"; }

inline bool fma_isa_supported(FmaIsa isa) {
  __builtin_cpu_init();
  if (isa == FmaIsa::kAvx512) return __builtin_cpu_supports("avx512f");
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// Independent accumulators per thread: all in registers (AVX-512 has 32, AVX2 16, and two more
// hold the constants), and at least latency x ports = 8 of them.
constexpr int kFmaChainsAvx512 = 16;
constexpr int kFmaChainsAvx2 = 12;

// Floating-point operations per loop iteration per thread: chains x lanes x 2 (multiply + add).
constexpr int64_t fma_flops_per_iteration(FmaIsa isa) {
  return isa == FmaIsa::kAvx512 ? kFmaChainsAvx512 * 16 * 2 : kFmaChainsAvx2 * 8 * 2;
}

namespace detail {

#define GALE_FMA_CHAINS_12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define GALE_FMA_CHAINS_16(X) GALE_FMA_CHAINS_12(X) X(12) X(13) X(14) X(15)

// Returns the sum of the accumulators so that the compiler cannot drop the loop.
__attribute__((target("avx512f"), noinline)) inline float fma_loop_avx512(int64_t iterations) {
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
#define GALE_DECLARE(i) __m512 a##i = _mm512_set1_ps(1.0f + 0.01f * i);
  GALE_FMA_CHAINS_16(GALE_DECLARE)
#undef GALE_DECLARE
  for (int64_t it = 0; it < iterations; ++it) {
#define GALE_STEP(i) a##i = _mm512_fmadd_ps(a##i, m, c);
    GALE_FMA_CHAINS_16(GALE_STEP)
#undef GALE_STEP
  }
  __m512 s = _mm512_setzero_ps();
#define GALE_SUM(i) s = _mm512_add_ps(s, a##i);
  GALE_FMA_CHAINS_16(GALE_SUM)
#undef GALE_SUM
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}

__attribute__((target("avx2,fma"), noinline)) inline float fma_loop_avx2(int64_t iterations) {
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
#define GALE_DECLARE(i) __m256 a##i = _mm256_set1_ps(1.0f + 0.01f * i);
  GALE_FMA_CHAINS_12(GALE_DECLARE)
#undef GALE_DECLARE
  for (int64_t it = 0; it < iterations; ++it) {
#define GALE_STEP(i) a##i = _mm256_fmadd_ps(a##i, m, c);
    GALE_FMA_CHAINS_12(GALE_STEP)
#undef GALE_STEP
  }
  __m256 s = _mm256_setzero_ps();
#define GALE_SUM(i) s = _mm256_add_ps(s, a##i);
  GALE_FMA_CHAINS_12(GALE_SUM)
#undef GALE_SUM
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}

#undef GALE_FMA_CHAINS_16
#undef GALE_FMA_CHAINS_12

inline float fma_loop(FmaIsa isa, int64_t iterations) {
  return isa == FmaIsa::kAvx512 ? fma_loop_avx512(iterations) : fma_loop_avx2(iterations);
}

}  // namespace detail

// Runs the loop on `threads` OpenMP threads at once, `iterations` per thread, and returns the wall
// seconds of the slowest thread's timed region (all threads start together after a barrier).
// `sink` receives the loop results so that nothing is optimised away.
inline double fma_loop_seconds(FmaIsa isa, int threads, int64_t iterations, float* sink) {
  double seconds = 0;
  float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    total += detail::fma_loop(isa, iterations / 8);  // warm-up: reach the steady vector frequency
#pragma omp barrier
#pragma omp single
    seconds = omp_get_wtime();
    total += detail::fma_loop(isa, iterations);
#pragma omp barrier
#pragma omp single
    seconds = omp_get_wtime() - seconds;
  }
  *sink += total;
  return seconds;
}

// Peak FP32 GFLOP/s on `threads` threads: the best of `repeats` runs of about `seconds` each.
inline double fma_peak_gflops(FmaIsa isa, int threads, double seconds = 0.2, int repeats = 3) {
  float sink = 0;
  int64_t iterations = 1 << 16;
  double t = fma_loop_seconds(isa, threads, iterations, &sink);
  while (t < 0.01) {  // calibrate to about `seconds` per run
    iterations *= 4;
    t = fma_loop_seconds(isa, threads, iterations, &sink);
  }
  iterations = static_cast<int64_t>(iterations * seconds / t) + 1;
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    t = fma_loop_seconds(isa, threads, iterations, &sink);
    double gflops = static_cast<double>(threads) * iterations * fma_flops_per_iteration(isa) / t * 1e-9;
    if (gflops > best) best = gflops;
  }
  if (sink == 12345.678f) best += 1e-9;  // keeps `sink` observable
  return best;
}

}  // namespace gale::bench
