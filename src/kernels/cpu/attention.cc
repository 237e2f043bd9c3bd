// Reference attention: per (batch, head) score matrices, softmax in fp32, sgemm for the products.
#include "kernels/cpu/attention.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/logit_softcap.h"

namespace gale {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t qpos(const AttentionProblem& p, int64_t i) { return p.q_positions ? p.q_positions[i] : i; }
inline int64_t kpos(const AttentionProblem& p, int64_t j) { return p.k_positions ? p.k_positions[j] : j; }

// Dropout keep-scale of probability (b, h, i, j): 0 or 1/(1-p).
inline float dropout_scale(const AttentionProblem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  uint64_t index = ((static_cast<uint64_t>(p.sample_ids ? p.sample_ids[b] : b) * p.heads_total + p.head_offset + h) *
                        p.max_positions + qpos(p, i)) * p.max_positions + kpos(p, j);
  const float u = dropout_uniform_at(p.dropout_seed, p.dropout_stream, index);
  return u >= p.dropout_p ? 1.0f / (1.0f - p.dropout_p) : 0.0f;
}

// scores[i, j] = scale·q_i·k_j (soft-capped with p.softcap, then + the ALiBi bias m·(kpos − qpos))
// for visible pairs, −inf otherwise; returns [Sq, Sk] in `s`. With `capgrad` (soft-capping only) also
// the cap's derivative 1 − tanh²(·) of every pair.
void masked_scores(const AttentionProblem& p, int64_t b, int64_t h, const float* q, const HeadLayout& ql,
                   const float* k, const HeadLayout& kl, float* s, float* capgrad = nullptr) {
  int64_t g = h / (p.NH / p.KV);
  const float* qh = q + ql.offset(b, h);
  const float* kg = k + kl.offset(b, g);
  sgemm(false, true, p.Sq, p.Sk, p.HD, p.scale, qh, p.B * ql.row_stride, kg, p.B * kl.row_stride, 0.0f, s, p.Sk);
  if (p.softcap > 0.0f) {  // Gemma-2's --attn-logit-softcapping, before the bias and the masks
    softcap_inplace(s, p.Sq * p.Sk, p.softcap);
    if (capgrad)
      for (int64_t e = 0; e < p.Sq * p.Sk; ++e) capgrad[e] = softcap_grad(1.0f, s[e], p.softcap);
  }
  const float slope = p.alibi_slopes ? p.alibi_slopes[p.head_offset + h] : 0.0f;
  for (int64_t i = 0; i < p.Sq; ++i)
    for (int64_t j = 0; j < p.Sk; ++j) {
      float& x = s[i * p.Sk + j];
      if (!attention_visible(p, b, i, j))
        x = kNegInf;
      else if (p.alibi_slopes)
        x += slope * static_cast<float>(kpos(p, j) - qpos(p, i));
    }
}
}  // namespace

std::vector<float> alibi_slopes(int64_t n) {
  std::vector<float> m(static_cast<size_t>(n));
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  for (int64_t i = 0; i < n; ++i) {
    const double e = i < p ? -8.0 * static_cast<double>(i + 1) / static_cast<double>(p)
                           : -8.0 * static_cast<double>(2 * (i - p) + 1) / static_cast<double>(2 * p);
    m[static_cast<size_t>(i)] = static_cast<float>(std::pow(2.0, e));
  }
  return m;
}

bool attention_visible(const AttentionProblem& p, int64_t b, int64_t i, int64_t j) {
  if (p.causal && kpos(p, j) > qpos(p, i)) return false;
  if (p.window > 0 && qpos(p, i) - kpos(p, j) >= p.window) return false;
  if (p.q_doc_ids && p.q_doc_ids[b * p.Sq + i] != p.k_doc_ids[b * p.Sk + j]) return false;
  return true;
}

