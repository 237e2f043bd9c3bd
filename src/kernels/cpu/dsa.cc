// DeepSeek sparse attention kernels: indexer top-k, indexer KL loss, sparse attention (reference and fused).
#include "kernels/cpu/dsa.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"

namespace gale {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kKlEps = 1e-10;  // Megatron's log(x + 1e-10) in the KL
// Row chunks of the indexer loss's backward, each with its own dk accumulator, summed in order: a
// fixed count, so the result does not depend on the number of threads.
constexpr int64_t kLossChunks = 8;
// Chunk c holds the query rows t with (t / kLossRowBlock) % chunks == c: every chunk gets early and late
// rows alike (a causal row's work grows with its position).
constexpr int64_t kLossRowBlock = 16;
inline bool in_chunk(int64_t t, int64_t c, int64_t chunks) { return (t / kLossRowBlock) % chunks == c; }

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

inline float dot_simd(const float* __restrict a, const float* __restrict b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

inline void axpy_simd(float a, const float* __restrict x, float* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) y[c] += a * x[c];
}

// The keys a query row's loss runs over: every visible key, or with `sparse` its selected ones.
void loss_keys(const DsaIndexerProblem& ip, const int32_t* idx, bool sparse, int64_t b, int64_t i,
               std::vector<int32_t>* keys) {
  keys->clear();
  const AttentionProblem& m = *ip.mask;
  if (sparse) {
    const int32_t* row = idx + (i * m.B + b) * ip.topk;
    for (int64_t r = 0; r < ip.topk; ++r)
      if (row[r] >= 0) keys->push_back(row[r]);
    return;
  }
  for (int64_t j = 0; j < m.Sk; ++j)
    if (attention_visible(m, b, i, j)) keys->push_back(static_cast<int32_t>(j));
}

// One query row's indexer distribution π and teacher target over `keys`; returns its KL.
struct KlRow {
  std::vector<int32_t> keys;
  std::vector<double> pi, target;
};

double kl_row(const DsaIndexerProblem& ip, const DsaTeacher& teacher, const int32_t* idx, bool sparse, int64_t b,
              int64_t i, KlRow* r) {
  loss_keys(ip, idx, sparse, b, i, &r->keys);
  const int64_t n = static_cast<int64_t>(r->keys.size());
  r->pi.assign(n, 0.0);
  r->target.assign(n, 0.0);
  if (n == 0) return 0.0;
  // π = softmax(I)
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t m = 0; m < n; ++m) {
    r->pi[m] = dsa_index_score(ip, b, i, r->keys[m]);
    mx = std::max(mx, r->pi[m]);
  }
  double sum = 0.0;
  for (int64_t m = 0; m < n; ++m) sum += (r->pi[m] = std::exp(r->pi[m] - mx));
  for (int64_t m = 0; m < n; ++m) r->pi[m] /= sum;
  // target = Σ_h softmax(scale·Q_h·K_h) / NH
  const AttentionProblem& p = *teacher.p;
  const int64_t B = p.B, t = i * B + b;
  std::vector<double> a(n);
  for (int64_t h = 0; h < p.NH; ++h) {
    const int64_t g = h / (p.NH / p.KV);
    const float* qh = teacher.q + teacher.ql.offset(t, h);
    double amax = -std::numeric_limits<double>::infinity();
    for (int64_t m = 0; m < n; ++m) {
      a[m] = static_cast<double>(p.scale) * dot_simd(qh, teacher.k + teacher.kl.offset(r->keys[m] * B + b, g), p.HD);
      amax = std::max(amax, a[m]);
    }
    double asum = 0.0;
    for (int64_t m = 0; m < n; ++m) asum += (a[m] = std::exp(a[m] - amax));
    for (int64_t m = 0; m < n; ++m) r->target[m] += a[m] / asum / static_cast<double>(p.NH);
  }
  double kl = 0.0;
  for (int64_t m = 0; m < n; ++m)
    kl += r->target[m] * (std::log(r->target[m] + kKlEps) - std::log(r->pi[m] + kKlEps));
  return kl;
}

}  // namespace

