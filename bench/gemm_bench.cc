// GFLOP/s and % of the measured FMA peak of every GEMM of the two benchmark models, per GEMM library.
//
//   build/bench/gemm_bench                                   # everything (a few minutes)
//   build/bench/gemm_bench --benchmark_filter='^gemm/onednn/gpt.fc1/fwd/'
//   build/bench/gemm_bench --backends=onednn,openblas-pthread --threads=2 --benchmark_min_time=0.2
//
// Own flags (the rest go to Google Benchmark):
//   --threads=N                 threads for every library (default: OpenMP's, i.e. all cores)
//   --backends=a,b,...          subset of the backends listed below (default: all that load)
//   --openblas-coretypes=X,Y    extra OpenBLAS instances forced to these OPENBLAS_CORETYPE values
//                               (default Cooperlake,Prescott; "" for none)
//   --wait-quiet=S              before each row, wait up to S seconds until other processes leave
//                               the CPUs idle (for a shared machine; default 0: do not wait)
//
// Backends: onednn (dnnl_sgemm, Gale's level 0: gale::sgemm), onednn-partitioned (the same with one
// block of rows or columns per thread, level 1: gale::sgemm_partitioned), onednn-matmul-f32 and
// onednn-matmul-bf16 (the matmul primitive; bf16 inputs, f32 output), openblas-pthread (Debian's
// default libblas, kernels chosen by CPUID), openblas-pthread-<core> (OPENBLAS_CORETYPE forced),
// openblas-openmp, blis-openmp, blis-pthread. The BLAS libraries are dlopen'ed privately
// (blas_library.h), each checked against a naive GEMM before it is timed.
//
// Rows: gemm/<backend>/<shape>/<mode>: shapes from gemm_shapes.h; mode "call" for a single GEMM,
// "heads-seq" (attention: one multi-threaded GEMM per head, heads in turn), "heads-omp" (the heads
// split over Gale's OpenMP threads, each calling the library), "batched" (one batched matmul
// primitive). mix/<backend>/fc1+gelu: the fc1 forward GEMM alternating with a GELU over its output
// on Gale's OpenMP threads, as in training; counters gemm_ms, gelu_ms (each alone), mixed_ms and
// slowdown = mixed / (gemm + gelu) show what a second thread pool costs.
// At the end a summary gives each backend's total GEMM time for one training step of each model
// (from the best repetition of each row with --benchmark_repetitions=N). bench/gemm_report.py
// turns the JSON output into the tables of docs/gemm.md.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "blas_library.h"
#include "core/threads.h"
#include "fma_peak.h"
#include "gemm_shapes.h"
#include "kernels/cpu/gemm.h"

namespace {

using gale::bench::GemmShape;

// ---------------------------------------------------------------------------------------------
// Buffers

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
using Buffer = std::unique_ptr<T[], FreeDeleter>;

template <class T>
Buffer<T> alloc_buffer(int64_t n) {
  size_t bytes = (static_cast<size_t>(n) * sizeof(T) + 63) / 64 * 64;
  return Buffer<T>(static_cast<T*>(std::aligned_alloc(64, bytes)));
}

Buffer<float> random_buffer(int64_t n, uint32_t seed) {
  auto b = alloc_buffer<float>(n);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) b[i] = dist(gen);
  return b;
}

