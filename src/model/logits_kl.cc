// Per-token KL divergence of teacher and student logits and its gradient (model/logits_kl.h).
#include "model/logits_kl.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/threads.h"

namespace gale {

namespace {

// log Σ_v exp(x_v / τ) of one row, and the row's maximum of x / τ (for stable exponentials).
double log_sum_exp(const float* x, int64_t V, double inv_t, double* max_out) {
  double m = -INFINITY;
  for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(x[v]) * inv_t);
  double s = 0.0;
  for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(x[v]) * inv_t - m);
  *max_out = m;
  return m + std::log(s);
}

}  // namespace

void logits_kl_per_token(const float* student, const float* teacher, int64_t T, int64_t V, double temperature,
                         double* kl) {
  GALE_CHECK(temperature > 0.0) << "KL temperature " << temperature;
  const double inv_t = 1.0 / temperature;
  parallel_for(T, std::max<int64_t>(1, 65536 / std::max<int64_t>(V, 1)), [&](int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    const float* s = student + t * V;
    const float* z = teacher + t * V;
    double ms = 0.0, mz = 0.0;
    const double lse_s = log_sum_exp(s, V, inv_t, &ms), lse_z = log_sum_exp(z, V, inv_t, &mz);
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      const double log_p = static_cast<double>(z[v]) * inv_t - lse_z;
      const double log_q = static_cast<double>(s[v]) * inv_t - lse_s;
      sum += std::exp(log_p) * (log_p - log_q);
    }
    kl[t] = temperature * temperature * sum;
  }
  });
}

void logits_kl_backward(const float* student, const float* teacher, int64_t T, int64_t V, double temperature,
                        const float* coef, float* d) {
  GALE_CHECK(temperature > 0.0) << "KL temperature " << temperature;
  const double inv_t = 1.0 / temperature;
  parallel_for(T, std::max<int64_t>(1, 65536 / std::max<int64_t>(V, 1)), [&](int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    const float* s = student + t * V;
    const float* z = teacher + t * V;
    float* dt = d + t * V;
    if (coef[t] == 0.0f) {
      std::fill(dt, dt + V, 0.0f);
      continue;
    }
    double ms = 0.0, mz = 0.0;
    const double lse_s = log_sum_exp(s, V, inv_t, &ms), lse_z = log_sum_exp(z, V, inv_t, &mz);
    const double c = static_cast<double>(coef[t]) * temperature;
    for (int64_t v = 0; v < V; ++v) {
      const double q = std::exp(static_cast<double>(s[v]) * inv_t - lse_s);
      const double p = std::exp(static_cast<double>(z[v]) * inv_t - lse_z);
      dt[v] = static_cast<float>(c * (q - p));
    }
  }
  });
}

namespace {

// The vocabulary-parallel path of logits_kl_forward_backward (three passes with reductions between).
void logits_kl_vocab_parallel(const float* student, const float* teacher, int64_t T, int64_t V, double temperature,
                              const float* coef, double* kl, float* d, const int64_t* teacher_rows, int64_t ld,
                              const KlAllReduce& all_reduce) {
  const double inv_t = 1.0 / temperature;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(V, 1));
  auto trow = [&](int64_t t) { return teacher + (teacher_rows ? teacher_rows[t] : t) * ld; };
  std::vector<double> m(static_cast<size_t>(2 * T)), sums(static_cast<size_t>(2 * T));  // student's, then teacher's
  parallel_for(T, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* s = student + t * V;
      const float* z = trow(t);
      double ms = -INFINITY, mz = -INFINITY;
      for (int64_t v = 0; v < V; ++v) {
        ms = std::max(ms, static_cast<double>(s[v]) * inv_t);
        mz = std::max(mz, static_cast<double>(z[v]) * inv_t);
      }
      m[t] = ms;
      m[T + t] = mz;
    }
  });
  all_reduce(m.data(), 2 * T, /*max=*/true);
  parallel_for(T, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* s = student + t * V;
      const float* z = trow(t);
      double ss = 0.0, sz = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        ss += std::exp(static_cast<double>(s[v]) * inv_t - m[t]);
        sz += std::exp(static_cast<double>(z[v]) * inv_t - m[T + t]);
      }
      sums[t] = ss;
      sums[T + t] = sz;
    }
  });
  all_reduce(sums.data(), 2 * T, /*max=*/false);
  parallel_for(T, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* s = student + t * V;
      const float* z = trow(t);
      const double lse_s = m[t] + std::log(sums[t]), lse_z = m[T + t] + std::log(sums[T + t]);
      const double c = static_cast<double>(coef[t]) * temperature;
      float* dt = d + t * V;
      double partial = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        const double log_p = static_cast<double>(z[v]) * inv_t - lse_z;
        const double log_q = static_cast<double>(s[v]) * inv_t - lse_s;
        const double p = std::exp(log_p), q = std::exp(log_q);
        partial += p * (log_p - log_q);
        dt[v] = static_cast<float>(c * (q - p));
      }
      kl[t] = partial;
    }
  });
  all_reduce(kl, T, /*max=*/false);
  for (int64_t t = 0; t < T; ++t) kl[t] *= temperature * temperature;
}

}  // namespace