float dsa_index_score(const DsaIndexerProblem& ip, int64_t b, int64_t i, int64_t j) {
  const int64_t B = ip.mask->B, t = i * B + b;
  const float* kj = ip.k + (j * B + b) * ip.DI;
  float s = 0.0f;
  for (int64_t h = 0; h < ip.NI; ++h)
    s += ip.w[t * ip.NI + h] * std::max(0.0f, dot_simd(ip.q + (t * ip.NI + h) * ip.DI, kj, ip.DI));
  return s;
}

void dsa_indexer_topk_ref(const DsaIndexerProblem& ip, int32_t* idx) {
  const AttentionProblem& m = *ip.mask;
  const int64_t B = m.B, S = m.Sq, K = ip.topk, NI = ip.NI, DI = ip.DI;
  GALE_CHECK(m.Sq <= m.Sk && K > 0) << "DSA indexer: " << m.Sq << " queries over " << m.Sk
                                    << " keys with top-k " << K << " (expected at most as many queries as keys, K > 0)";
  // Blocks of query rows of one sample: per indexer head one GEMM of the block's queries with the
  // sample's keys (only keys up to the block's last row under a plain causal mask), then
  // I = Σ_h w_h·ReLU(·) and the selection row by row.
  constexpr int64_t kRows = 32;
  const int64_t blocks = (S + kRows - 1) / kRows;
  const bool causal_prefix = m.causal && !m.q_positions && !m.k_positions;
  const bool plain_causal = causal_prefix && m.window == 0 && !m.q_doc_ids;
  parallel_for(B * blocks, 1, [&](int64_t u0, int64_t u1) {
    std::vector<std::pair<float, int32_t>> cand;
    std::vector<float> dots, scores;
    for (int64_t u = u0; u < u1; ++u) {
      // Tasks pair a short causal block with a long one (0, n−1, 1, n−2, ...), so that the threads'
      // contiguous task ranges carry similar work.
      const int64_t v = u % blocks, blk = v % 2 == 0 ? v / 2 : blocks - 1 - v / 2;
      const int64_t b = u / blocks, i0 = blk * kRows, i1 = std::min(S, i0 + kRows), nr = i1 - i0;
      const int64_t N = causal_prefix ? i1 : m.Sk;
      dots.resize(nr * N);
      scores.assign(nr * N, 0.0f);
      for (int64_t h = 0; h < NI; ++h) {
        sgemm(false, true, nr, N, DI, 1.0f, ip.q + ((i0 * B + b) * NI + h) * DI, B * NI * DI, ip.k + b * DI, B * DI,
              0.0f, dots.data(), N);
        for (int64_t r = 0; r < nr; ++r) {
          const float wh = ip.w[((i0 + r) * B + b) * NI + h];
          const float* __restrict d = dots.data() + r * N;
          float* __restrict sc = scores.data() + r * N;
#pragma omp simd
          for (int64_t j = 0; j < N; ++j) sc[j] += wh * (d[j] > 0.0f ? d[j] : 0.0f);
        }
      }
      for (int64_t r = 0; r < nr; ++r) {
        const int64_t i = i0 + r, t = i * B + b;
        cand.clear();
        if (plain_causal) {  // keys 0..i, no other mask
          for (int64_t j = 0; j <= i; ++j) cand.emplace_back(scores[r * N + j], static_cast<int32_t>(j));
        } else {
          for (int64_t j = 0; j < N; ++j)
            if (attention_visible(m, b, i, j)) cand.emplace_back(scores[r * N + j], static_cast<int32_t>(j));
        }
        int32_t* row = idx + t * K;
        int64_t n = static_cast<int64_t>(cand.size());
        if (n > K) {
          auto better = [](const std::pair<float, int32_t>& x, const std::pair<float, int32_t>& y) {
            return x.first > y.first || (x.first == y.first && x.second < y.second);
          };
          std::nth_element(cand.begin(), cand.begin() + (K - 1), cand.end(), better);
          cand.resize(K);
          std::sort(cand.begin(), cand.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
          n = K;
        }
        for (int64_t e = 0; e < K; ++e) row[e] = e < n ? cand[e].second : -1;
      }
    }
  });
}

double dsa_indexer_loss_forward_ref(const DsaIndexerProblem& ip, const DsaTeacher& teacher, const int32_t* idx,
                                    bool sparse) {
  const int64_t T = ip.mask->B * ip.mask->Sq;
  const int64_t chunks = std::min<int64_t>(kLossChunks, T);
  std::vector<double> sums(chunks, 0.0);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    KlRow r;
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t t = 0; t < T; ++t)
        if (in_chunk(t, c, chunks)) sums[c] += kl_row(ip, teacher, idx, sparse, t % ip.mask->B, t / ip.mask->B, &r);
  });
  double total = 0.0;
  for (double s : sums) total += s;
  return total;
}

