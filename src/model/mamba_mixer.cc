// Mamba-2 mixer (in_proj, causal conv, selective scan, gated RMSNorm, out_proj) and the Mamba layer, forward and backward.
#include "model/mamba_mixer.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/threads.h"
#include "model/causal_conv1d.h"
#include "model/document_starts.h"
#include "model/mamba_context_parallel.h"
#include "model/norm_weight.h"
#include "model/param_builders.h"
#include "model/transformer_layer.h"

namespace gale {

namespace {

constexpr float kGatedNormEps = 1e-5f;  // Megatron's MambaMixer norm

inline float sigmoidf(float v) { return 1.0f / (1.0f + std::exp(-v)); }
inline float siluf(float v) { return v * sigmoidf(v); }
inline float dsiluf(float v) {
  const float s = sigmoidf(v);
  return s * (1.0f + v * (1.0f - s));
}
// torch.nn.functional.softplus (beta 1, threshold 20).
inline float softplusf(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

// v rounded to `dt` (kBF16 or kF16, nearest even) and back: a state stored in that dtype.
inline float stored_as(DType dt, float v) {
  return dt == DType::kBF16 ? bf16_to_float(float_to_bf16(v)) : f16_to_float(float_to_f16(v));
}

// --mamba-training-ssm-states-dtype: whether the training scan stores its inter-chunk states rounded.
inline bool rounds_states(const MambaMixerWeights& w) { return w.ssm_states != DType::kF32; }

std::string mixer_name(int64_t layer, const char* rest) { return str_cat("decoder.layers.", layer, ".mixer.", rest); }

// Layout of one in_proj row: z [DI], xBC [conv_dim] (x [DI], B [G·N], C [G·N]), dt [NH].
struct Offsets {
  int64_t R, xbc, dt;
  explicit Offsets(const MambaDims& d) : R(d.in_proj_rows()), xbc(d.DI), dt(d.DI + d.conv_dim()) {}
};

// g = y·silu(z) [T, DI]: the scan's output y [T, DI] gated by zx's z.
Tensor gate_forward(const MambaDims& d, const Tensor& zx, const Tensor& y) {
  const int64_t T = y.size(0), DI = d.DI, R = d.in_proj_rows();
  Tensor g = Tensor::empty({T, DI});
  const float* yp = y.data<float>();
  const float* zxp = zx.data<float>();
  float* gp = g.data<float>();
  parallel_for(T, 16, [&](int64_t b0, int64_t e0) {
    for (int64_t t = b0; t < e0; ++t)
      for (int64_t i = 0; i < DI; ++i) gp[t * DI + i] = yp[t * DI + i] * siluf(zxp[t * R + i]);
  });
  return g;
}

// Its backward: dy [T, DI] of dg [T, DI]; the z columns of dzx [T, R] WRITTEN.
Tensor gate_backward(const MambaDims& d, const Tensor& zx, const Tensor& y, const Tensor& dg, float* dzx) {
  const int64_t T = y.size(0), DI = d.DI, R = d.in_proj_rows();
  Tensor dy = Tensor::empty({T, DI});
  const float* yp = y.data<float>();
  const float* zxp = zx.data<float>();
  const float* dgp = dg.data<float>();
  float* dyp = dy.data<float>();
  parallel_for(T, 16, [&](int64_t b0, int64_t e0) {
    for (int64_t t = b0; t < e0; ++t)
      for (int64_t i = 0; i < DI; ++i) {
        const float z = zxp[t * R + i];
        dyp[t * DI + i] = dgp[t * DI + i] * siluf(z);
        dzx[t * R + i] = dgp[t * DI + i] * yp[t * DI + i] * dsiluf(z);
      }
  });
  return dy;
}

// The gated grouped RMSNorm n = g·r·w of g [T, DI] over G groups of DI/G channels,
// r = (mean g² + eps)^−½ per group: *normed [T, DI], *rstd [T, G].
void gated_norm_forward(int64_t G, const Tensor& g, const float* w, Tensor* normed, Tensor* rstd) {
  const int64_t T = g.size(0), DI = g.size(1), gs = DI / G;
  *normed = Tensor::empty({T, DI});
  *rstd = Tensor::empty({T, G});
  const float* gp = g.data<float>();
  float* np = normed->data<float>();
  float* rp = rstd->data<float>();
  parallel_for(T, 16, [&](int64_t b0, int64_t e0) {
    for (int64_t t = b0; t < e0; ++t)
      for (int64_t k = 0; k < G; ++k) {
        double ss = 0.0;
        for (int64_t i = k * gs; i < (k + 1) * gs; ++i) ss += static_cast<double>(gp[t * DI + i]) * gp[t * DI + i];
        const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(gs)) + kGatedNormEps);
        rp[t * G + k] = r;
        for (int64_t i = k * gs; i < (k + 1) * gs; ++i) np[t * DI + i] = gp[t * DI + i] * r * w[i];
      }
  });
}

// Its backward: dg [T, DI] of d_normed [T, DI]; accumulates g_w (null: not).
Tensor gated_norm_backward(int64_t G, const Tensor& g, const Tensor& rstd, const Tensor& d_normed, const float* w,
                           float* g_w) {
  const int64_t T = g.size(0), DI = g.size(1), gs = DI / G;
  const float* gp = g.data<float>();
  const float* rp = rstd.data<float>();
  const float* dnp = d_normed.data<float>();
  if (g_w)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < DI; ++i) g_w[i] += dnp[t * DI + i] * gp[t * DI + i] * rp[t * G + i / gs];
  Tensor dg = Tensor::empty({T, DI});
  float* dgp = dg.data<float>();
  parallel_for(T, 16, [&](int64_t b0, int64_t e0) {
    for (int64_t t = b0; t < e0; ++t)
      for (int64_t k = 0; k < G; ++k) {
        const float r = rp[t * G + k];
        double m = 0.0;
        for (int64_t i = k * gs; i < (k + 1) * gs; ++i) m += static_cast<double>(dnp[t * DI + i]) * w[i] * gp[t * DI + i];
        const float mean = static_cast<float>(m / static_cast<double>(gs));
        for (int64_t i = k * gs; i < (k + 1) * gs; ++i)
          dgp[t * DI + i] = r * dnp[t * DI + i] * w[i] - gp[t * DI + i] * r * r * r * mean;
      }
  });
  return dg;
}

}  // namespace