void logits_kl_forward_backward(const float* student, const float* teacher, int64_t T, int64_t V, double temperature,
                                const float* coef, double* kl, float* d, const int64_t* teacher_rows,
                                int64_t teacher_ld, const KlAllReduce& all_reduce) {
  GALE_CHECK(temperature > 0.0) << "KL temperature " << temperature;
  const int64_t ld = teacher_ld > 0 ? teacher_ld : V;
  if (all_reduce) {
    logits_kl_vocab_parallel(student, teacher, T, V, temperature, coef, kl, d, teacher_rows, ld, all_reduce);
    return;
  }
  const double inv_t = 1.0 / temperature;
  parallel_for(T, std::max<int64_t>(1, 65536 / std::max<int64_t>(V, 1)), [&](int64_t begin, int64_t end) {
    std::vector<double> es(static_cast<size_t>(V)), ez(static_cast<size_t>(V));  // exp(x/τ − row max)
    for (int64_t t = begin; t < end; ++t) {
      const float* s = student + t * V;
      const float* z = teacher + (teacher_rows ? teacher_rows[t] : t) * ld;
      double ms = -INFINITY, mz = -INFINITY;
      for (int64_t v = 0; v < V; ++v) {
        ms = std::max(ms, static_cast<double>(s[v]) * inv_t);
        mz = std::max(mz, static_cast<double>(z[v]) * inv_t);
      }
      double ss = 0.0, sz = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        es[v] = std::exp(static_cast<double>(s[v]) * inv_t - ms);
        ez[v] = std::exp(static_cast<double>(z[v]) * inv_t - mz);
        ss += es[v];
        sz += ez[v];
      }
      const double lse_s = ms + std::log(ss), lse_z = mz + std::log(sz);
      double sum = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        const double log_p = static_cast<double>(z[v]) * inv_t - lse_z;
        const double log_q = static_cast<double>(s[v]) * inv_t - lse_s;
        sum += ez[v] / sz * (log_p - log_q);
      }
      kl[t] = temperature * temperature * sum;
      float* dt = d + t * V;
      const double c = static_cast<double>(coef[t]) * temperature;
      if (coef[t] == 0.0f) {
        std::fill(dt, dt + V, 0.0f);
        continue;
      }
      for (int64_t v = 0; v < V; ++v) dt[v] = static_cast<float>(c * (es[v] / ss - ez[v] / sz));
    }
  });
}

double reduce_kl(const std::vector<double>& kl, const std::vector<float>& mask, KlReduction reduction) {
  GALE_CHECK_EQ(kl.size(), mask.size());
  double sum = 0.0, tokens = 0.0;
  for (size_t t = 0; t < kl.size(); ++t) {
    sum += static_cast<double>(mask[t]) * kl[t];
    tokens += mask[t];
  }
  if (reduction == KlReduction::kSum) return sum;
  return tokens > 0.0 ? sum / tokens : 0.0;
}

}  // namespace gale
