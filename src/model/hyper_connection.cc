// mHC HyperConnectionModule forward and backward: mappings, Sinkhorn, aggregation, residual merge.
#include "model/hyper_connection.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/norm.h"
#include "model/linear.h"
#include "model/param_builders.h"
#include "model/sinkhorn.h"

namespace gale {

namespace {

constexpr double kNormEps = 1e-6;  // Megatron's HyperConnectionModule.norm_eps

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

LinearWeight mapping_weight(const OpTable& ops, const ParamBuffer& pb, int id, bool with_grad) {
  const ParamSpec& s = pb.spec(id);
  return LinearWeight{pb.param_data(id), nullptr, nullptr, with_grad ? pb.grad_data(id) : nullptr,
                      s.global_shape[0], s.global_shape[1], ops.gemm};
}

ParamSpec replicated(ParamSpec s, const ModelPartition& part) {
  s.sequence_parallel = part.sequence_parallel;  // partial per TP rank under SP: all-reduced over TP
  return s;
}

}  // namespace

HyperConnectionIds register_hyper_connection_params(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part,
                                                    const std::string& prefix) {
  const int64_t n = c.mhc.streams, m = n * n + 2 * n, nH = n * c.hidden;
  HyperConnectionIds w;
  w.mapping_proj = pb.add(replicated(make_param_spec(prefix + ".mapping_proj.weight", {m, nH}, InitKind::kUniform,
                                                     xavier_uniform_bound(m, nH), true),
                                     part));
  const float alpha = c.mhc.init_gating_factor;
  w.alpha_pre = pb.add(replicated(make_param_spec(prefix + ".alpha_pre", {1}, InitKind::kConstant, alpha, false), part));
  w.alpha_post = pb.add(replicated(make_param_spec(prefix + ".alpha_post", {1}, InitKind::kConstant, alpha, false), part));
  w.alpha_res = pb.add(replicated(make_param_spec(prefix + ".alpha_res", {1}, InitKind::kConstant, alpha, false), part));
  w.bias = pb.add(replicated(make_param_spec(prefix + ".bias", {m}, InitKind::kZeros, 0.0f, false), part));
  return w;
}

Tensor hc_pre_forward(const ModelConfig& c, const OpTable& ops, const ParamBuffer& pb, const HyperConnectionIds& w,
                      const Tensor& x, HyperConnectionSaved* s) {
  const int64_t n = c.mhc.streams, m = n * n + 2 * n, H = c.hidden, nH = n * H, Tl = x.size(0);
  GALE_CHECK_EQ(x.size(1), nH) << "mHC module input: expected n·H columns";
  s->x = x;
  s->proj = linear_forward(x, mapping_weight(ops, pb, w.mapping_proj, false));  // [Tl, m]
  s->r = Tensor::empty({Tl});
  s->h_pre = Tensor::empty({Tl, n});
  s->h_post = Tensor::empty({Tl, n});
  s->h_res = Tensor::empty({Tl, n, n});
  s->m0 = Tensor::empty({Tl, n, n});
  const float* X = x.data<float>();
  const float* P = s->proj.data<float>();
  const float* bias = pb.param_data(w.bias);
  const double ap = pb.param_data(w.alpha_pre)[0], apo = pb.param_data(w.alpha_post)[0],
               ar = pb.param_data(w.alpha_res)[0];
  float *R = s->r.data<float>(), *hp = s->h_pre.data<float>(), *hq = s->h_post.data<float>(),
        *hr = s->h_res.data<float>(), *M0 = s->m0.data<float>();
  const int64_t iters = c.mhc.sinkhorn_iterations;
  parallel_for(Tl, 16, [&](int64_t b, int64_t e) {
    std::vector<float> logits(static_cast<size_t>(n * n));
    for (int64_t t = b; t < e; ++t) {
      const float* xt = X + t * nH;
      double sq = 0.0;
      for (int64_t k = 0; k < nH; ++k) sq += static_cast<double>(xt[k]) * xt[k];
      const float r = static_cast<float>(1.0 / (std::sqrt(sq) / std::sqrt(static_cast<double>(nH)) + kNormEps));
      R[t] = r;
      const float* pt = P + t * m;
      for (int64_t i = 0; i < n; ++i) {
        hp[t * n + i] = static_cast<float>(sigmoid(static_cast<double>(r) * pt[i] * ap + bias[i]));
        hq[t * n + i] = static_cast<float>(2.0 * sigmoid(static_cast<double>(r) * pt[n + i] * apo + bias[n + i]));
      }
      for (int64_t k = 0; k < n * n; ++k)
        logits[static_cast<size_t>(k)] = static_cast<float>(static_cast<double>(r) * pt[2 * n + k] * ar + bias[2 * n + k]);
      sinkhorn_forward(logits.data(), M0 + t * n * n, hr + t * n * n, n, iters);
    }
  });
  return hc_aggregate(*s);
}

Tensor hc_aggregate(const HyperConnectionSaved& s) {
  GALE_CHECK(s.x.defined()) << "mHC aggregation without the module's input";
  const int64_t Tl = s.x.size(0), n = s.h_pre.size(1), nH = s.x.size(1), H = nH / n;
  Tensor a = Tensor::empty({Tl, H});
  const float *X = s.x.data<float>(), *hp = s.h_pre.data<float>();
  float* A = a.data<float>();
  parallel_for(Tl, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t k = 0; k < H; ++k) {
        double acc = 0.0;
        for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(hp[t * n + i]) * X[t * nH + i * H + k];
        A[t * H + k] = static_cast<float>(acc);
      }
  });
  return a;
}