void dsa_indexer_loss_backward_ref(const DsaIndexerProblem& ip, const DsaTeacher& teacher, const int32_t* idx,
                                   bool sparse, double g, float* dq, float* dk, float* dw) {
  const int64_t B = ip.mask->B, T = B * ip.mask->Sq, NI = ip.NI, DI = ip.DI;
  const int64_t chunks = std::min<int64_t>(kLossChunks, T);
  std::memset(dq, 0, sizeof(float) * T * NI * DI);
  std::memset(dw, 0, sizeof(float) * T * NI);
  std::vector<std::vector<float>> dk_chunk(chunks);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    KlRow r;
    std::vector<double> dI;
    for (int64_t c = c0; c < c1; ++c) {
      std::vector<float>& dkc = dk_chunk[c];
      dkc.assign(T * DI, 0.0f);
      for (int64_t t = 0; t < T; ++t) {
        if (!in_chunk(t, c, chunks)) continue;
        const int64_t b = t % B, i = t / B;
        kl_row(ip, teacher, idx, sparse, b, i, &r);
        const int64_t n = static_cast<int64_t>(r.keys.size());
        // dπ_m = −g·target_m/(π_m + eps); dI_m = π_m (dπ_m − Σ π dπ)
        dI.assign(n, 0.0);
        double c_sum = 0.0;
        for (int64_t m = 0; m < n; ++m) {
          dI[m] = -g * r.target[m] / (r.pi[m] + kKlEps);
          c_sum += r.pi[m] * dI[m];
        }
        for (int64_t m = 0; m < n; ++m) dI[m] = r.pi[m] * (dI[m] - c_sum);
        for (int64_t h = 0; h < NI; ++h) {
          const float* qh = ip.q + (t * NI + h) * DI;
          float* dqh = dq + (t * NI + h) * DI;
          const float wh = ip.w[t * NI + h];
          double dwh = 0.0;
          for (int64_t m = 0; m < n; ++m) {
            const int64_t tj = static_cast<int64_t>(r.keys[m]) * B + b;
            const float* kj = ip.k + tj * DI;
            const float s = dot_simd(qh, kj, DI);
            if (s <= 0.0f) continue;
            dwh += dI[m] * s;
            const float ds = static_cast<float>(dI[m] * wh);
            axpy_simd(ds, kj, dqh, DI);
            axpy_simd(ds, qh, dkc.data() + tj * DI, DI);
          }
          dw[t * NI + h] = static_cast<float>(dwh);
        }
      }
    }
  });
  std::memset(dk, 0, sizeof(float) * T * DI);
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t e = 0; e < T * DI; ++e) dk[e] += dk_chunk[c][e];
}

void dsa_sparse_attention_forward_ref(const AttentionProblem& p, const int32_t* idx, int64_t K, const float* q,
                                      const HeadLayout& ql, const float* k, const HeadLayout& kl, const float* v,
                                      const HeadLayout& vl, float* out, float* lse) {
  GALE_CHECK(p.dropout_p == 0.0f && !p.alibi_slopes) << "DSA sparse attention: no dropout, no ALiBi";
  const int64_t B = p.B, S = p.Sq, out_row = p.NH * p.HD;
  parallel_for(B * p.NH, 1, [&](int64_t u0, int64_t u1) {
    std::vector<double> s(K);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / p.NH, h = u % p.NH, g = h / (p.NH / p.KV);
      for (int64_t i = 0; i < S; ++i) {
        const int64_t t = i * B + b;
        const int32_t* keys = idx + t * K;
        const float* qi = q + ql.offset(t, h);
        float* o = out + t * out_row + h * p.HD;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t r = 0; r < K; ++r) {
          if (keys[r] < 0) continue;
          s[r] = static_cast<double>(p.scale) * dot(qi, k + kl.offset(keys[r] * B + b, g), p.HD);
          mx = std::max(mx, s[r]);
        }
        std::memset(o, 0, sizeof(float) * p.HD);
        double l = 0.0;
        for (int64_t r = 0; r < K; ++r)
          if (keys[r] >= 0) l += (s[r] = std::exp(s[r] - mx));
        for (int64_t r = 0; r < K; ++r) {
          if (keys[r] < 0) continue;
          const float pr = static_cast<float>(s[r] / l);
          const float* vj = v + vl.offset(keys[r] * B + b, g);
          for (int64_t c = 0; c < p.HD; ++c) o[c] += pr * vj[c];
        }
        lse[(b * p.NH + h) * S + i] = l > 0.0 ? static_cast<float>(mx + std::log(l)) : kNegInf;
      }
    }
  });
}

