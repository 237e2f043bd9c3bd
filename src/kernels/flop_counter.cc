// The counting wrappers of --op-cal-tflops and their process-wide counters.
#include "kernels/flop_counter.h"

#include <atomic>

namespace gale {

namespace {

// The entries the wrappers call (those found in the table at installation).
struct Inner {
  SgemmFn gemm = nullptr;
  Bf16GemmFn bf16_gemm = nullptr;
  AttentionForwardFn attention_forward = nullptr;
  AttentionBackwardFn attention_backward = nullptr;
};
Inner g_inner;

std::atomic<bool> g_counting{false};
std::atomic<int> g_recompute_depth{0};
std::atomic<int64_t> g_model{0};
std::atomic<int64_t> g_with_recompute{0};

void add(int64_t flops) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  g_with_recompute.fetch_add(flops, std::memory_order_relaxed);
  if (g_recompute_depth.load(std::memory_order_relaxed) == 0) g_model.fetch_add(flops, std::memory_order_relaxed);
}

void counting_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  add(gemm_flops(M, N, K));
  g_inner.gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void counting_bf16_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                        int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  add(gemm_flops(M, N, K));
  g_inner.bf16_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void counting_attention_forward(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                                const HeadLayout& kl, const float* v, const HeadLayout& vl, float* out, float* lse) {
  add(attention_forward_flops(p));
  g_inner.attention_forward(p, q, ql, k, kl, v, vl, out, lse);
}

void counting_attention_backward(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                                 const HeadLayout& kl, const float* v, const HeadLayout& vl, const float* out,
                                 const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  add(attention_backward_flops(p));
  g_inner.attention_backward(p, q, ql, k, kl, v, vl, out, lse, dout, dq, dk, dv);
}

}  // namespace

int64_t gemm_flops(int64_t M, int64_t N, int64_t K) { return 2 * M * N * K; }

int64_t attention_forward_flops(const AttentionProblem& p) { return 4 * p.B * p.NH * p.Sq * p.Sk * p.HD; }

int64_t attention_backward_flops(const AttentionProblem& p) { return 8 * p.B * p.NH * p.Sq * p.Sk * p.HD; }

bool counts_flops(const OpTable& ops) { return ops.gemm == &counting_gemm; }

void install_flop_counting(OpTable* ops) {
  if (counts_flops(*ops)) return;
  g_inner = Inner{ops->gemm, ops->bf16_gemm, ops->attention_forward, ops->attention_backward};
  ops->gemm = &counting_gemm;
  ops->bf16_gemm = &counting_bf16_gemm;
  ops->attention_forward = &counting_attention_forward;
  ops->attention_backward = &counting_attention_backward;
  ops->impl["flop_count"] = "counted";
}

void flop_counter_start() {
  g_model.store(0, std::memory_order_relaxed);
  g_with_recompute.store(0, std::memory_order_relaxed);
  g_counting.store(true, std::memory_order_relaxed);
}

void flop_counter_stop() { g_counting.store(false, std::memory_order_relaxed); }

FlopCounts flop_counter_counts() {
  return FlopCounts{g_model.load(std::memory_order_relaxed), g_with_recompute.load(std::memory_order_relaxed)};
}

FlopCountRecompute::FlopCountRecompute() { g_recompute_depth.fetch_add(1, std::memory_order_relaxed); }

FlopCountRecompute::~FlopCountRecompute() { g_recompute_depth.fetch_sub(1, std::memory_order_relaxed); }

}  // namespace gale