Tensor hc_post_forward(const OpTable& ops, const Tensor& y, HyperConnectionSaved* s, const DropoutSpec& dropout) {
  s->y = y;
  return hc_merge(ops, *s, dropout);
}

Tensor hc_merge(const OpTable& ops, const HyperConnectionSaved& s, const DropoutSpec& dropout) {
  GALE_CHECK(s.x.defined() && s.y.defined()) << "mHC merge without the module's input or the sub-block's output";
  const Tensor& y = s.y;
  const int64_t Tl = y.size(0), H = y.size(1), n = s.h_post.size(1), nH = n * H;
  Tensor expanded = Tensor::empty({Tl, nH}), mixed = Tensor::empty({Tl, nH}), out = Tensor::empty({Tl, nH});
  const float *X = s.x.data<float>(), *Y = y.data<float>(), *hq = s.h_post.data<float>(), *hr = s.h_res.data<float>();
  float *E = expanded.data<float>(), *Mx = mixed.data<float>();
  parallel_for(Tl, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < H; ++k) {
          E[t * nH + i * H + k] = hq[t * n + i] * Y[t * H + k];
          double acc = 0.0;
          for (int64_t j = 0; j < n; ++j) acc += static_cast<double>(hr[(t * n + i) * n + j]) * X[t * nH + j * H + k];
          Mx[t * nH + i * H + k] = static_cast<float>(acc);
        }
  });
  ops.bias_dropout_add(E, nullptr, Mx, out.data<float>(), Tl, nH, dropout);  // mixed + dropout(expanded)
  return out;
}