MambaDims MambaDims::of(const ModelConfig& c) {
  MambaDims d;
  d.H = c.hidden;
  d.DI = c.hybrid.expand * c.hidden;
  d.P = c.hybrid.headdim;
  d.NH = d.P > 0 ? d.DI / d.P : 0;
  d.G = c.hybrid.ngroups;
  d.N = c.hybrid.d_state;
  d.K = c.hybrid.d_conv;
  return d;
}

MambaDims MambaDims::tp_local(int64_t tp) const {
  GALE_CHECK(tp >= 1 && G % tp == 0 && NH % tp == 0 && DI % tp == 0)
      << "Mamba mixer: tensor-parallel size " << tp << " must divide the groups (" << G << "), heads (" << NH
      << ") and d_inner (" << DI << ")";
  MambaDims d = *this;
  d.DI /= tp;
  d.NH /= tp;
  d.G /= tp;
  return d;
}

std::vector<int> MambaParamIds::all() const {
  std::vector<int> ids;
  for (int id : {norm_w, norm_b, in_proj, conv_w, conv_b, a_log, d, dt_bias, gnorm_w, out_proj})
    if (id >= 0) ids.push_back(id);
  return ids;
}

MambaParamIds register_mamba_params(ParamBuffer& pb, const ModelConfig& c, int64_t layer, const ModelPartition* part) {
  const MambaDims d = MambaDims::of(c);
  const int64_t GN = d.G * d.N;
  const bool tp = part != nullptr && part->tp_size() > 1;
  if (tp) d.tp_local(part->tp_size());  // checks the split
  auto split = [&](ParamSpec s, int dim, std::vector<int64_t> extents) {
    return tp ? tp_split_sections(std::move(s), *part, dim, std::move(extents)) : s;
  };
  auto pre_norm = [&](ParamSpec s) {
    s.sequence_parallel = part != nullptr && part->sequence_parallel;
    return s;
  };
  MambaParamIds w;
  const float conv_bound = 1.0f / std::sqrt(static_cast<float>(d.K));  // kaiming_uniform(a=√5), fan_in K
  w.norm_w = pb.add(pre_norm(make_param_spec(mixer_name(layer, "in_proj.layer_norm_weight"), {d.H},
                                             norm_weight_init(c), 0, false)));
  if (!c.rms_norm)
    w.norm_b = pb.add(pre_norm(make_param_spec(mixer_name(layer, "in_proj.layer_norm_bias"), {d.H},
                                               InitKind::kZeros, 0, false)));
  w.in_proj = pb.add(gemm_weight(split(make_param_spec(mixer_name(layer, "in_proj.weight"), {d.in_proj_rows(), d.H},
                                                       InitKind::kNormal, c.init_std, true),
                                       0, {d.DI, d.DI, GN, GN, d.NH})));
  w.conv_w = pb.add(split(make_param_spec(mixer_name(layer, "conv1d.weight"), {d.conv_dim(), d.K}, InitKind::kUniform,
                                          conv_bound, true),
                          0, {d.DI, GN, GN}));
  w.conv_b = pb.add(split(make_param_spec(mixer_name(layer, "conv1d.bias"), {d.conv_dim()}, InitKind::kUniform,
                                          conv_bound, false),
                          0, {d.DI, GN, GN}));
  w.a_log =
      pb.add(split(make_param_spec(mixer_name(layer, "A_log"), {d.NH}, InitKind::kMambaALog, 0, false), 0, {d.NH}));
  w.d = pb.add(split(make_param_spec(mixer_name(layer, "D"), {d.NH}, InitKind::kOnes, 0, false), 0, {d.NH}));
  w.dt_bias =
      pb.add(split(make_param_spec(mixer_name(layer, "dt_bias"), {d.NH}, InitKind::kMambaDtBias, 0, false), 0, {d.NH}));
  w.gnorm_w =
      pb.add(split(make_param_spec(mixer_name(layer, "norm.weight"), {d.DI}, InitKind::kOnes, 0, false), 0, {d.DI}));
  const float out_std = c.init_std / std::sqrt(static_cast<float>(c.num_layers));  // Megatron's rescale, 1 residual
  w.out_proj = pb.add(gemm_weight(split(make_param_spec(mixer_name(layer, "out_proj.weight"), {d.H, d.DI},
                                                        InitKind::kNormal, out_std, true),
                                        1, {d.DI})));
  return w;
}