uint16_t to_bf16(float f) {  // round to nearest even (inputs are finite)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

// ---------------------------------------------------------------------------------------------
// Backends

// Row-major sgemm with Gale's signature (kernels/cpu/gemm.h).
using SgemmFn = std::function<void(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                                   int64_t, float, float*, int64_t)>;

struct SgemmBackend {
  std::string name;
  std::string description;
  SgemmFn sgemm;
};

struct Options {
  int threads = 0;
  double wait_quiet_seconds = 0;  // --wait-quiet=S: before each row, wait up to S s for an idle machine
  std::vector<std::string> backends;  // empty: all
  std::vector<std::string> openblas_coretypes = {"Cooperlake", "Prescott"};
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool wanted(const Options& o, const std::string& name) {
  if (o.backends.empty()) return true;
  for (const auto& b : o.backends) {
    if (b == name) return true;
  }
  return false;
}

// Max |C - C_ref| over a small GEMM with every transposition and beta = 1, relative to the
// largest |C_ref|; a wrongly bound library gives O(1).
double check_against_naive(const SgemmFn& fn) {
  const int64_t M = 37, N = 29, K = 41;
  double worst = 0;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      auto A = random_buffer(M * K, 1), B = random_buffer(K * N, 2), C = random_buffer(M * N, 3);
      std::vector<double> ref(M * N);
      int64_t lda = ta ? M : K, ldb = tb ? K : N;
      double scale = 0;
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k)
            s += double(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
          ref[i * N + j] = 0.5 * s + C[i * N + j];
          scale = std::max(scale, std::abs(ref[i * N + j]));
        }
      }
      fn(ta, tb, M, N, K, 0.5f, A.get(), lda, B.get(), ldb, 1.0f, C.get(), N);
      for (int64_t i = 0; i < M * N; ++i) worst = std::max(worst, std::abs(C[i] - ref[i]) / scale);
    }
  }
  return worst;
}

SgemmFn cblas_fn(const gale::bench::BlasLibrary& lib) {
  auto f = lib.sgemm;
  return [f](bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
             const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    using namespace gale::bench;
    f(kCblasRowMajor, ta ? kCblasTrans : kCblasNoTrans, tb ? kCblasTrans : kCblasNoTrans, int(M), int(N), int(K), alpha,
      A, int(lda), B, int(ldb), beta, C, int(ldc));
  };
}

std::vector<SgemmBackend> load_sgemm_backends(const Options& opt) {
  using gale::bench::BlasKind;
  std::vector<SgemmBackend> out;
  if (wanted(opt, "onednn")) out.push_back({"onednn", gale::gemm_backend_description(), gale::sgemm});
  if (wanted(opt, "onednn-partitioned")) {
    out.push_back({"onednn-partitioned", "the same sgemm, one row/column block per thread (gale::sgemm_partitioned)",
                   gale::sgemm_partitioned});
  }

  struct Candidate {
    std::string name, path;
    BlasKind kind;
    std::string coretype;
  };
  const std::string lib = "/usr/lib/x86_64-linux-gnu/";
  std::vector<Candidate> candidates = {
      {"openblas-pthread", lib + "openblas-pthread/libopenblas.so.0", BlasKind::kOpenBlas, ""}};
  for (const auto& core : opt.openblas_coretypes) {
    std::string lower = core;
    for (auto& ch : lower) ch = static_cast<char>(std::tolower(ch));
    candidates.push_back(
        {"openblas-pthread-" + lower, lib + "openblas-pthread/libopenblas.so.0", BlasKind::kOpenBlas, core});
  }
  candidates.push_back({"openblas-openmp", lib + "openblas-openmp/libopenblas.so.0", BlasKind::kOpenBlas, ""});
  candidates.push_back({"blis-openmp", lib + "blis-openmp/libblis.so.4", BlasKind::kBlis, ""});
  candidates.push_back({"blis-pthread", lib + "blis-pthread/libblis.so.4", BlasKind::kBlis, ""});

  static std::vector<gale::bench::BlasLibrary> keep_alive;  // libraries stay loaded for the run
  keep_alive.reserve(candidates.size());
  for (const auto& c : candidates) {
    if (!wanted(opt, c.name)) continue;
    auto l = gale::bench::load_blas(c.name, c.path, c.kind, c.coretype);
    if (!l.ok()) {
      std::fprintf(stderr, "gemm_bench: skipping %s: %s\n", c.name.c_str(), l.error.c_str());
      continue;
    }
    l.set_threads(opt.threads);
    keep_alive.push_back(l);
    out.push_back({c.name, l.description(), cblas_fn(keep_alive.back())});
  }
  std::vector<SgemmBackend> checked;
  for (auto& b : out) {
    double err = check_against_naive(b.sgemm);
    if (err > 1e-5) {
      std::fprintf(stderr, "gemm_bench: skipping %s: wrong result on a 37x29x41 GEMM (relative error %.2g)\n",
                   b.name.c_str(), err);
      continue;
    }
    checked.push_back(b);
  }
  return checked;
}