Tensor hc_post_backward(const OpTable& ops, const HyperConnectionSaved& s, const Tensor& d_out,
                        const DropoutSpec& dropout, Tensor* d_x, Tensor* d_h_post, Tensor* d_h_res) {
  const int64_t Tl = s.y.size(0), H = s.y.size(1), n = s.h_post.size(1), nH = n * H;
  Tensor d_expanded = Tensor::empty({Tl, nH});
  ops.bias_dropout_add_backward(d_out.data<float>(), d_expanded.data<float>(), nullptr, Tl, nH, dropout);
  Tensor d_y = Tensor::empty({Tl, H});
  *d_x = Tensor::empty({Tl, nH});
  *d_h_post = Tensor::empty({Tl, n});
  *d_h_res = Tensor::empty({Tl, n, n});
  const float *X = s.x.data<float>(), *Y = s.y.data<float>(), *hq = s.h_post.data<float>(), *hr = s.h_res.data<float>();
  const float *dO = d_out.data<float>(), *dE = d_expanded.data<float>();
  float *dY = d_y.data<float>(), *dX = d_x->data<float>(), *dq = d_h_post->data<float>(), *dr = d_h_res->data<float>();
  parallel_for(Tl, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      for (int64_t k = 0; k < H; ++k) {
        double acc = 0.0;
        for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(hq[t * n + i]) * dE[t * nH + i * H + k];
        dY[t * H + k] = static_cast<float>(acc);
      }
      for (int64_t i = 0; i < n; ++i) {
        double acc = 0.0;
        for (int64_t k = 0; k < H; ++k) acc += static_cast<double>(dE[t * nH + i * H + k]) * Y[t * H + k];
        dq[t * n + i] = static_cast<float>(acc);
        for (int64_t j = 0; j < n; ++j) {
          double g = 0.0;
          for (int64_t k = 0; k < H; ++k) g += static_cast<double>(dO[t * nH + i * H + k]) * X[t * nH + j * H + k];
          dr[(t * n + i) * n + j] = static_cast<float>(g);
        }
      }
      for (int64_t j = 0; j < n; ++j)
        for (int64_t k = 0; k < H; ++k) {
          double acc = 0.0;
          for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(hr[(t * n + i) * n + j]) * dO[t * nH + i * H + k];
          dX[t * nH + j * H + k] = static_cast<float>(acc);
        }
    }
  });
  return d_y;
}

void hc_pre_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const HyperConnectionIds& w,
                     HyperConnectionSaved& s, const Tensor& d_a, const Tensor& d_h_post, const Tensor& d_h_res,
                     Tensor& d_x) {
  const int64_t n = c.mhc.streams, m = n * n + 2 * n, H = c.hidden, nH = n * H, Tl = s.x.size(0);
  const int64_t iters = c.mhc.sinkhorn_iterations;
  const double ap = pb.param_data(w.alpha_pre)[0], apo = pb.param_data(w.alpha_post)[0],
               ar = pb.param_data(w.alpha_res)[0];
  Tensor d_h = Tensor::empty({Tl, m});  // the gradient of h = r·proj·α + bias
  Tensor d_proj = Tensor::empty({Tl, m});
  std::vector<double> d_alpha_rows(static_cast<size_t>(Tl * 3));
  const float *X = s.x.data<float>(), *P = s.proj.data<float>(), *R = s.r.data<float>(), *hp = s.h_pre.data<float>(),
              *hq = s.h_post.data<float>(), *M0 = s.m0.data<float>();
  const float *dA = d_a.data<float>(), *dq = d_h_post.data<float>(), *dr = d_h_res.data<float>();
  float *dH = d_h.data<float>(), *dP = d_proj.data<float>(), *dX = d_x.data<float>();
  parallel_for(Tl, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* xt = X + t * nH;
      float* dh = dH + t * m;
      for (int64_t i = 0; i < n; ++i) {
        double g = 0.0;  // d H_pre_i = Σ_k d_a[k]·X_i[k]
        for (int64_t k = 0; k < H; ++k) g += static_cast<double>(dA[t * H + k]) * xt[i * H + k];
        const double p = hp[t * n + i];
        dh[i] = static_cast<float>(g * p * (1.0 - p));
        const double q = 0.5 * hq[t * n + i];  // σ of the post logit
        dh[n + i] = static_cast<float>(static_cast<double>(dq[t * n + i]) * 2.0 * q * (1.0 - q));
      }
      sinkhorn_backward(M0 + t * n * n, dr + t * n * n, dh + 2 * n, n, iters);
      // the aggregation's gradient into X
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < H; ++k) dX[t * nH + i * H + k] += hp[t * n + i] * dA[t * H + k];
      // h = r·proj·α + bias
      const double r = R[t];
      double d_r = 0.0, da[3] = {0.0, 0.0, 0.0};
      for (int64_t k = 0; k < m; ++k) {
        const int group = k < n ? 0 : k < 2 * n ? 1 : 2;
        const double alpha = group == 0 ? ap : group == 1 ? apo : ar;
        const double g = dh[k], p = P[t * m + k];
        dP[t * m + k] = static_cast<float>(g * r * alpha);
        d_r += g * p * alpha;
        da[group] += g * r * p;
      }
      for (int g = 0; g < 3; ++g) d_alpha_rows[static_cast<size_t>(t * 3 + g)] = da[g];
      // r = 1 / (‖X‖/√(nH) + ε): dr/dX = −r² · X / (‖X‖·√(nH))
      double sq = 0.0;
      for (int64_t k = 0; k < nH; ++k) sq += static_cast<double>(xt[k]) * xt[k];
      const double norm = std::sqrt(sq);
      if (norm > 0.0) {
        const double f = -d_r * r * r / (norm * std::sqrt(static_cast<double>(nH)));
        for (int64_t k = 0; k < nH; ++k) dX[t * nH + k] += static_cast<float>(f * xt[k]);
      }
    }
  });
  // proj = X·Wᵀ: dX += d_proj·W, dW += d_projᵀ·X
  const Tensor dx_proj = linear_backward(d_proj, s.x, mapping_weight(ops, pb, w.mapping_proj, true));
  add_inplace(dX, dx_proj.data<float>(), Tl * nH);
  column_sum_accumulate(dH, pb.grad_data(w.bias), Tl, m);
  double sums[3] = {0.0, 0.0, 0.0};
  for (int64_t t = 0; t < Tl; ++t)
    for (int g = 0; g < 3; ++g) sums[g] += d_alpha_rows[static_cast<size_t>(t * 3 + g)];
  pb.grad_data(w.alpha_pre)[0] += static_cast<float>(sums[0]);
  pb.grad_data(w.alpha_post)[0] += static_cast<float>(sums[1]);
  pb.grad_data(w.alpha_res)[0] += static_cast<float>(sums[2]);
  s = HyperConnectionSaved();
}