MambaMixerWeights mamba_mixer_weights(const ParamBuffer& pb, const MambaParamIds& w, SgemmFn gemm,
                                      Bf16GemmFn bf16_gemm) {
  MambaMixerWeights m;
  m.in_proj = linear_weight(pb, w.in_proj, gemm, bf16_gemm);
  m.out_proj = linear_weight(pb, w.out_proj, gemm, bf16_gemm);
  m.conv_w = pb.param_data(w.conv_w);
  m.conv_b = pb.param_data(w.conv_b);
  m.a_log = pb.param_data(w.a_log);
  m.d = pb.param_data(w.d);
  m.dt_bias = pb.param_data(w.dt_bias);
  m.gnorm_w = pb.param_data(w.gnorm_w);
  m.g_conv_w = pb.grad_data(w.conv_w);
  m.g_conv_b = pb.grad_data(w.conv_b);
  m.g_a_log = pb.grad_data(w.a_log);
  m.g_d = pb.grad_data(w.d);
  m.g_dt_bias = pb.grad_data(w.dt_bias);
  m.g_gnorm_w = pb.grad_data(w.gnorm_w);
  return m;
}

namespace {

Tensor mixer_forward(const MambaDims& d, const MambaMixerWeights& w, const Tensor& u,
                     const std::vector<MambaSequence>& seqs, DType gemm_dtype, MambaMixerSaved* saved,
                     bool training_states, const std::vector<int32_t>& starts_v) {
  Tensor u_saved;
  // [T, R]: this rank's positions of the sequence (gathered under SP)
  Tensor zx_seq = column_parallel_linear_forward(w.tp, u, w.in_proj, &u_saved);
  // Under CP the convolution and the scan run on whole sequences of this cp rank's heads (dc, wc).
  const bool use_cp = w.cp.on();
  GALE_CHECK(!use_cp || std::none_of(seqs.begin(), seqs.end(), [](const MambaSequence& q) {
    return q.conv_state || q.ssm_state || q.conv_steps || q.ssm_steps;
  })) << "mamba mixer: decoding states with context parallelism";
  const MambaCpWeights scan_part(d, w);
  const MambaDims& dc = scan_part.dims();
  const MambaMixerWeights& wc = scan_part.weights();
  Tensor zx = use_cp ? mamba_cp_seq_to_heads(w.cp, d, zx_seq) : zx_seq;
  zx_seq = Tensor();
  const Offsets o(dc);
  const int64_t T = zx.size(0), CD = dc.conv_dim(), DI = dc.DI, NH = dc.NH, P = dc.P, N = dc.N, G = dc.G;
  const int64_t heads_per_group = NH / G;
  std::vector<ConvSequence> conv_seqs;  // the convolution's view of the sequences
  for (const MambaSequence& q : seqs)
    conv_seqs.push_back(ConvSequence{q.first, q.stride, q.length, q.conv_state, q.conv_steps});
  check_conv_sequences(conv_seqs, T, "mamba mixer");
  GALE_CHECK(starts_v.empty() || static_cast<int64_t>(starts_v.size()) == T)
      << "mamba mixer: " << starts_v.size() << " document starts for " << T << " rows";
  const int32_t* starts = starts_v.empty() ? nullptr : starts_v.data();
  const float* zxp = zx.data<float>();
  Tensor conv_pre = Tensor::empty({T, CD});
  // Before each sequence's position 0 its conv_state's inputs (zero without one); then its last K−1 inputs.
  causal_conv1d_forward_sequences(zxp + o.xbc, o.R, wc.conv_w, wc.conv_b, conv_pre.data<float>(), CD, dc.K, conv_seqs,
                                  starts);
  Tensor xbc = Tensor::empty({T, CD});
  {
    const float* cp = conv_pre.data<float>();
    float* xp = xbc.data<float>();
    for (int64_t i = 0; i < T * CD; ++i) xp[i] = siluf(cp[i]);
  }
  // The selective scan, one (sample, head) at a time.
  Tensor y = Tensor::empty({T, DI});
  const bool round_states = training_states && rounds_states(wc);
  if (round_states) GALE_CHECK_GT(wc.chunk, 0) << "mamba mixer: chunk size";
  {
    const float* xp = xbc.data<float>();
    float* yp = y.data<float>();
    parallel_for(static_cast<int64_t>(seqs.size()) * NH, 1, [&](int64_t b0, int64_t e0) {
      std::vector<float> st(static_cast<size_t>(P * N));
      // --mamba-training-ssm-states-dtype: E = stored(state entering the chunk) − that state, and the
      // chunk's decay Π a so far; the outputs read state + decay·E (the stored entering state).
      std::vector<float> err(round_states ? static_cast<size_t>(P * N) : 0);
      float decay = 1.0f;
      for (int64_t task = b0; task < e0; ++task) {
        const MambaSequence& q = seqs[static_cast<size_t>(task / NH)];
        const int64_t h = task % NH, g = h / heads_per_group;
        const float A = -std::exp(wc.a_log[h]);
        if (q.ssm_state)
          std::copy_n(q.ssm_state + h * P * N, P * N, st.begin());
        else
          std::fill(st.begin(), st.end(), 0.0f);
        if (round_states) {  // the first chunk enters with the zero state
          std::fill(err.begin(), err.end(), 0.0f);
          decay = 1.0f;
        }
        for (int64_t s = 0; s < q.length; ++s) {
          const int64_t t = q.first + s * q.stride;
          const float dt = softplusf(zxp[t * o.R + o.dt + h] + wc.dt_bias[h]);
          const float a = std::exp(dt * A);
          const float* x = xp + t * CD + h * P;
          const float* Bv = xp + t * CD + DI + g * N;
          const float* Cv = xp + t * CD + DI + G * N + g * N;
          const bool reset = starts_document(starts, t, s);  // a packed document's first position
          if (reset) std::fill(st.begin(), st.end(), 0.0f);
          if (round_states) {
            if (s > 0 && s % wc.chunk == 0) {
              for (int64_t i = 0; i < P * N; ++i) err[i] = stored_as(wc.ssm_states, st[i]) - st[i];
              decay = 1.0f;
            }
            if (reset) decay = 0.0f;  // the chunk's stored entering state stays before the document
            decay *= a;
            for (int64_t p = 0; p < P; ++p) {
              float* sp = st.data() + p * N;
              const float* ep = err.data() + p * N;
              const float dx = dt * x[p];
              float acc = 0.0f;
              for (int64_t n = 0; n < N; ++n) {
                sp[n] = a * sp[n] + dx * Bv[n];
                acc += (sp[n] + decay * ep[n]) * Cv[n];
              }
              yp[t * DI + h * P + p] = acc + wc.d[h] * x[p];
            }
            continue;
          }
          for (int64_t p = 0; p < P; ++p) {
            float* sp = st.data() + p * N;
            const float dx = dt * x[p];
            float acc = 0.0f;
            for (int64_t n = 0; n < N; ++n) {
              sp[n] = a * sp[n] + dx * Bv[n];
              acc += sp[n] * Cv[n];
            }
            yp[t * DI + h * P + p] = acc + wc.d[h] * x[p];
          }
          if (q.ssm_steps) std::copy(st.begin(), st.end(), q.ssm_steps + (s * NH + h) * P * N);
        }
        if (q.ssm_state) std::copy(st.begin(), st.end(), q.ssm_state + h * P * N);
      }
    });
  }
  // Gated grouped RMSNorm, on this rank's positions (under CP after the reverse all-to-all).
  Tensor g = gate_forward(dc, zx, y);
  if (use_cp) g = mamba_cp_heads_to_seq(w.cp, g);
  Tensor normed, rstd;
  gated_norm_forward(d.G, g, w.gnorm_w, &normed, &rstd);
  Tensor normed_in = to_gemm_input(normed, gemm_dtype);
  Tensor out = row_parallel_linear_forward(w.tp, normed_in, w.out_proj);  // [T, H] (this rank's rows under SP)
  if (saved) {
    saved->u = u_saved;
    saved->zxbcdt = zx;
    saved->conv_pre = conv_pre;
    saved->y = y;
    if (use_cp) saved->gated = g;
    saved->rstd = rstd;
    saved->normed = normed_in;
    saved->starts = starts_v;
  }
  return out;
}

}  // namespace