// After switching libraries, wait until the previous library's idle threads (OpenBLAS workers spin
// for ~0.1 s after each call) have gone to sleep, so that they do not steal cycles from the next.
double g_wait_quiet_seconds = 0;

// Percentage of all CPUs busy over the next `ms` milliseconds (from /proc/stat; -1 if unreadable).
int busy_percent(int ms) {
  auto sample = [](uint64_t* total, uint64_t* idle) {
    FILE* f = std::fopen("/proc/stat", "r");
    if (!f) return false;
    unsigned long long v[8] = {};
    int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                        &v[6], &v[7]);
    std::fclose(f);
    if (n != 8) return false;
    *total = 0;
    for (auto x : v) *total += x;
    *idle = v[3] + v[4];
    return true;
  };
  uint64_t t0, i0, t1, i1;
  if (!sample(&t0, &i0)) return -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  if (!sample(&t1, &i1) || t1 == t0) return -1;
  return static_cast<int>(100 * ((t1 - t0) - (i1 - i0)) / (t1 - t0));
}

// With --wait-quiet=S: waits (up to S seconds) until other processes leave the CPUs idle, so that
// each row runs in a quiet moment of a shared machine. Our own threads are idle meanwhile.
void wait_until_quiet() {
  if (g_wait_quiet_seconds <= 0) return;
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < g_wait_quiet_seconds) {
    int busy = busy_percent(500);
    if (busy >= 0 && busy < 10) return;
  }
}

// After switching libraries, wait until the previous library's idle threads (OpenBLAS workers spin
// for ~0.1 s after each call) have gone to sleep, so that they do not steal cycles from the next.
void settle(const std::string& backend) {
  static std::string last;
  if (backend != last) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  last = backend;
}

double g_peak_gflops = 0;  // measured at start-up

// Times each iteration of a benchmark (manual time) and sets the GFLOP/s and %peak counters.
class IterationTimer {
 public:
  explicit IterationTimer(benchmark::State& state) : state_(state) {}
  void start() { t0_ = std::chrono::steady_clock::now(); }
  void stop() {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    state_.SetIterationTime(s);
    total_ += s;
  }
  void set_counters(double flops_per_iteration) const {
    if (total_ <= 0) return;
    double gflops = flops_per_iteration * static_cast<double>(state_.iterations()) / total_ * 1e-9;
    state_.counters["GFLOP/s"] = gflops;
    if (g_peak_gflops > 0) state_.counters["%peak"] = 100.0 * gflops / g_peak_gflops;
  }
  double total_seconds() const { return total_; }

 private:
  benchmark::State& state_;
  std::chrono::steady_clock::time_point t0_;
  double total_ = 0;
};

// ---------------------------------------------------------------------------------------------
// sgemm rows

enum class HeadsMode { kCall, kSequential, kOmp };

void BM_Sgemm(benchmark::State& state, const SgemmBackend* backend, GemmShape g, HeadsMode mode) {
  settle(backend->name);
  auto A = random_buffer(g.a_elems() * g.batch, 11), B = random_buffer(g.b_elems() * g.batch, 12);
  auto C = random_buffer(g.c_elems() * g.batch, 13);
  auto run_one = [&](int64_t h) {
    backend->sgemm(g.trans_a, g.trans_b, g.M, g.N, g.K, 1.0f, A.get() + h * g.a_elems(), g.lda(),
                   B.get() + h * g.b_elems(), g.ldb(), g.beta, C.get() + h * g.c_elems(), g.ldc());
  };
  wait_until_quiet();
  IterationTimer timer(state);
  for (auto _ : state) {
    timer.start();
    if (mode == HeadsMode::kOmp) {
#pragma omp parallel for schedule(static)
      for (int64_t h = 0; h < g.batch; ++h) run_one(h);
    } else {
      for (int64_t h = 0; h < g.batch; ++h) run_one(h);
    }
    timer.stop();
  }
  timer.set_counters(g.flops());
}