void attention_forward_ref(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                           const HeadLayout& kl, const float* v, const HeadLayout& vl, float* out, float* lse) {
  const int64_t out_row = p.NH * p.HD;
  parallel_for(p.B * p.NH, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> s(static_cast<size_t>(p.Sq * p.Sk));
    for (int64_t u = u0; u < u1; ++u) {
      int64_t b = u / p.NH, h = u % p.NH, g = h / (p.NH / p.KV);
      masked_scores(p, b, h, q, ql, k, kl, s.data());
      // --softmax-type: the sink logit is one more term of every row's sum (no value, no mask).
      const float sink = p.softmax_offset ? p.softmax_offset[h] : kNegInf;
      for (int64_t i = 0; i < p.Sq; ++i) {
        float* row = s.data() + i * p.Sk;
        float m = sink;
        for (int64_t j = 0; j < p.Sk; ++j) m = std::max(m, row[j]);
        double l = p.softmax_offset ? std::exp(static_cast<double>(sink) - m) : 0.0;
        if (m != kNegInf)
          for (int64_t j = 0; j < p.Sk; ++j) {
            row[j] = std::exp(row[j] - m);
            l += row[j];
          }
        float inv_l = l > 0.0 ? static_cast<float>(1.0 / l) : 0.0f;
        for (int64_t j = 0; j < p.Sk; ++j) {
          row[j] = m == kNegInf ? 0.0f : row[j] * inv_l;
          if (p.dropout_p > 0.0f && row[j] != 0.0f) row[j] *= dropout_scale(p, b, h, i, j);
        }
        lse[(b * p.NH + h) * p.Sq + i] = l > 0.0 ? m + static_cast<float>(std::log(l)) : kNegInf;
      }
      sgemm(false, false, p.Sq, p.HD, p.Sk, 1.0f, s.data(), p.Sk, v + vl.offset(b, g), p.B * vl.row_stride, 0.0f,
            out + b * out_row + h * p.HD, p.B * out_row);
    }
  });
}

void attention_max_logit_ref(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                             const HeadLayout& kl, float* max_logit) {
  std::vector<float> per_task(static_cast<size_t>(p.B * p.NH), kNegInf);
  parallel_for(p.B * p.NH, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> s(static_cast<size_t>(p.Sq * p.Sk));
    for (int64_t u = u0; u < u1; ++u) {
      masked_scores(p, u / p.NH, u % p.NH, q, ql, k, kl, s.data());
      float m = kNegInf;
      for (float x : s) m = std::max(m, x);
      per_task[static_cast<size_t>(u)] = m;
    }
  });
  for (int64_t u = 0; u < p.B * p.NH; ++u) {
    float& m = max_logit[u % p.NH];
    m = std::max(m, per_task[static_cast<size_t>(u)]);
  }
}