Tensor mamba_mixer_forward(const MambaDims& d, const MambaMixerWeights& w, const Tensor& u, int64_t S, int64_t B,
                           DType gemm_dtype, MambaMixerSaved* saved, const std::vector<int32_t>& starts) {
  const int64_t S_run = w.cp.on() ? w.cp.split->seq_length : S;  // CP: the scan runs on whole sequences
  std::vector<MambaSequence> seqs(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) seqs[static_cast<size_t>(b)] = MambaSequence{b, B, S_run, nullptr, nullptr};
  return mixer_forward(d, w, u, seqs, gemm_dtype, saved, /*training_states=*/true, starts);
}

Tensor mamba_mixer_forward_sequences(const MambaDims& d, const MambaMixerWeights& w, const Tensor& u,
                                     const std::vector<MambaSequence>& seqs, DType gemm_dtype) {
  GALE_CHECK(!w.cp.on()) << "mamba_mixer_forward_sequences: no context parallelism";
  return mixer_forward(d, w, u, seqs, gemm_dtype, nullptr, /*training_states=*/false, {});
}

Tensor mamba_mixer_backward(const MambaDims& d, const MambaMixerWeights& w, MambaMixerSaved& sv, const Tensor& d_out,
                            int64_t S_local, int64_t B) {
  // Under CP the part between the all-to-alls runs on whole sequences of this cp rank's heads (dc, wc).
  const bool use_cp = w.cp.on();
  const MambaCpWeights scan_part(d, w);
  const MambaDims& dc = scan_part.dims();
  const MambaMixerWeights& wc = scan_part.weights();
  const int64_t S = use_cp ? w.cp.split->seq_length : S_local;
  const Offsets o(dc);
  const int64_t T = S * B, CD = dc.conv_dim(), DI = dc.DI, NH = dc.NH, P = dc.P, N = dc.N, G = dc.G, K = dc.K;
  const int64_t heads_per_group = NH / G;
  const std::vector<int32_t> starts_v = std::move(sv.starts);
  GALE_CHECK(starts_v.empty() || static_cast<int64_t>(starts_v.size()) == T)
      << "mamba mixer backward: " << starts_v.size() << " document starts for " << T << " rows";
  const int32_t* starts = starts_v.empty() ? nullptr : starts_v.data();
  Tensor d_normed = row_parallel_linear_backward(w.tp, d_out, sv.normed, w.out_proj);  // [T_local, DI of d]
  sv.normed = Tensor();
  Tensor dg;
  {
    const Tensor g = sv.gated.defined() ? sv.gated : gate_forward(d, sv.zxbcdt, sv.y);
    dg = gated_norm_backward(d.G, g, sv.rstd, d_normed, w.gnorm_w, w.g_gnorm_w);
  }
  if (use_cp) dg = mamba_cp_heads_to_seq_backward(w.cp, dg);
  const float* zxp = sv.zxbcdt.data<float>();
  Tensor d_zx = Tensor::zeros({T, o.R});
  float* dzx = d_zx.data<float>();
  Tensor dy = gate_backward(dc, sv.zxbcdt, sv.y, dg, dzx);
  const float* dyp = dy.data<float>();
  d_normed = dg = Tensor();
  sv.y = sv.gated = sv.rstd = Tensor();
  // The scan's backward, one (sample, group) at a time (its heads share B and C).
  Tensor xbc = Tensor::empty({T, CD});
  const float* cp = sv.conv_pre.data<float>();
  {
    float* xp = xbc.data<float>();
    for (int64_t i = 0; i < T * CD; ++i) xp[i] = siluf(cp[i]);
  }
  const float* xp = xbc.data<float>();
  Tensor d_xbc = Tensor::zeros({T, CD});
  float* dxp = d_xbc.data<float>();
  std::vector<double> d_alog(static_cast<size_t>(B * NH), 0.0), d_dd(static_cast<size_t>(B * NH), 0.0);
  Tensor d_dt = Tensor::empty({T, NH});  // d loss / d softplus output
  float* ddtp = d_dt.data<float>();
  // --mamba-training-ssm-states-dtype: the forward's outputs read state_s + decay_s·E_c (E_c the
  // rounding error of the state entering chunk c, decay_s = Π a over the chunk up to s). The rounding
  // passes the gradient straight through (a cast's derivative), so E_c is a constant: it adds
  // decay_s·E_c to the state dC reads, and q_s = decay_s·Σ dy_s ⊗ C_s : E_c reaches Δ_j and A through
  // every a_j of the chunk up to s: Δ_j gets A·Σ_{s≥j} q_s and A gets Σ_j Δ_j·Σ_{s≥j} q_s.
  const bool round_states = rounds_states(wc);
  const int64_t Q = wc.chunk, chunks = round_states ? (S + Q - 1) / Q : 0;
  parallel_for(B * G, 1, [&](int64_t b0, int64_t e0) {
    std::vector<float> states(static_cast<size_t>(S * P * N)), dst(static_cast<size_t>(P * N));
    std::vector<float> err(static_cast<size_t>(chunks * P * N)), decay(round_states ? static_cast<size_t>(S) : 0);
    for (int64_t task = b0; task < e0; ++task) {
      const int64_t b = task / G, g = task % G;
      for (int64_t h = g * heads_per_group; h < (g + 1) * heads_per_group; ++h) {
        const float A = -std::exp(wc.a_log[h]);
        auto dt_at = [&](int64_t t) { return softplusf(zxp[t * o.R + o.dt + h] + wc.dt_bias[h]); };
        // forward states again
        for (int64_t s = 0; s < S; ++s) {
          const int64_t t = s * B + b;
          const float dt = dt_at(t), a = std::exp(dt * A);
          const float* x = xp + t * CD + h * P;
          const float* Bv = xp + t * CD + DI + g * N;
          float* cur = states.data() + s * P * N;
          const bool reset = starts_document(starts, t, s);
          const float* prev = s > 0 && !reset ? cur - P * N : nullptr;
          for (int64_t p = 0; p < P; ++p)
            for (int64_t n = 0; n < N; ++n)
              cur[p * N + n] = (prev ? a * prev[p * N + n] : 0.0f) + dt * x[p] * Bv[n];
          if (round_states) decay[s] = reset ? 0.0f : (s % Q == 0 ? 1.0f : decay[s - 1]) * a;
        }
        if (round_states) {
          std::fill(err.begin(), err.begin() + P * N, 0.0f);  // chunk 0 enters with the zero state
          for (int64_t c = 1; c < chunks; ++c) {
            const float* entering = states.data() + (c * Q - 1) * P * N;
            for (int64_t i = 0; i < P * N; ++i) err[c * P * N + i] = stored_as(wc.ssm_states, entering[i]) - entering[i];
          }
        }
        double q_sum = 0.0;  // Σ q over the chunk's positions from s on
        std::fill(dst.begin(), dst.end(), 0.0f);
        double dA = 0.0, dD = 0.0;
        for (int64_t s = S - 1; s >= 0; --s) {
          const int64_t t = s * B + b;
          const float dt = dt_at(t), a = std::exp(dt * A);
          const float* x = xp + t * CD + h * P;
          const float* Bv = xp + t * CD + DI + g * N;
          const float* Cv = xp + t * CD + DI + G * N + g * N;
          float* dx = dxp + t * CD + h * P;
          float* dB = dxp + t * CD + DI + g * N;
          float* dC = dxp + t * CD + DI + G * N + g * N;
          const float* dyv = dyp + t * DI + h * P;
          const float* cur = states.data() + s * P * N;
          const bool reset = starts_document(starts, t, s);  // the state before it does not reach s
          const float* prev = s > 0 && !reset ? cur - P * N : nullptr;
          double da = 0.0, ddt = 0.0;
          if (round_states) {
            const float* ep = err.data() + (s / Q) * P * N;
            const float dec = decay[s];
            double q = 0.0;
            for (int64_t p = 0; p < P; ++p)
              for (int64_t n = 0; n < N; ++n) {
                dC[n] += dyv[p] * dec * ep[p * N + n];
                q += static_cast<double>(dyv[p]) * Cv[n] * ep[p * N + n];
              }
            if (s == S - 1 || (s + 1) % Q == 0) q_sum = 0.0;  // the chunk's last position
            q_sum += q * dec;
            ddt += q_sum * A;
            dA += q_sum * dt;
          }
          for (int64_t p = 0; p < P; ++p) {
            float* dsp = dst.data() + p * N;
            float dxs = 0.0f;
            for (int64_t n = 0; n < N; ++n) {
              dsp[n] += dyv[p] * Cv[n];
              dC[n] += dyv[p] * cur[p * N + n];
              if (prev) da += static_cast<double>(dsp[n]) * prev[p * N + n];
              ddt += static_cast<double>(dsp[n]) * x[p] * Bv[n];
              dxs += dsp[n] * Bv[n];
              dB[n] += dt * dsp[n] * x[p];
            }
            dD += static_cast<double>(dyv[p]) * x[p];
            dx[p] += wc.d[h] * dyv[p] + dt * dxs;
          }
          ddt += da * a * A;
          dA += da * a * dt;
          ddtp[t * NH + h] = static_cast<float>(ddt);
          for (float& v : dst) v = reset ? 0.0f : v * a;
        }
        d_alog[static_cast<size_t>(b * NH + h)] = dA * A;
        d_dd[static_cast<size_t>(b * NH + h)] = dD;
      }
    }
  });
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      if (wc.g_a_log) wc.g_a_log[h] += static_cast<float>(d_alog[static_cast<size_t>(b * NH + h)]);
      if (wc.g_d) wc.g_d[h] += static_cast<float>(d_dd[static_cast<size_t>(b * NH + h)]);
    }
  // Δ = softplus(dt + dt_bias): dΔ/d(dt) = sigmoid(dt + dt_bias).
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < NH; ++h) {
      const float v = ddtp[t * NH + h] * sigmoidf(zxp[t * o.R + o.dt + h] + wc.dt_bias[h]);
      dzx[t * o.R + o.dt + h] = v;
      if (wc.g_dt_bias) wc.g_dt_bias[h] += v;
    }
  // SiLU and the convolution: channels are independent.
  for (int64_t i = 0; i < T * CD; ++i) dxp[i] *= dsiluf(cp[i]);  // now d conv_pre
  causal_conv1d_backward(dxp, zxp + o.xbc, o.R, wc.conv_w, dzx + o.xbc, o.R, wc.g_conv_w, wc.g_conv_b, CD, K, S, B,
                         starts);
  sv.conv_pre = Tensor();
  if (use_cp) {
    d_zx = mamba_cp_seq_to_heads_backward(w.cp, d, d_zx);
    scan_part.add_grads();
  }
  Tensor du = column_parallel_linear_backward(w.tp, d_zx, sv.u, w.in_proj);
  sv.u = sv.zxbcdt = Tensor();
  return du;
}