void dsa_sparse_attention_backward_ref(const AttentionProblem& p, const int32_t* idx, int64_t K, const float* q,
                                       const HeadLayout& ql, const float* k, const HeadLayout& kl, const float* v,
                                       const HeadLayout& vl, const float* out, const float* lse, const float* dout,
                                       float* dq, float* dk, float* dv) {
  GALE_CHECK(p.NH == p.KV) << "DSA sparse attention backward: every head its own keys (MLA)";
  const int64_t B = p.B, S = p.Sq, out_row = p.NH * p.HD;
  parallel_for(B * p.NH, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / p.NH, h = u % p.NH;
      for (int64_t i = 0; i < S; ++i) {
        std::memset(dk + kl.offset(i * B + b, h), 0, sizeof(float) * p.HD);
        std::memset(dv + vl.offset(i * B + b, h), 0, sizeof(float) * p.HD);
      }
      for (int64_t i = 0; i < S; ++i) {
        const int64_t t = i * B + b;
        const int32_t* keys = idx + t * K;
        const float* qi = q + ql.offset(t, h);
        const float* o = out + t * out_row + h * p.HD;
        const float* d = dout + t * out_row + h * p.HD;
        float* dqi = dq + ql.offset(t, h);
        std::memset(dqi, 0, sizeof(float) * p.HD);
        const float l = lse[(b * p.NH + h) * S + i];
        if (l == kNegInf) continue;
        const float delta = dot(d, o, p.HD);
        for (int64_t r = 0; r < K; ++r) {
          if (keys[r] < 0) continue;
          const int64_t tj = keys[r] * B + b;
          const float* kj = k + kl.offset(tj, h);
          const float* vj = v + vl.offset(tj, h);
          const float pr = std::exp(p.scale * dot(qi, kj, p.HD) - l);
          const float ds = pr * (dot(d, vj, p.HD) - delta);
          float* dkj = dk + kl.offset(tj, h);
          float* dvj = dv + vl.offset(tj, h);
          for (int64_t c = 0; c < p.HD; ++c) {
            dqi[c] += p.scale * ds * kj[c];
            dkj[c] += p.scale * ds * qi[c];
            dvj[c] += pr * d[c];
          }
        }
      }
    }
  });
}

void dsa_sparse_attention_forward_fused(const AttentionProblem& p, const int32_t* idx, int64_t K, const float* q,
                                        const HeadLayout& ql, const float* k, const HeadLayout& kl, const float* v,
                                        const HeadLayout& vl, float* out, float* lse) {
  GALE_CHECK(p.dropout_p == 0.0f && !p.alibi_slopes) << "DSA sparse attention: no dropout, no ALiBi";
  constexpr int64_t kBlock = 64;  // selected keys per online-softmax step
  const int64_t B = p.B, S = p.Sq, out_row = p.NH * p.HD;
  // One task per query row: its K gathered key indices serve every head of the row.
  parallel_for(B * S, 4, [&](int64_t t0, int64_t t1) {
    std::vector<int64_t> rows(K);
    float s[kBlock];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t % B, i = t / B;
      const int32_t* keys = idx + t * K;
      int64_t n = 0;
      for (int64_t r = 0; r < K; ++r)
        if (keys[r] >= 0) rows[n++] = keys[r] * B + b;
      for (int64_t h = 0; h < p.NH; ++h) {
        const int64_t g = h / (p.NH / p.KV);
        const float* qi = q + ql.offset(t, h);
        float* o = out + t * out_row + h * p.HD;
        std::memset(o, 0, sizeof(float) * p.HD);
        float m = kNegInf, l = 0.0f;
        for (int64_t r0 = 0; r0 < n; r0 += kBlock) {
          const int64_t nb = std::min(kBlock, n - r0);
          float bm = kNegInf;
          for (int64_t r = 0; r < nb; ++r) {
            s[r] = p.scale * dot_simd(qi, k + kl.offset(rows[r0 + r], g), p.HD);
            bm = std::max(bm, s[r]);
          }
          const float m_new = std::max(m, bm);
          const float corr = m == kNegInf ? 0.0f : std::exp(m - m_new);
          if (corr != 1.0f) {
            l *= corr;
#pragma omp simd
            for (int64_t c = 0; c < p.HD; ++c) o[c] *= corr;
          }
          for (int64_t r = 0; r < nb; ++r) {
            const float e = std::exp(s[r] - m_new);
            l += e;
            axpy_simd(e, v + vl.offset(rows[r0 + r], g), o, p.HD);
          }
          m = m_new;
        }
        if (l > 0.0f) {
          const float inv = 1.0f / l;
#pragma omp simd
          for (int64_t c = 0; c < p.HD; ++c) o[c] *= inv;
        }
        lse[(b * p.NH + h) * S + i] = l > 0.0f ? m + std::log(l) : kNegInf;
      }
    }
  });
}