void attention_backward_ref(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                            const HeadLayout& kl, const float* v, const HeadLayout& vl, const float* out,
                            const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  const int64_t out_row = p.NH * p.HD;
  const int64_t per_group = p.NH / p.KV;
  // One task per (batch, KV group): the group's query heads accumulate into the same dk/dv rows.
  parallel_for(p.B * p.KV, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> prob(static_cast<size_t>(p.Sq * p.Sk)), dprob(prob.size()), delta(static_cast<size_t>(p.Sq));
    std::vector<float> capgrad(p.softcap > 0.0f ? prob.size() : 0);
    for (int64_t u = u0; u < u1; ++u) {
      int64_t b = u / p.KV, g = u % p.KV;
      float* dkg = dk + kl.offset(b, g);
      float* dvg = dv + vl.offset(b, g);
      for (int64_t j = 0; j < p.Sk; ++j) {
        std::memset(dkg + j * p.B * kl.row_stride, 0, sizeof(float) * p.HD);
        std::memset(dvg + j * p.B * vl.row_stride, 0, sizeof(float) * p.HD);
      }
      for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
        const float* outh = out + b * out_row + h * p.HD;
        const float* douth = dout + b * out_row + h * p.HD;
        const int64_t ld_out = p.B * out_row;
        // delta_i = dout_i · out_i
        for (int64_t i = 0; i < p.Sq; ++i) {
          double d = 0.0;
          for (int64_t c = 0; c < p.HD; ++c) d += douth[i * ld_out + c] * outh[i * ld_out + c];
          delta[i] = static_cast<float>(d);
        }
        // P = exp(scores − lse) (before dropout); P' = P·keep/(1−p).
        masked_scores(p, b, h, q, ql, k, kl, prob.data(), capgrad.empty() ? nullptr : capgrad.data());
        for (int64_t i = 0; i < p.Sq; ++i) {
          float l = lse[(b * p.NH + h) * p.Sq + i];
          for (int64_t j = 0; j < p.Sk; ++j) {
            float& x = prob[i * p.Sk + j];
            x = (l == kNegInf || x == kNegInf) ? 0.0f : std::exp(x - l);
          }
        }
        // dP' = dout · vᵀ
        sgemm(false, true, p.Sq, p.Sk, p.HD, 1.0f, douth, ld_out, v + vl.offset(b, g), p.B * vl.row_stride, 0.0f,
              dprob.data(), p.Sk);
        if (p.dropout_p > 0.0f) {
          // dv += P'ᵀ · dout needs P'; build it in `delta`-free scratch by scaling a copy row by row.
          std::vector<float> dropped(prob.size());
          for (int64_t i = 0; i < p.Sq; ++i)
            for (int64_t j = 0; j < p.Sk; ++j) {
              float sc = prob[i * p.Sk + j] != 0.0f ? dropout_scale(p, b, h, i, j) : 0.0f;
              dropped[i * p.Sk + j] = prob[i * p.Sk + j] * sc;
              dprob[i * p.Sk + j] *= sc;  // dP = dP'·keep/(1−p)
            }
          sgemm(true, false, p.Sk, p.HD, p.Sq, 1.0f, dropped.data(), p.Sk, douth, ld_out, 1.0f, dvg, p.B * vl.row_stride);
        } else {
          sgemm(true, false, p.Sk, p.HD, p.Sq, 1.0f, prob.data(), p.Sk, douth, ld_out, 1.0f, dvg, p.B * vl.row_stride);
        }
        // dS = P ∘ (dP − delta), stored in dprob.
        for (int64_t i = 0; i < p.Sq; ++i)
          for (int64_t j = 0; j < p.Sk; ++j) dprob[i * p.Sk + j] = prob[i * p.Sk + j] * (dprob[i * p.Sk + j] - delta[i]);
        // Soft-capping: dS of the uncapped scores = dS · (1 − tanh²).
        for (size_t e = 0; e < capgrad.size(); ++e) dprob[e] *= capgrad[e];
        // dq = scale·dS·k ; dk += scale·dSᵀ·q
        sgemm(false, false, p.Sq, p.HD, p.Sk, p.scale, dprob.data(), p.Sk, k + kl.offset(b, g), p.B * kl.row_stride,
              0.0f, dq + ql.offset(b, h), p.B * ql.row_stride);
        sgemm(true, false, p.Sk, p.HD, p.Sq, p.scale, dprob.data(), p.Sk, q + ql.offset(b, h), p.B * ql.row_stride,
              1.0f, dkg, p.B * kl.row_stride);
      }
    }
  });
}

void attention_softmax_offset_merge(const AttentionProblem& p, float* out, float* lse) {
  if (!p.softmax_offset) return;
  const int64_t out_row = p.NH * p.HD;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.NH; ++h) {
      const double sink = p.softmax_offset[h];
      for (int64_t i = 0; i < p.Sq; ++i) {
        float& l = lse[(b * p.NH + h) * p.Sq + i];
        float* o = out + (i * p.B + b) * out_row + h * p.HD;
        if (l == kNegInf) {  // no key: only the sink
          std::memset(o, 0, sizeof(float) * static_cast<size_t>(p.HD));
          l = static_cast<float>(sink);
          continue;
        }
        const double m = std::max<double>(l, sink);
        const double merged = m + std::log(std::exp(l - m) + std::exp(sink - m));
        const float w = static_cast<float>(std::exp(l - merged));
        for (int64_t c = 0; c < p.HD; ++c) o[c] *= w;
        l = static_cast<float>(merged);
      }
    }
}

void attention_softmax_offset_backward(const AttentionProblem& p, const float* out, const float* dout,
                                       const float* lse, float* d_offset) {
  if (!p.softmax_offset) return;
  const int64_t out_row = p.NH * p.HD;
  for (int64_t h = 0; h < p.NH; ++h) {
    const double sink = p.softmax_offset[h];
    double acc = 0.0;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t i = 0; i < p.Sq; ++i) {
        const float* o = out + (i * p.B + b) * out_row + h * p.HD;
        const float* d = dout + (i * p.B + b) * out_row + h * p.HD;
        double delta = 0.0;
        for (int64_t c = 0; c < p.HD; ++c) delta += static_cast<double>(d[c]) * o[c];
        acc -= std::exp(sink - lse[(b * p.NH + h) * p.Sq + i]) * delta;
      }
    d_offset[h] += static_cast<float>(acc);
  }
}

}  // namespace gale