namespace {

DropoutSpec mamba_dropout(const LayerRuntime& rt, int64_t layer) {
  DropoutSpec d;
  d.p = rt.training ? rt.config->hidden_dropout : 0.0f;
  d.seed = rt.config->seed;
  d.stream = dropout_stream(rt.config->seed, layer, 2);
  d.row_ids = rt.hidden_row_ids.data();
  d.cols_total = rt.config->hidden;
  return d;
}

// This rank's dims and weights, the linears over the partition's TP group.
MambaDims mixer_dims(const LayerRuntime& rt) { return MambaDims::of(*rt.config).tp_local(rt.part->tp_size()); }

MambaMixerWeights mixer_weights(const LayerRuntime& rt, const ParamBuffer& pb, const MambaParamIds& w) {
  MambaMixerWeights m = mamba_mixer_weights(pb, w, rt.ops->gemm, rt.ops->bf16_gemm);
  m.tp = TpLinearComm{rt.part->tp.get(), rt.part->sequence_parallel, rt.ops->tp_comm_chunks, rt.ops->tp_regather_input};
  m.ssm_states = rt.config->hybrid.training_ssm_states;
  m.chunk = rt.config->hybrid.chunk_size;
  if (rt.cp_split.cp_size > 1) m.cp = MambaCpComm{rt.part->cp.get(), &rt.cp_split};
  return m;
}

// Inference forwards: each sample's or request's rows with its decoding state (kv_cache.h
// recurrent_decoding_rows); empty otherwise.
std::vector<MambaSequence> decoding_sequences(const LayerRuntime& rt, int64_t layer) {
  std::vector<MambaSequence> seqs;
  for (const RecurrentRows& r :
       recurrent_decoding_rows(rt.kv_cache, rt.ragged_kv, rt.mb->B, rt.mb->S, layer - rt.part->first_layer))
    seqs.push_back(MambaSequence{r.first, r.stride, r.length, r.conv, r.ssm, r.conv_steps, r.ssm_steps});
  return seqs;
}

}  // namespace