void dsa_sparse_attention_backward_fused(const AttentionProblem& p, const int32_t* idx, int64_t K, const float* q,
                                         const HeadLayout& ql, const float* k, const HeadLayout& kl, const float* v,
                                         const HeadLayout& vl, const float* out, const float* lse, const float* dout,
                                         float* dq, float* dk, float* dv) {
  GALE_CHECK(p.NH == p.KV) << "DSA sparse attention backward: every head its own keys (MLA)";
  const int64_t B = p.B, S = p.Sq, HD = p.HD, out_row = p.NH * HD;
  // One task per (sample, head): its keys' dk/dv rows are touched by no other task. The head's keys
  // and values are first gathered into contiguous [S, HD] scratch (the selected rows are then read
  // at a short stride), and dk/dv accumulate there before they are written back.
  parallel_for(B * p.NH, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> ks(S * HD), vs(S * HD), dks(S * HD), dvs(S * HD), ds(K);
    std::vector<int32_t> rows(K);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / p.NH, h = u % p.NH;
      for (int64_t j = 0; j < S; ++j) {
        std::memcpy(ks.data() + j * HD, k + kl.offset(j * B + b, h), sizeof(float) * HD);
        std::memcpy(vs.data() + j * HD, v + vl.offset(j * B + b, h), sizeof(float) * HD);
      }
      std::fill(dks.begin(), dks.end(), 0.0f);
      std::fill(dvs.begin(), dvs.end(), 0.0f);
      for (int64_t i = 0; i < S; ++i) {
        const int64_t t = i * B + b;
        const int32_t* keys = idx + t * K;
        int64_t n = 0;
        for (int64_t r = 0; r < K; ++r)
          if (keys[r] >= 0) rows[n++] = keys[r];
        const float* qi = q + ql.offset(t, h);
        const float* d = dout + t * out_row + h * HD;
        float* dqi = dq + ql.offset(t, h);
        std::memset(dqi, 0, sizeof(float) * HD);
        const float l = lse[(b * p.NH + h) * S + i];
        if (l == kNegInf) continue;
        const float delta = dot_simd(d, out + t * out_row + h * HD, HD);
        for (int64_t r = 0; r < n; ++r) {
          const int64_t j = rows[r];
          const float pr = std::exp(p.scale * dot_simd(qi, ks.data() + j * HD, HD) - l);
          axpy_simd(pr, d, dvs.data() + j * HD, HD);
          ds[r] = p.scale * pr * (dot_simd(d, vs.data() + j * HD, HD) - delta);
        }
        for (int64_t r = 0; r < n; ++r) {
          const int64_t j = rows[r];
          axpy_simd(ds[r], ks.data() + j * HD, dqi, HD);
          axpy_simd(ds[r], qi, dks.data() + j * HD, HD);
        }
      }
      for (int64_t j = 0; j < S; ++j) {
        std::memcpy(dk + kl.offset(j * B + b, h), dks.data() + j * HD, sizeof(float) * HD);
        std::memcpy(dv + vl.offset(j * B + b, h), dvs.data() + j * HD, sizeof(float) * HD);
      }
    }
  });
}

}  // namespace gale