// ---------------------------------------------------------------------------------------------
// oneDNN matmul primitive rows (f32 or bf16 inputs, f32 output; beta = 1 as a sum post-op)

dnnl::memory::desc matrix_desc(int64_t batch, int64_t rows, int64_t cols, bool transposed, dnnl::memory::data_type dt) {
  // Logical [rows, cols]; stored row-major as [rows, cols], or as [cols, rows] when transposed.
  dnnl::memory::dims strides = transposed ? dnnl::memory::dims{1, rows} : dnnl::memory::dims{cols, 1};
  if (batch == 1) return dnnl::memory::desc({rows, cols}, dt, strides);
  return dnnl::memory::desc({batch, rows, cols}, dt, {rows * cols, strides[0], strides[1]});
}

void BM_Matmul(benchmark::State& state, std::string backend, GemmShape g, bool bf16) {
  settle(backend);
  using dt = dnnl::memory::data_type;
  dt in_type = bf16 ? dt::bf16 : dt::f32;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  auto a_md = matrix_desc(g.batch, g.M, g.K, g.trans_a, in_type);
  auto b_md = matrix_desc(g.batch, g.K, g.N, g.trans_b, in_type);
  auto c_md = matrix_desc(g.batch, g.M, g.N, false, dt::f32);
  dnnl::primitive_attr attr;
  if (g.beta != 0) {
    dnnl::post_ops po;
    po.append_sum(g.beta);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng);
  } catch (const dnnl::error& e) {
    state.SkipWithError(e.what());
    return;
  }
  dnnl::matmul prim(pd);
  state.SetLabel(pd.impl_info_str());

  auto Af = random_buffer(g.a_elems() * g.batch, 11), Bf = random_buffer(g.b_elems() * g.batch, 12);
  auto C = random_buffer(g.c_elems() * g.batch, 13);
  Buffer<uint16_t> Ah, Bh;
  void* a_ptr = Af.get();
  void* b_ptr = Bf.get();
  if (bf16) {
    Ah = alloc_buffer<uint16_t>(g.a_elems() * g.batch);
    Bh = alloc_buffer<uint16_t>(g.b_elems() * g.batch);
    for (int64_t i = 0; i < g.a_elems() * g.batch; ++i) Ah[i] = to_bf16(Af[i]);
    for (int64_t i = 0; i < g.b_elems() * g.batch; ++i) Bh[i] = to_bf16(Bf[i]);
    a_ptr = Ah.get();
    b_ptr = Bh.get();
  }
  dnnl::memory a_mem(a_md, eng, a_ptr), b_mem(b_md, eng, b_ptr), c_mem(c_md, eng, C.get());
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
  wait_until_quiet();
  IterationTimer timer(state);
  for (auto _ : state) {
    timer.start();
    prim.execute(strm, args);
    strm.wait();
    timer.stop();
  }
  timer.set_counters(g.flops());
}

// ---------------------------------------------------------------------------------------------
// Two thread pools: the GEMM alternating with OpenMP elementwise work

void gelu_inplace(float* x, int64_t n) {
  gale::parallel_for(n, 4096, [x](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678f));
  });
}