Tensor mamba_layer_forward(const LayerRuntime& rt, const ParamBuffer& pb, const MambaParamIds& w, int64_t layer,
                           const Tensor& x_in, MambaLayerSaved* saved) {
  const ModelConfig& c = *rt.config;
  const OpTable& ops = *rt.ops;
  const int64_t T = x_in.size(0), H = c.hidden;
  Tensor normed = Tensor::empty({T, H});
  Tensor stats = Tensor::empty({c.rms_norm ? 1 : 2, T});
  ops.norm_forward(NormSpec{c.rms_norm, c.norm_eps}, x_in.data<float>(), NormScale(c, pb, w.norm_w).data(),
                   w.norm_b >= 0 ? pb.param_data(w.norm_b) : nullptr, normed.data<float>(), stats.data<float>(), T, H);
  Tensor u = to_gemm_input(normed, c.gemm_dtype());
  normed = Tensor();
  const MambaDims d = mixer_dims(rt);
  const MambaMixerWeights mw = mixer_weights(rt, pb, w);
  const std::vector<MambaSequence> seqs = decoding_sequences(rt, layer);
  Tensor out = seqs.empty() ? mamba_mixer_forward(d, mw, u, rt.mb->S, rt.mb->B, c.gemm_dtype(),
                                                  saved ? &saved->mixer : nullptr, scan_document_starts(*rt.mb))
                            : mamba_mixer_forward_sequences(d, mw, u, seqs, c.gemm_dtype());
  Tensor x_out = Tensor::empty({T, H});
  ops.bias_dropout_add(out.data<float>(), nullptr, x_in.data<float>(), x_out.data<float>(), T, H,
                       mamba_dropout(rt, layer));
  if (saved) {
    saved->x_in = x_in;
    saved->norm_stats = stats;
  }
  return x_out;
}

