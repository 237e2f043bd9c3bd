// A/B of sgemm on oneDNN's own threads against row blocks or column blocks per thread, for
// every GEMM of the two benchmark models: the measurement behind gemm_partition's rule (docs/gemm.md).
//
//   build/bench/gemm_split_bench [--reps=N]
//
// The three variants of each shape run interleaved (library, rows, cols, library, ...) so that the
// machine's drift hits them alike; each figure is the median of N runs (default 15, 3 for the
// LM-head shapes). Percentages are the variant's speed-up over the library's own threads; `rule` is
// what gemm_partition picks on 2 threads. Plain program (not Google Benchmark): the interleaving
// is the point.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/threads.h"
#include "gemm_shapes.h"
#include "kernels/cpu/gemm.h"

namespace {

using gale::bench::GemmShape;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// The shape on the library's threads (split = kLibrary) or split by rows / columns over all threads.
void run(const GemmShape& g, gale::GemmSplit split, const float* A, const float* B, float* C) {
  gale::sgemm_split(split, g.trans_a, g.trans_b, g.M, g.N, g.K, 1.0f, A, g.lda(), B, g.ldb(), g.beta, C, g.ldc());
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 15;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0) {
      reps = std::atoi(argv[i] + 7);
    } else {
      std::fprintf(stderr, "gemm_split_bench: unknown argument '%s' (expected --reps=N)\n", argv[i]);
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  std::vector<GemmShape> shapes;
  for (const GemmShape& g : gale::bench::distinct_model_gemms())
    if (g.batch == 1) shapes.push_back(g);  // attention runs in its own kernels
  // The fused LM head's 512-token chunks (kernels/cpu/fused_lm_head_impl.h).
  for (const GemmShape& g : gale::bench::linear_gemms("output-chunk512", 512, 768, 50304)) shapes.push_back(g);
  size_t max_elems = 0;
  for (const GemmShape& g : shapes) {
    max_elems = std::max({max_elems, size_t(g.a_elems()), size_t(g.b_elems()), size_t(g.c_elems())});
  }
  std::vector<float> A(max_elems, 0.01f), B(max_elems, 0.02f), C(max_elems, 0.0f);
  std::printf("%d threads; median of interleaved runs, GFLOP/s (speed-up over the library's threads)\n",
              gale::num_threads());
  std::printf("| GEMM | M×N×K | library | rows | cols | rule |\n|---|---|---|---|---|---|\n");
  const gale::GemmSplit variants[3] = {gale::GemmSplit::kLibrary, gale::GemmSplit::kRows, gale::GemmSplit::kCols};
  for (const GemmShape& g : shapes) {
    const int n = g.flops() > 2e10 ? std::min(reps, 3) : reps;
    std::vector<double> t[3];
    for (auto v : variants) run(g, v, A.data(), B.data(), C.data());  // warm-up
    for (int r = 0; r < n; ++r) {
      for (int v = 0; v < 3; ++v) {
        const double t0 = now();
        run(g, variants[v], A.data(), B.data(), C.data());
        t[v].push_back(now() - t0);
      }
    }
    const double lib = median(t[0]), rows = median(t[1]), cols = median(t[2]);
    const auto rule = gale::gemm_partition(g.trans_a, g.trans_b, g.M, g.N, g.K, gale::num_threads());
    std::printf("| %s | %ld×%ld×%ld | %.0f | %.0f (%+.0f%%) | %.0f (%+.0f%%) | %s |\n", g.name.c_str(), long(g.M),
                long(g.N), long(g.K), g.flops() / lib * 1e-9, g.flops() / rows * 1e-9, 100 * (lib / rows - 1),
                g.flops() / cols * 1e-9, 100 * (lib / cols - 1), gale::gemm_split_name(rule));
  }
  return 0;
}