void BM_Mix(benchmark::State& state, const SgemmBackend* backend) {
  settle(backend->name);
  GemmShape g = gale::bench::linear_gemms("gpt.fc1", 1024, 768, 3072)[0];
  auto A = random_buffer(g.a_elems(), 11), B = random_buffer(g.b_elems(), 12), C = random_buffer(g.c_elems(), 13);
  auto gemm = [&] {
    backend->sgemm(g.trans_a, g.trans_b, g.M, g.N, g.K, 0.02f, A.get(), g.lda(), B.get(), g.ldb(), 0.0f, C.get(),
                   g.ldc());
  };
  auto gelu = [&] { gelu_inplace(C.get(), g.c_elems()); };
  // Each iteration times three phases of 3 repeats each: GEMMs back to back, GELUs back to back,
  // and GEMM + GELU alternating as in training, so that noise from other processes hits all three.
  const int repeats = 3;
  double gemm_s = 0, gelu_s = 0, mixed_s = 0;
  wait_until_quiet();
  auto seconds_since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r) gemm();
    gemm_s += seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r) gelu();
    gelu_s += seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r) {
      gemm();
      gelu();
    }
    double m = seconds_since(t0);
    mixed_s += m;
    state.SetIterationTime(m / repeats);
  }
  double n = static_cast<double>(state.iterations()) * repeats;
  state.counters["gemm_ms"] = gemm_s * 1e3 / n;
  state.counters["gelu_ms"] = gelu_s * 1e3 / n;
  state.counters["mixed_ms"] = mixed_s * 1e3 / n;
  state.counters["slowdown"] = mixed_s / (gemm_s + gelu_s);
  state.counters["GFLOP/s"] = g.flops() * n / mixed_s * 1e-9;
}

// ---------------------------------------------------------------------------------------------
// Registration, summary, main

std::string row_name(const std::string& backend, const GemmShape& g, const char* mode) {
  return "gemm/" + backend + "/" + g.name + "/" + mode;
}

void register_all(const std::vector<SgemmBackend>& backends, const Options& opt) {
  auto shapes = gale::bench::distinct_model_gemms();
  auto reg = [](const std::string& name, auto&&... args) {
    benchmark::RegisterBenchmark(name.c_str(), args...)->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  for (const auto& b : backends) {
    for (const auto& g : shapes) {
      if (g.batch == 1) {
        reg(row_name(b.name, g, "call"), BM_Sgemm, &b, g, HeadsMode::kCall);
      } else {
        reg(row_name(b.name, g, "heads-seq"), BM_Sgemm, &b, g, HeadsMode::kSequential);
        reg(row_name(b.name, g, "heads-omp"), BM_Sgemm, &b, g, HeadsMode::kOmp);
      }
    }
  }
  for (bool bf16 : {false, true}) {
    std::string name = bf16 ? "onednn-matmul-bf16" : "onednn-matmul-f32";
    if (!wanted(opt, name)) continue;
    for (const auto& g : shapes) reg(row_name(name, g, g.batch == 1 ? "call" : "batched"), BM_Matmul, name, g, bf16);
  }
  for (const auto& b : backends) reg("mix/" + b.name + "/fc1+gelu", BM_Mix, &b);
}

// Forwards to the normal display reporter and keeps each row's GFLOP/s for the summary.
class CapturingReporter : public benchmark::BenchmarkReporter {
 public:
  explicit CapturingReporter(benchmark::BenchmarkReporter* inner) : inner_(inner) {}
  bool ReportContext(const Context& context) override { return inner_->ReportContext(context); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      auto it = r.counters.find("GFLOP/s");
      if (r.error_occurred || r.run_type != Run::RT_Iteration || it == r.counters.end()) continue;
      std::string name = r.run_name.function_name;
      auto pos = name.rfind("/manual_time");
      if (pos != std::string::npos) name.resize(pos);
      gflops[name] = std::max(gflops[name], it->second.value);  // best of the repetitions
    }
    inner_->ReportRuns(runs);
  }
  void Finalize() override { inner_->Finalize(); }

  std::map<std::string, double> gflops;

 private:
  benchmark::BenchmarkReporter* inner_;
};