Tensor mamba_layer_backward(const LayerRuntime& rt, ParamBuffer& pb, const MambaParamIds& w, int64_t layer,
                            MambaLayerSaved& s, const Tensor& d_out) {
  const ModelConfig& c = *rt.config;
  const OpTable& ops = *rt.ops;
  const int64_t T = d_out.size(0), H = c.hidden;
  Tensor d_mix = Tensor::empty({T, H});
  ops.bias_dropout_add_backward(d_out.data<float>(), d_mix.data<float>(), nullptr, T, H, mamba_dropout(rt, layer));
  Tensor d_u = mamba_mixer_backward(mixer_dims(rt), mixer_weights(rt, pb, w), s.mixer, d_mix, rt.mb->S, rt.mb->B);
  d_mix = Tensor();
  Tensor d_x = Tensor::empty({T, H});
  ops.norm_backward(NormSpec{c.rms_norm, c.norm_eps}, d_u.data<float>(), s.x_in.data<float>(),
                    NormScale(c, pb, w.norm_w).data(), s.norm_stats.data<float>(), d_x.data<float>(),
                    pb.grad_data(w.norm_w), w.norm_b >= 0 ? pb.grad_data(w.norm_b) : nullptr, T, H);
  add_inplace(d_x.data<float>(), d_out.data<float>(), T * H);  // the residual
  s.x_in = s.norm_stats = Tensor();
  return d_x;
}

}  // namespace gale
