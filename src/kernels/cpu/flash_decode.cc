// Split-K flash decoding: per (head, chunk) partial softmax sums, merged by log-sum-exp.
#include "kernels/cpu/flash_decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/logit_softcap.h"

namespace gale {

namespace {

void check_decode_problem(const AttentionProblem& p) {
  GALE_CHECK(p.B == 1 && p.Sq == 1) << "flash decode: one query of one sample, found B " << p.B << ", Sq " << p.Sq;
  GALE_CHECK(p.dropout_p == 0.0f && !p.q_doc_ids && !p.k_doc_ids) << "flash decode: no dropout, no document ids";
  GALE_CHECK(p.NH % p.KV == 0) << "flash decode: " << p.NH << " heads over " << p.KV << " key/value heads";
}

// Score bias and visibility of key j for query head h (−inf: hidden).
double alibi_bias(const AttentionProblem& p, int64_t h, int64_t j) {
  if (!p.alibi_slopes) return 0.0;
  const int64_t kpos = p.k_positions ? p.k_positions[j] : j, qpos = p.q_positions ? p.q_positions[0] : 0;
  return static_cast<double>(p.alibi_slopes[p.head_offset + h]) * static_cast<float>(kpos - qpos);
}

}  // namespace

void flash_decode_forward(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                          const HeadLayout& kl, const float* v, const HeadLayout& vl, int64_t chunk, float* out,
                          float* lse) {
  check_decode_problem(p);
  GALE_CHECK(chunk > 0) << "flash decode: chunk of " << chunk << " positions";
  const int64_t NH = p.NH, HD = p.HD, L = p.Sk, per_group = NH / p.KV;
  const int64_t chunks = std::max<int64_t>(1, (L + chunk - 1) / chunk);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // Per (head, chunk): m, l, then HD accumulators. Each chunk takes its scores first (a dot product
  // in 8 interleaved partial sums), then their maximum, then the exponentials and the weighted sum
  // of the values (one pass over the chunk's rows each).
  std::vector<float> part(static_cast<size_t>(NH * chunks * (HD + 2)));
  const bool parallel = NH * chunks > 1 && L * NH * HD >= (int64_t{1} << 20);  // worth a parallel region
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
  for (int64_t h = 0; h < NH; ++h)
    for (int64_t c = 0; c < chunks; ++c) {
      float* slot = part.data() + (h * chunks + c) * (HD + 2);
      float& m = slot[0];
      float& l = slot[1];
      float* acc = slot + 2;
      m = kNegInf;
      l = 0.0f;
      for (int64_t d = 0; d < HD; ++d) acc[d] = 0.0f;
      const float* qh = q + ql.offset(0, h);
      const int64_t g = h / per_group, first = c * chunk, n = std::min(L, first + chunk) - first;
      std::vector<float> s(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = first + i;
        if (!attention_visible(p, 0, 0, j)) {
          s[static_cast<size_t>(i)] = kNegInf;
          continue;
        }
        const float* kj = k + kl.offset(j, g);
        float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t d = 0;
        for (; d + 8 <= HD; d += 8)
          for (int u = 0; u < 8; ++u) lane[u] += qh[d + u] * kj[d + u];
        float dot = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        for (; d < HD; ++d) dot += qh[d] * kj[d];
        float score = dot * p.scale;
        if (p.softcap > 0.0f) score = softcap_value(score, p.softcap);  // --attn-logit-softcapping
        s[static_cast<size_t>(i)] = score + static_cast<float>(alibi_bias(p, h, j));
        m = std::max(m, s[static_cast<size_t>(i)]);
      }
      if (m == kNegInf) continue;  // no visible key in this chunk
      for (int64_t i = 0; i < n; ++i) {
        if (s[static_cast<size_t>(i)] == kNegInf) continue;
        const float e = std::exp(s[static_cast<size_t>(i)] - m);
        l += e;
        const float* vj = v + vl.offset(first + i, g);
        for (int64_t d = 0; d < HD; ++d) acc[d] += e * vj[d];
      }
    }
  for (int64_t h = 0; h < NH; ++h) {  // merge the chunks by log-sum-exp (with the sink logit once)
    const float sink = p.softmax_offset ? p.softmax_offset[h] : kNegInf;
    float M = sink;
    for (int64_t c = 0; c < chunks; ++c) M = std::max(M, part[(h * chunks + c) * (HD + 2)]);
    float* o = out + h * HD;
    for (int64_t d = 0; d < HD; ++d) o[d] = 0.0f;
    if (M == kNegInf) {
      lse[h] = kNegInf;
      continue;
    }
    float total = p.softmax_offset ? std::exp(sink - M) : 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float* slot = part.data() + (h * chunks + c) * (HD + 2);
      if (slot[0] == kNegInf) continue;
      const float w = std::exp(slot[0] - M);
      total += w * slot[1];
      for (int64_t d = 0; d < HD; ++d) o[d] += w * slot[2 + d];
    }
    for (int64_t d = 0; d < HD; ++d) o[d] /= total;
    lse[h] = M + std::log(total);
  }
}

void flash_decode_forward_ref(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                              const HeadLayout& kl, const float* v, const HeadLayout& vl, float* out, float* lse) {
  check_decode_problem(p);
  const int64_t NH = p.NH, HD = p.HD, L = p.Sk, per_group = NH / p.KV;
  for (int64_t h = 0; h < NH; ++h) {
    const int64_t g = h / per_group;
    std::vector<double> s(static_cast<size_t>(L), -std::numeric_limits<double>::infinity());
    double M = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < L; ++j) {
      if (!attention_visible(p, 0, 0, j)) continue;
      double dot = 0.0;
      for (int64_t d = 0; d < HD; ++d) dot += double(q[ql.offset(0, h) + d]) * double(k[kl.offset(j, g) + d]);
      double score = dot * p.scale;
      if (p.softcap > 0.0f) score = p.softcap * std::tanh(score / p.softcap);  // --attn-logit-softcapping
      s[j] = score + alibi_bias(p, h, j);
      M = std::max(M, s[j]);
    }
    std::vector<double> o(static_cast<size_t>(HD), 0.0);
    double total = 0.0;
    if (p.softmax_offset) {  // the sink logit: one more term of the sum, no value
      const double sink = p.softmax_offset[h];
      M = std::max(M, sink);
      total = std::exp(sink - M);
    }
    if (std::isfinite(M))
      for (int64_t j = 0; j < L; ++j) {
        if (!std::isfinite(s[j])) continue;
        const double e = std::exp(s[j] - M);
        total += e;
        for (int64_t d = 0; d < HD; ++d) o[d] += e * double(v[vl.offset(j, g) + d]);
      }
    for (int64_t d = 0; d < HD; ++d) out[h * HD + d] = total > 0.0 ? static_cast<float>(o[d] / total) : 0.0f;
    lse[h] = total > 0.0 ? static_cast<float>(M + std::log(total)) : -std::numeric_limits<float>::infinity();
  }
}

}  // namespace gale