namespace {

// [Tl, H] -> [Tl, n·H]: every stream gets x·scale.
Tensor copy_into_streams(const Tensor& x, int64_t n, float scale) {
  const int64_t Tl = x.size(0), H = x.size(1);
  Tensor out = Tensor::empty({Tl, n * H});
  const float* X = x.data<float>();
  float* O = out.data<float>();
  for (int64_t t = 0; t < Tl; ++t)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < H; ++k) O[(t * n + i) * H + k] = X[t * H + k] * scale;
  return out;
}

// [Tl, n·H] -> [Tl, H]: the sum of the n streams times scale (streams added in order).
Tensor sum_of_streams(const Tensor& x, int64_t n, float scale) {
  const int64_t Tl = x.size(0), H = x.size(1) / n;
  Tensor out = Tensor::empty({Tl, H});
  const float* X = x.data<float>();
  float* O = out.data<float>();
  for (int64_t t = 0; t < Tl; ++t)
    for (int64_t k = 0; k < H; ++k) {
      float acc = 0.0f;
      for (int64_t i = 0; i < n; ++i) acc += X[(t * n + i) * H + k];
      O[t * H + k] = acc * scale;
    }
  return out;
}

}  // namespace

Tensor hc_expand_forward(const Tensor& x, int64_t n) { return copy_into_streams(x, n, 1.0f); }
Tensor hc_expand_backward(const Tensor& d, int64_t n) { return sum_of_streams(d, n, 1.0f); }
Tensor hc_contract_forward(const Tensor& x, int64_t n) { return sum_of_streams(x, n, 1.0f / static_cast<float>(n)); }
Tensor hc_contract_backward(const Tensor& d, int64_t n) { return copy_into_streams(d, n, 1.0f / static_cast<float>(n)); }

}  // namespace gale