// Total GEMM time of one training step per model and backend, from the rows measured (attention
// takes the best of the modes measured). Printed only for complete sets of rows.
void print_step_summary(const std::map<std::string, double>& gflops, const std::vector<std::string>& backends) {
  std::fprintf(stderr,
               "\nGEMM time of one training step (1024 tokens; sum over its GEMMs of FLOPs / measured rate):\n");
  std::fprintf(stderr, "  %-28s %16s %16s\n", "backend", "gpt ms (GF/s)", "llama ms (GF/s)");
  for (const auto& b : backends) {
    std::string cells;
    bool any = false;
    for (const auto& cfg : {gale::bench::gpt2_small_config(), gale::bench::llama_small_config()}) {
      double ms = 0, flops = 0;
      bool complete = true;
      for (const auto& sg : gale::bench::step_gemms(cfg)) {
        double best = 0;
        for (const char* mode : {"call", "heads-seq", "heads-omp", "batched"}) {
          auto it = gflops.find(row_name(b, sg.shape, mode));
          if (it != gflops.end()) best = std::max(best, it->second);
        }
        if (best <= 0) {
          complete = false;
          break;
        }
        ms += sg.count * sg.shape.flops() / (best * 1e9) * 1e3;
        flops += sg.count * sg.shape.flops();
      }
      char cell[64];
      if (complete) {
        std::snprintf(cell, sizeof cell, " %8.0f (%5.0f)", ms, flops / (ms * 1e-3) * 1e-9);
        any = true;
      } else {
        std::snprintf(cell, sizeof cell, " %16s", "-");
      }
      cells += cell;
    }
    if (any) std::fprintf(stderr, "  %-28s%s\n", b.c_str(), cells.c_str());
  }
}

Options parse_own_flags(int* argc, char** argv) {
  Options opt;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--threads=")) {
      char* end = nullptr;
      long t = std::strtol(v, &end, 10);
      if (*v == '\0' || *end != '\0' || t < 1 || t > 4096) {
        std::fprintf(stderr, "gemm_bench: --threads: expected a positive integer, found '%s'\n", v);
        std::exit(2);
      }
      opt.threads = static_cast<int>(t);
    } else if (const char* v2 = value("--backends=")) {
      opt.backends = split_list(v2);
    } else if (const char* v4 = value("--wait-quiet=")) {
      char* end = nullptr;
      opt.wait_quiet_seconds = std::strtod(v4, &end);
      if (*v4 == '\0' || *end != '\0' || opt.wait_quiet_seconds < 0) {
        std::fprintf(stderr, "gemm_bench: --wait-quiet: expected seconds (a number >= 0), found '%s'\n", v4);
        std::exit(2);
      }
    } else if (const char* v3 = value("--openblas-coretypes=")) {
      opt.openblas_coretypes = split_list(v3);
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  return opt;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse_own_flags(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (opt.threads > 0) gale::set_num_threads(opt.threads);
  opt.threads = gale::num_threads();

  g_wait_quiet_seconds = opt.wait_quiet_seconds;
  wait_until_quiet();
  using gale::bench::FmaIsa;
  FmaIsa isa = gale::bench::fma_isa_supported(FmaIsa::kAvx512) ? FmaIsa::kAvx512 : FmaIsa::kAvx2;
  g_peak_gflops = gale::bench::fma_peak_gflops(isa, opt.threads);
  char peak[128];
  std::snprintf(peak, sizeof peak, "%.1f GFLOP/s (%s FMA loop, %d threads)", g_peak_gflops,
                gale::bench::fma_isa_name(isa), opt.threads);
  std::fprintf(stderr, "FP32 FMA peak: %s\n", peak);
  benchmark::AddCustomContext("fma_peak", peak);
  benchmark::AddCustomContext("fma_peak_gflops", std::to_string(g_peak_gflops));
  benchmark::AddCustomContext("wait_quiet_seconds", std::to_string(opt.wait_quiet_seconds));

  auto backends = load_sgemm_backends(opt);
  std::vector<std::string> names;
  for (const auto& b : backends) {
    std::fprintf(stderr, "  %-28s %s\n", b.name.c_str(), b.description.c_str());
    benchmark::AddCustomContext("backend " + b.name, b.description);
    names.push_back(b.name);
  }
  for (const char* m : {"onednn-matmul-f32", "onednn-matmul-bf16"}) {
    if (wanted(opt, m)) names.push_back(m);
  }
  register_all(backends, opt);

  CapturingReporter reporter(benchmark::CreateDefaultDisplayReporter());
  benchmark::RunSpecifiedBenchmarks(&reporter);
  print_step_summary(reporter.gflops, names);
  benchmark::Shutdown();
  return 0;
}
