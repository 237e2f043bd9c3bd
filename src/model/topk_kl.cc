// Megatron's offline-distillation top-K KL with the ghost token and its gradient (model/topk_kl.h).
#include "model/topk_kl.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/threads.h"

namespace gale {

void topk_kl_forward_backward(const float* student, int64_t T, int64_t V, int64_t vocab_offset,
                              const TeacherTopK& teacher, const float* coef, double* kl, float* d, bool first_rank,
                              const KlAllReduce& all_reduce) {
  GALE_CHECK(T >= 0 && V > 0 && teacher.K >= 0) << "topk_kl: T " << T << ", V " << V << ", K " << teacher.K;
  const int64_t K = teacher.K;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(V, 1));
  // Whether entry k of token t counts on this rank (its column, when it does; else -1).
  auto local_col = [&](int64_t t, int64_t k) -> int64_t {
    const float lp = teacher.logprobs[t * K + k];
    const int64_t i = teacher.indices[t * K + k] - vocab_offset;
    return lp != kCachedLogitsLogprobSentinel && i >= 0 && i < V ? i : -1;
  };
  // Row maxima, then the exponential sums: the student's log-sum-exp over the whole vocabulary.
  std::vector<double> mx(static_cast<size_t>(T)), se(static_cast<size_t>(T));
  parallel_for(T, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      double m = -INFINITY;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(student[t * V + v]));
      mx[t] = m;
    }
  });
  if (all_reduce) all_reduce(mx.data(), T, true);
  parallel_for(T, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      double s = 0.0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(student[t * V + v]) - mx[t]);
      se[t] = s;
    }
  });
  if (all_reduce) all_reduce(se.data(), T, false);
  std::vector<double> lse(static_cast<size_t>(T)), S(static_cast<size_t>(T), 0.0);
  for (int64_t t = 0; t < T; ++t) lse[t] = mx[t] + std::log(se[t]);
  // S: the student's probability mass on the teacher's (masked) support.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k)
      if (const int64_t i = local_col(t, k); i >= 0) S[t] += std::exp(static_cast<double>(student[t * V + i]) - lse[t]);
  if (all_reduce) all_reduce(S.data(), T, false);
  // The teacher's ghost log-mass tr (from its whole top-K, on every rank) and the per-token KL.
  std::vector<double> tr(static_cast<size_t>(T)), M(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    double pt = 0.0, m = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double p = std::exp(static_cast<double>(teacher.logprobs[t * K + k]));
      pt += p;
      if (teacher.logprobs[t * K + k] != kCachedLogitsLogprobSentinel) m += p;
    }
    tr[t] = std::log(std::max(1.0 - pt, kGhostTokenEps));
    M[t] = m;
    double sum = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = local_col(t, k);
      if (i < 0) continue;
      const double lp = teacher.logprobs[t * K + k];
      sum += std::exp(lp) * (lp - (static_cast<double>(student[t * V + i]) - lse[t]));
    }
    if (first_rank) {
      const double sr = std::log(std::max(1.0 - S[t], kGhostTokenEps));
      sum += std::exp(tr[t]) * (tr[t] - sr);
    }
    kl[t] = sum;
  }
  if (all_reduce) all_reduce(kl, T, false);
  if (d == nullptr) return;
  parallel_for(T, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* dt = d + t * V;
      const double c = coef[t];
      if (c == 0.0) {
        std::fill(dt, dt + V, 0.0f);
        continue;
      }
      // The ghost term's factor exp(tr) / (1 − S); 0 where 1 − S was clamped.
      const double g = 1.0 - S[t] >= kGhostTokenEps ? std::exp(tr[t]) / (1.0 - S[t]) : 0.0;
      const double base = M[t] - g * S[t];
      std::vector<double> row(static_cast<size_t>(V));
      for (int64_t v = 0; v < V; ++v) {
        const double q = std::exp(static_cast<double>(student[t * V + v]) - lse[t]);
        row[v] = q * base;
      }
      for (int64_t k = 0; k < K; ++k) {
        const int64_t i = local_col(t, k);
        if (i < 0) continue;
        const double q = std::exp(static_cast<double>(student[t * V + i]) - lse[t]);
        row[i] += g * q - std::exp(static_cast<double>(teacher.logprobs[t * K + k]));
      }
      for (int64_t v = 0; v < V; ++v) dt[v] = static_cast<float>(c * row[v]);
    }
  });
}

}  // namespace gale
