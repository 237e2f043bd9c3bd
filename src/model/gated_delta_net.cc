// Gated DeltaNet mixer: in_proj, causal conv, l2-normalised q/k, the gated delta rule, gated RMSNorm, out_proj.
#include "model/gated_delta_net.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "core/threads.h"
#include "model/causal_conv1d.h"
#include "model/document_starts.h"
#include "model/gdn_context_parallel.h"
#include "model/norm_weight.h"
#include "model/param_builders.h"
#include "parallel/mappings.h"

namespace gale {

namespace {

constexpr float kL2NormEps = 1e-6f;  // FLA's l2norm
constexpr int64_t kChunk = 64;       // backward keeps the state at every kChunk-th position

inline float sigmoidf(float v) { return 1.0f / (1.0f + std::exp(-v)); }
inline float siluf(float v) { return v * sigmoidf(v); }
inline float dsiluf(float v) {
  const float s = sigmoidf(v);
  return s * (1.0f + v * (1.0f - s));
}
inline float softplusf(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }  // torch's, threshold 20

std::string gdn_name(int64_t layer, const char* rest) {
  return str_cat("decoder.layers.", layer, ".self_attention.", rest);
}

// Column offsets of one in_proj row: q, k, v, z, then GDN's b (β's logit) and a (the decay's input)
// or GDN2's f (the decay's input), e (the erase gate's logit) and w (the write gate's logit).
struct Offsets {
  int64_t R, k, v, z, b, a, f, e, w;
  explicit Offsets(const GdnDims& d)
      : R(d.in_proj_rows()), k(d.qk_dim()), v(2 * d.qk_dim()), z(d.conv_dim()), b(d.conv_dim() + d.v_dim()),
        a(d.conv_dim() + d.v_dim() + d.NV), f(d.conv_dim() + d.v_dim()), e(d.conv_dim() + d.v_dim() + d.qk_dim()),
        w(d.conv_dim() + d.v_dim() + 2 * d.qk_dim()) {}
};

// What the recurrence reads, from in_proj's output and the convolution's: v (silu'd), q and k
// l2-normalised (with their 1/norm), and the gates: GDN's log-decay g and β per value head, or GDN2's
// log-decay g and erase gate e per key channel and write gate ω per value channel.
struct Prepared {
  Tensor qkv;     // [T, conv_dim] silu(conv): q | k | v (q and k replaced by their normalised values)
  Tensor rq, rk;  // [T, NK] 1/√(Σx² + eps)
  Tensor g, e;    // [T, NV] (GDN: g, β) or [T, NK·DK] (GDN2: g, e)
  Tensor wg;      // [T, NV·DV] GDN2's ω (GDN: undefined, β writes)
};

Prepared prepare(const GdnDims& d, const GdnWeights& w, const float* zx, const float* conv_pre, int64_t T) {
  const Offsets o(d);
  const int64_t CD = d.conv_dim(), NK = d.NK, DK = d.DK, NV = d.NV, QK = d.qk_dim(), VD = d.v_dim();
  const int64_t GW = d.gdn2 ? QK : NV;
  Prepared p;
  p.qkv = Tensor::empty({T, CD});
  p.rq = Tensor::empty({T, NK});
  p.rk = Tensor::empty({T, NK});
  p.g = Tensor::empty({T, GW});
  p.e = Tensor::empty({T, GW});
  if (d.gdn2) p.wg = Tensor::empty({T, VD});
  float* x = p.qkv.data<float>();
  float *rq = p.rq.data<float>(), *rk = p.rk.data<float>(), *g = p.g.data<float>(), *e = p.e.data<float>();
  float* wg = d.gdn2 ? p.wg.data<float>() : nullptr;
  parallel_for(T, 16, [&](int64_t b0, int64_t e0) {
    for (int64_t t = b0; t < e0; ++t) {
      float* row = x + t * CD;
      for (int64_t c = 0; c < CD; ++c) row[c] = siluf(conv_pre[t * CD + c]);
      for (int64_t part = 0; part < 2; ++part)
        for (int64_t h = 0; h < NK; ++h) {
          float* v = row + part * d.qk_dim() + h * DK;
          double ss = 0.0;
          for (int64_t i = 0; i < DK; ++i) ss += static_cast<double>(v[i]) * v[i];
          const float r = 1.0f / std::sqrt(static_cast<float>(ss) + kL2NormEps);
          for (int64_t i = 0; i < DK; ++i) v[i] *= r;
          (part == 0 ? rq : rk)[t * NK + h] = r;
        }
      const float* zr = zx + t * o.R;
      if (!d.gdn2) {
        for (int64_t h = 0; h < NV; ++h) {
          g[t * NV + h] = -std::exp(w.a_log[h]) * softplusf(zr[o.a + h] + w.dt_bias[h]);
          e[t * NV + h] = sigmoidf(zr[o.b + h]);
        }
        continue;
      }
      for (int64_t c = 0; c < QK; ++c) {  // key channel c of key head c / DK
        g[t * QK + c] = -std::exp(w.a_log[c / DK]) * softplusf(zr[o.f + c] + w.dt_bias[c]);
        e[t * QK + c] = sigmoidf(zr[o.e + c]);
      }
      for (int64_t c = 0; c < VD; ++c) wg[t * VD + c] = sigmoidf(zr[o.w + c]);
    }
  });
  return p;
}

// The channel-wise gates value head h reads at row t: the decay a = exp(g) and erase gate e [DK],
// the write gate ω [DV] (GDN: exp(g_h), β and β broadcast).
inline void gates_at(const GdnDims& d, const Prepared& p, int64_t t, int64_t h, float* a, float* e, float* wg) {
  if (!d.gdn2) {
    const float ah = std::exp(p.g.data<float>()[t * d.NV + h]), beta = p.e.data<float>()[t * d.NV + h];
    std::fill(a, a + d.DK, ah);
    std::fill(e, e + d.DK, beta);
    std::fill(wg, wg + d.DV, beta);
    return;
  }
  const int64_t kh = h / (d.NV / d.NK), QK = d.qk_dim();
  const float *g = p.g.data<float>() + t * QK + kh * d.DK, *ep = p.e.data<float>() + t * QK + kh * d.DK;
  for (int64_t i = 0; i < d.DK; ++i) {
    a[i] = std::exp(g[i]);
    e[i] = ep[i];
  }
  std::copy_n(p.wg.data<float>() + t * d.v_dim() + h * d.DV, d.DV, wg);
}

// One step of the channel-wise gated delta rule on state st [DK, DV]:
// st ← Diag(a)·st;  st += k ⊗ (ω ⊙ v − stᵀ(e ⊙ k)).
inline void delta_step(float* st, const float* k, const float* v, const float* a, const float* e, const float* wg,
                       float* kv, int64_t DK, int64_t DV) {
  for (int64_t i = 0; i < DK; ++i)
    for (int64_t j = 0; j < DV; ++j) st[i * DV + j] *= a[i];
  std::fill(kv, kv + DV, 0.0f);
  for (int64_t i = 0; i < DK; ++i) {
    const float ek = e[i] * k[i];
    for (int64_t j = 0; j < DV; ++j) kv[j] += ek * st[i * DV + j];
  }
  for (int64_t j = 0; j < DV; ++j) kv[j] = wg[j] * v[j] - kv[j];  // now u
  for (int64_t i = 0; i < DK; ++i)
    for (int64_t j = 0; j < DV; ++j) st[i * DV + j] += k[i] * kv[j];
}

// The gates' inputs' gradients into dzx (and dt_bias's, A_log's), from the recurrence's per value
// head gradients dg, de [T, NV·DK] (of the log-decay and the erase gate per key channel) and dwg
// [T, NV·DV] (of the write gate). GDN: g_h = −exp(A_log_h)·softplus(a_h + dt_bias_h) and β_h =
// sigmoid(b_h) gate all channels (β erases and writes); GDN2: g = −exp(A_log_kh)·softplus(f + dt_bias)
// and e = sigmoid(b) per key channel, summed over the value heads reading them, ω = sigmoid(w).
void gate_backward(const GdnDims& d, const GdnWeights& w, const Offsets& of, const Prepared& p, const float* zxp,
                   const Tensor& dg, const Tensor& de, const Tensor& dwg, float* dzx) {
  const int64_t T = dg.size(0), NV = d.NV, DK = d.DK, DV = d.DV, QK = d.qk_dim(), VD = d.v_dim(), r = d.NV / d.NK;
  const float *dgp = dg.data<float>(), *dep = de.data<float>(), *dwp = dwg.data<float>();
  const float *g = p.g.data<float>(), *e = p.e.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* zr = zxp + t * of.R;
    float* dr = dzx + t * of.R;
    if (!d.gdn2) {
      for (int64_t h = 0; h < NV; ++h) {
        double sg = 0.0, sb = 0.0;
        for (int64_t i = 0; i < DK; ++i) {
          sg += dgp[t * NV * DK + h * DK + i];
          sb += dep[t * NV * DK + h * DK + i];
        }
        for (int64_t j = 0; j < DV; ++j) sb += dwp[t * VD + h * DV + j];
        const float dgh = static_cast<float>(sg), da = dgh * -std::exp(w.a_log[h]) * sigmoidf(zr[of.a + h] + w.dt_bias[h]);
        dr[of.a + h] = da;
        if (w.g_dt_bias) w.g_dt_bias[h] += da;
        if (w.g_a_log) w.g_a_log[h] += dgh * g[t * NV + h];
        const float bt = e[t * NV + h];
        dr[of.b + h] = static_cast<float>(sb) * bt * (1.0f - bt);
      }
      continue;
    }
    for (int64_t c = 0; c < QK; ++c) {  // key channel c of key head kh = c / DK, read by value heads kh·r … kh·r + r − 1
      const int64_t kh = c / DK, i = c % DK;
      double sg = 0.0, se = 0.0;
      for (int64_t h = kh * r; h < (kh + 1) * r; ++h) {
        sg += dgp[t * NV * DK + h * DK + i];
        se += dep[t * NV * DK + h * DK + i];
      }
      const float dgc = static_cast<float>(sg);
      const float df = dgc * -std::exp(w.a_log[kh]) * sigmoidf(zr[of.f + c] + w.dt_bias[c]);
      dr[of.f + c] = df;
      if (w.g_dt_bias) w.g_dt_bias[c] += df;
      if (w.g_a_log) w.g_a_log[kh] += dgc * g[t * QK + c];
      const float ec = e[t * QK + c];
      dr[of.e + c] = static_cast<float>(se) * ec * (1.0f - ec);
    }
    const float* wg = p.wg.data<float>();
    for (int64_t c = 0; c < VD; ++c) {
      const float wc = wg[t * VD + c];
      dr[of.w + c] = dwp[t * VD + c] * wc * (1.0f - wc);
    }
  }
}

}  // namespace

GdnDims GdnDims::of(const ModelConfig& c) {
  GdnDims d;
  d.H = c.hidden;
  d.NK = c.gdn.num_key_heads;
  d.NV = c.gdn.num_value_heads;
  d.DK = c.gdn.key_head_dim;
  d.DV = c.gdn.value_head_dim;
  d.K = c.gdn.conv_kernel;
  d.norm_eps = c.norm_eps;
  // GdnConfig::pattern marks GDN2 layers 2 (--experimental-attention-variant gdn2), GDN layers 1.
  const std::vector<int>& pattern = c.gdn.pattern;
  d.gdn2 = std::find(pattern.begin(), pattern.end(), 2) != pattern.end();
  for (int k : pattern)
    GALE_CHECK(k == 0 || k == (d.gdn2 ? 2 : 1)) << "Gated DeltaNet: a layer pattern mixing GDN (1) and GDN2 (2) layers";
  return d;
}

std::vector<int64_t> GdnDims::in_proj_sections() const {
  const int64_t QK = qk_dim(), VD = v_dim();
  if (gdn2) return {QK, QK, VD, VD, QK, QK, VD};  // q, k, v, z, f, b, w
  return {QK, QK, VD, VD, NV, NV};                 // q, k, v, z, β, α
}

GdnDims GdnDims::tp_local(int64_t tp) const {
  GALE_CHECK(tp >= 1 && NK % tp == 0 && NV % tp == 0)
      << "Gated DeltaNet: tensor-parallel size " << tp << " must divide the key heads (" << NK << ") and value heads ("
      << NV << ")";
  GdnDims d = *this;
  d.NK /= tp;
  d.NV /= tp;
  return d;
}

std::vector<int> GdnParamIds::all() const {
  std::vector<int> ids;
  for (int id : {in_proj, conv_w, dt_bias, a_log, out_norm_w, out_proj, lora_in.a, lora_in.b, lora_out.a, lora_out.b})
    if (id >= 0) ids.push_back(id);
  return ids;
}

GdnParamIds register_gdn_params(ParamBuffer& pb, const ModelConfig& c, int64_t layer, const ModelPartition* part) {
  const GdnDims d = GdnDims::of(c);
  const bool tp = part != nullptr && part->tp_size() > 1;
  if (tp) d.tp_local(part->tp_size());  // checks the split
  // Split along `dim` in sections of these extents, each on its own (model/param_builders.h), or
  // replicated at TP 1.
  auto split = [&](ParamSpec s, int dim, std::vector<int64_t> extents) {
    return tp ? tp_split_sections(std::move(s), *part, dim, std::move(extents)) : s;
  };
  const int64_t QK = d.qk_dim(), VD = d.v_dim();
  GdnParamIds w;
  const float conv_bound = 1.0f / std::sqrt(static_cast<float>(d.K));  // kaiming_uniform(a=√5), fan_in K
  w.in_proj = pb.add(gemm_weight(split(make_param_spec(gdn_name(layer, "in_proj.weight"), {d.in_proj_rows(), d.H},
                                                       InitKind::kNormal, c.init_std, true),
                                       0, d.in_proj_sections())));
  w.conv_w = pb.add(split(make_param_spec(gdn_name(layer, "conv1d.weight"), {d.conv_dim(), d.K}, InitKind::kUniform,
                                          conv_bound, true),
                          0, {QK, QK, VD}));
  // GDN: dt_bias 1 per value head; GDN2: softplus⁻¹ of a log-uniform step per key channel (Megatron's
  // GatedDeltaNet2._reset_dt_bias, the Mamba mixer's init). A_log = log U(1, 16) per value (key) head.
  const InitKind dt_init = d.gdn2 ? InitKind::kMambaDtBias : InitKind::kOnes;
  w.dt_bias = pb.add(split(make_param_spec(gdn_name(layer, "dt_bias"), {d.dt_bias_dim()}, dt_init, 0, false), 0,
                           {d.dt_bias_dim()}));
  w.a_log = pb.add(split(make_param_spec(gdn_name(layer, "A_log"), {d.a_log_dim()}, InitKind::kMambaALog, 0, false), 0,
                         {d.a_log_dim()}));
  // Replicated: every value head's norm shares it, so each TP rank's heads give a partial gradient.
  ParamSpec out_norm = make_param_spec(gdn_name(layer, "out_norm.weight"), {d.DV}, norm_weight_init(c), 0, false);
  out_norm.sequence_parallel = tp;
  w.out_norm_w = pb.add(out_norm);
  const float out_std = c.init_std / std::sqrt(2.0f * static_cast<float>(c.num_layers));  // output_layer_init_method
  w.out_proj = pb.add(gemm_weight(split(make_param_spec(gdn_name(layer, "out_proj.weight"), {d.H, VD},
                                                        InitKind::kNormal, out_std, true),
                                        1, {VD})));
  const bool lora_in = lora_targets(c.lora, LoraTarget::kInProj), lora_out = lora_targets(c.lora, LoraTarget::kOutProj);
  if (lora_in || lora_out) {
    std::optional<ModelPartition> whole;  // TP 1 without a partition: the single-process one
    if (!part) whole.emplace(single_process_partition(c));
    const ModelPartition& one = part ? *part : *whole;
    if (lora_in && !tp) {
      w.lora_in = register_lora_params(pb, c.lora, one, gdn_name(layer, "in_proj.weight"), d.in_proj_rows(), d.H,
                                       LoraSplit::kColumn);
    } else if (lora_in) {  // register_lora_params' kColumn, lora_B's rows split as in_proj's: each section on its own
      const std::string wn = gdn_name(layer, "in_proj.weight");
      ParamSpec a = make_param_spec(lora_a_name(wn), {c.lora.r, d.H}, InitKind::kUniform,
                                    1.0f / std::sqrt(static_cast<float>(d.H)), true);
      ParamSpec b = make_param_spec(lora_b_name(wn), {d.in_proj_rows(), c.lora.r}, InitKind::kZeros, 0.0f, true);
      a.sequence_parallel = true;  // replicated, gradient partial per TP rank: all-reduced over TP
      w.lora_in.a = pb.add(std::move(a));
      w.lora_in.b = pb.add(tp_split_sections(std::move(b), *part, 0, d.in_proj_sections()));
    }
    if (lora_out)
      w.lora_out = register_lora_params(pb, c.lora, one, gdn_name(layer, "out_proj.weight"), d.H, VD, LoraSplit::kRow);
  }
  return w;
}

GdnWeights gdn_weights(const ModelConfig& c, const ParamBuffer& pb, const GdnParamIds& w, SgemmFn gemm,
                       Bf16GemmFn bf16_gemm) {
  GdnWeights m;
  m.in_proj = linear_weight(pb, w.in_proj, gemm, bf16_gemm);
  m.out_proj = linear_weight(pb, w.out_proj, gemm, bf16_gemm);
  m.conv_w = pb.param_data(w.conv_w);
  m.dt_bias = pb.param_data(w.dt_bias);
  m.a_log = pb.param_data(w.a_log);
  const NormScale scale(c, pb, w.out_norm_w);
  m.out_norm.assign(scale.data(), scale.data() + pb.spec(w.out_norm_w).local_numel());
  m.g_conv_w = pb.grad_data(w.conv_w);
  m.g_dt_bias = pb.grad_data(w.dt_bias);
  m.g_a_log = pb.grad_data(w.a_log);
  m.g_out_norm = pb.grad_data(w.out_norm_w);
  if (w.lora_in.defined()) m.lora_in = lora_weights(pb, w.lora_in, c.lora.scaling(), gemm);
  if (w.lora_out.defined()) m.lora_out = lora_weights(pb, w.lora_out, c.lora.scaling(), gemm);
  return m;
}

namespace {

bool tp_parallel(const TpLinearComm& c) { return c.tp != nullptr && c.tp->size() > 1; }

// y += x (both f32, same shape).
void add_into(Tensor& y, const Tensor& x) {
  GALE_CHECK(y.dtype() == DType::kF32 && x.dtype() == DType::kF32 && y.shape() == x.shape())
      << "Gated DeltaNet LoRA: adding " << x.shape_string() << " into " << y.shape_string();
  float* yp = y.data<float>();
  const float* xp = x.data<float>();
  for (int64_t i = 0; i < y.numel(); ++i) yp[i] += xp[i];
}

// The mixer over sequences of rows (gdn_forward: one per sample, no states).
// Under context parallelism `seqs` cover the rows after the all-to-all (whole sequences).
Tensor forward(const GdnDims& d_tp, const GdnWeights& w_tp, const Tensor& u, const std::vector<GdnSequence>& seqs,
               DType gemm_dtype, GdnSaved* saved, const std::vector<int32_t>& starts_v) {
  Tensor u_saved;
  Tensor zx = column_parallel_linear_forward(w_tp.tp, u, w_tp.in_proj, &u_saved);  // [T, R] (gathered under SP)
  Tensor lora_in_u, lora_out_u;  // the adapters' x·Aᵀ, of in_proj's whole input (gathered under SP)
  if (w_tp.lora_in.a) {
    GALE_CHECK(!w_tp.tp.keeps_local_input()) << "LoRA on the Gated DeltaNet in_proj with --use-ascend-mc2";
    lora_in_u = lora_forward(u_saved, w_tp.lora_in, zx);
  }
  if (w_tp.cp.on()) zx = gdn_cp_seq_to_heads(w_tp.cp, d_tp, zx);  // [S_global·B, R_cp]
  const GdnCpWeights cpw(d_tp, w_tp);  // this cp rank's heads (d_tp, w_tp without CP)
  const GdnDims& d = cpw.dims();
  const GdnWeights& w = cpw.weights();
  const Offsets of(d);
  const int64_t CD = d.conv_dim(), NV = d.NV, NK = d.NK, DK = d.DK, DV = d.DV, VD = d.v_dim();
  const int64_t r = NV / NK;
  const float scale = 1.0f / std::sqrt(static_cast<float>(DK));
  const int64_t T = zx.size(0);
  std::vector<ConvSequence> conv_seqs;  // the convolution's view of the sequences
  for (const GdnSequence& q : seqs)
    conv_seqs.push_back(ConvSequence{q.first, q.stride, q.length, q.conv_state, q.conv_steps});
  check_conv_sequences(conv_seqs, T, "gated delta net");
  GALE_CHECK(starts_v.empty() || static_cast<int64_t>(starts_v.size()) == T)
      << "gated delta net: " << starts_v.size() << " document starts for " << T << " rows";
  const int32_t* starts = starts_v.empty() ? nullptr : starts_v.data();
  const float* zxp = zx.data<float>();
  Tensor conv_pre = Tensor::empty({T, CD});
  causal_conv1d_forward_sequences(zxp, of.R, w.conv_w, nullptr, conv_pre.data<float>(), CD, d.K, conv_seqs, starts);
  Prepared p = prepare(d, w, zxp, conv_pre.data<float>(), T);
  Tensor o = Tensor::empty({T, VD});
  {
    const float* x = p.qkv.data<float>();
    float* op = o.data<float>();
    parallel_for(static_cast<int64_t>(seqs.size()) * NV, 1, [&](int64_t b0, int64_t e0) {
      std::vector<float> st(static_cast<size_t>(DK * DV)), tmp(static_cast<size_t>(DV));
      std::vector<float> ga(static_cast<size_t>(DK)), ge(static_cast<size_t>(DK)), gw(static_cast<size_t>(DV));
      for (int64_t task = b0; task < e0; ++task) {
        const GdnSequence& q_seq = seqs[static_cast<size_t>(task / NV)];
        const int64_t h = task % NV, kh = h / r;
        if (q_seq.rec_state)
          std::copy_n(q_seq.rec_state + h * DK * DV, DK * DV, st.begin());
        else
          std::fill(st.begin(), st.end(), 0.0f);
        for (int64_t s = 0; s < q_seq.length; ++s) {
          const int64_t t = q_seq.first + s * q_seq.stride;
          const float* q = x + t * CD + kh * DK;
          const float* k = x + t * CD + d.qk_dim() + kh * DK;
          const float* v = x + t * CD + 2 * d.qk_dim() + h * DV;
          if (starts_document(starts, t, s)) std::fill(st.begin(), st.end(), 0.0f);  // a packed document's start
          gates_at(d, p, t, h, ga.data(), ge.data(), gw.data());
          delta_step(st.data(), k, v, ga.data(), ge.data(), gw.data(), tmp.data(), DK, DV);
          float* out = op + t * VD + h * DV;
          std::fill(out, out + DV, 0.0f);
          for (int64_t i = 0; i < DK; ++i)
            for (int64_t j = 0; j < DV; ++j) out[j] += q[i] * st[static_cast<size_t>(i * DV + j)];
          for (int64_t j = 0; j < DV; ++j) out[j] *= scale;
          if (q_seq.rec_steps) std::copy(st.begin(), st.end(), q_seq.rec_steps + (s * NV + h) * DK * DV);
        }
        if (q_seq.rec_state) std::copy(st.begin(), st.end(), q_seq.rec_state + h * DK * DV);
      }
    });
  }
  // The gated output norm, per (row, value head) over DV.
  Tensor normed = Tensor::empty({T, VD});
  Tensor rstd = Tensor::empty({T, NV});
  {
    const float* op = o.data<float>();
    float *np = normed.data<float>(), *rp = rstd.data<float>();
    parallel_for(T, 16, [&](int64_t b0, int64_t e0) {
      for (int64_t t = b0; t < e0; ++t)
        for (int64_t h = 0; h < NV; ++h) {
          const float* xv = op + t * VD + h * DV;
          double ss = 0.0;
          for (int64_t j = 0; j < DV; ++j) ss += static_cast<double>(xv[j]) * xv[j];
          const float rs = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(DV)) + d.norm_eps);
          rp[t * NV + h] = rs;
          for (int64_t j = 0; j < DV; ++j)
            np[t * VD + h * DV + j] = xv[j] * rs * w.out_norm[static_cast<size_t>(j)] * siluf(zxp[t * of.R + of.z + h * DV + j]);
        }
    });
  }
  if (w_tp.cp.on()) normed = mamba_cp_heads_to_seq(w_tp.cp, normed);  // [S_local·B, VD of this TP rank]
  Tensor normed_in = to_gemm_input(normed, gemm_dtype);
  Tensor out = row_parallel_linear_forward(w.tp, normed_in, w.out_proj);  // [T, H] (this rank's rows under SP)
  if (w_tp.lora_out.a) {
    if (tp_parallel(w.tp)) {  // this rank's columns give a partial sum, reduced as out_proj's
      Tensor partial = Tensor::zeros({normed_in.size(0), out.size(1)}, DType::kF32);
      lora_out_u = lora_forward(normed_in, w_tp.lora_out, partial);
      partial = w.tp.sequence_parallel ? reduce_scatter_to_sequence_parallel_region(partial, *w.tp.tp)
                                       : reduce_from_tp_region(partial, *w.tp.tp);
      add_into(out, partial);
    } else {
      lora_out_u = lora_forward(normed_in, w_tp.lora_out, out);
    }
  }
  if (saved) {
    saved->lora_in_u = lora_in_u;
    saved->lora_out_u = lora_out_u;
    saved->u = u_saved;
    saved->zx = zx;
    saved->conv_pre = conv_pre;
    saved->o = o;
    saved->rstd = rstd;
    saved->normed = normed_in;
    saved->starts = starts_v;
  }
  return out;
}

}  // namespace

Tensor gdn_forward(const GdnDims& d, const GdnWeights& w, const Tensor& u, int64_t S, int64_t B, DType gemm_dtype,
                   GdnSaved* saved, const std::vector<int32_t>& starts) {
  if (w.cp.on()) {
    GALE_CHECK_EQ(S, w.cp.split->local_length());
    S = w.cp.split->seq_length;  // the recurrence runs over whole sequences
  }
  std::vector<GdnSequence> seqs(static_cast<size_t>(B));  // S·B rows after in_proj's SP gather (and CP's all-to-all)
  for (int64_t b = 0; b < B; ++b) seqs[static_cast<size_t>(b)] = GdnSequence{b, B, S, nullptr, nullptr};
  return forward(d, w, u, seqs, gemm_dtype, saved, starts);
}

Tensor gdn_forward_sequences(const GdnDims& d, const GdnWeights& w, const Tensor& u,
                             const std::vector<GdnSequence>& seqs, DType gemm_dtype) {
  GALE_CHECK(!w.cp.on()) << "Gated DeltaNet decoding under context parallelism";
  return forward(d, w, u, seqs, gemm_dtype, nullptr, {});
}

Tensor gdn_backward(const GdnDims& d_tp, const GdnWeights& w_tp, GdnSaved& sv, const Tensor& d_out, int64_t S,
                    int64_t B) {
  Tensor d_normed = row_parallel_linear_backward(w_tp.tp, d_out, sv.normed, w_tp.out_proj);  // [T, VD]
  if (w_tp.lora_out.a) {  // dy of every row (gathered under SP), as out_proj's backward takes it
    const Tensor dy = tp_parallel(w_tp.tp) && w_tp.tp.sequence_parallel
                          ? gather_from_sequence_parallel_region(d_out, *w_tp.tp.tp)
                          : d_out;
    lora_backward(dy, sv.normed, sv.lora_out_u, w_tp.lora_out, d_normed);
  }
  sv.normed = sv.lora_out_u = Tensor();
  if (w_tp.cp.on()) {
    d_normed = mamba_cp_heads_to_seq_backward(w_tp.cp, d_normed);  // [S_global·B, VD_cp]
    S = w_tp.cp.split->seq_length;
  }
  const GdnCpWeights cpw(d_tp, w_tp);
  const GdnDims& d = cpw.dims();
  const GdnWeights& w = cpw.weights();
  const Offsets of(d);
  const int64_t T = S * B, CD = d.conv_dim(), NV = d.NV, NK = d.NK, DK = d.DK, DV = d.DV, VD = d.v_dim();
  const int64_t r = NV / NK, QK = d.qk_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(DK));
  const std::vector<int32_t> starts_v = std::move(sv.starts);
  GALE_CHECK(starts_v.empty() || static_cast<int64_t>(starts_v.size()) == T)
      << "gated delta net backward: " << starts_v.size() << " document starts for " << T << " rows";
  const int32_t* starts = starts_v.empty() ? nullptr : starts_v.data();
  const float* zxp = sv.zx.data<float>();
  Tensor d_zx = Tensor::zeros({T, of.R});
  float* dzx = d_zx.data<float>();
  // Gated norm: y = x·rs·w ⊙ silu(z), rs = (mean x² + eps)^−½.
  Tensor d_o = Tensor::empty({T, VD});
  {
    const float *op = sv.o.data<float>(), *rp = sv.rstd.data<float>(), *dn = d_normed.data<float>();
    float* dop = d_o.data<float>();
    if (w.g_out_norm)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < NV; ++h)
          for (int64_t j = 0; j < DV; ++j)
            w.g_out_norm[j] += dn[t * VD + h * DV + j] * siluf(zxp[t * of.R + of.z + h * DV + j]) *
                               op[t * VD + h * DV + j] * rp[t * NV + h];
    parallel_for(T, 16, [&](int64_t b0, int64_t e0) {
      for (int64_t t = b0; t < e0; ++t)
        for (int64_t h = 0; h < NV; ++h) {
          const float rs = rp[t * NV + h];
          const float* xv = op + t * VD + h * DV;
          double m = 0.0;
          for (int64_t j = 0; j < DV; ++j) {
            const float z = zxp[t * of.R + of.z + h * DV + j];
            const float dnj = dn[t * VD + h * DV + j] * siluf(z) * w.out_norm[static_cast<size_t>(j)];
            m += static_cast<double>(dnj) * xv[j];
          }
          const float mean = static_cast<float>(m / static_cast<double>(DV));
          for (int64_t j = 0; j < DV; ++j) {
            const float z = zxp[t * of.R + of.z + h * DV + j];
            const float dy = dn[t * VD + h * DV + j];
            const float n = xv[j] * rs * w.out_norm[static_cast<size_t>(j)];
            dzx[t * of.R + of.z + h * DV + j] = dy * n * dsiluf(z);
            dop[t * VD + h * DV + j] = rs * dy * siluf(z) * w.out_norm[static_cast<size_t>(j)] - xv[j] * rs * rs * rs * mean;
          }
        }
    });
  }
  d_normed = Tensor();
  sv.o = sv.rstd = Tensor();
  // The recurrence's adjoint, one (sample, value head) at a time; q and k gradients per value head
  // (summed into their key head below), and per (row, value head) the gradients of the channel-wise
  // gates it read: the log-decay g and erase gate e per key channel, the write gate ω per value channel.
  Prepared p = prepare(d, w, zxp, sv.conv_pre.data<float>(), T);
  const float* x = p.qkv.data<float>();
  Tensor dq_v = Tensor::zeros({T, NV * DK}), dk_v = Tensor::zeros({T, NV * DK});
  Tensor d_qkv = Tensor::zeros({T, CD});  // d silu output (v part filled here, q and k below)
  Tensor dg = Tensor::empty({T, NV * DK}), de = Tensor::empty({T, NV * DK}), dwg = Tensor::empty({T, VD});
  {
    float *dqv = dq_v.data<float>(), *dkv = dk_v.data<float>(), *dx = d_qkv.data<float>();
    float *dgp = dg.data<float>(), *dep = de.data<float>(), *dwp = dwg.data<float>();
    const float* dop = d_o.data<float>();
    const int64_t chunks = (S + kChunk - 1) / kChunk, SZ = DK * DV;
    parallel_for(B * NV, 1, [&](int64_t b0, int64_t e0) {
      std::vector<float> ckpt(static_cast<size_t>(chunks * SZ)), states(static_cast<size_t>((kChunk + 1) * SZ));
      std::vector<float> ds(static_cast<size_t>(SZ)), pm(static_cast<size_t>(SZ)), tmp(static_cast<size_t>(DV));
      std::vector<float> kvv(static_cast<size_t>(DV)), uu(static_cast<size_t>(DV)), du(static_cast<size_t>(DV));
      const std::vector<float> zero(static_cast<size_t>(SZ), 0.0f);  // the state before a packed document
      std::vector<float> ga(static_cast<size_t>(DK)), ge(static_cast<size_t>(DK)), gw(static_cast<size_t>(DV));
      for (int64_t task = b0; task < e0; ++task) {
        const int64_t b = task / NV, h = task % NV, kh = h / r;
        auto q_at = [&](int64_t t) { return x + t * CD + kh * DK; };
        auto k_at = [&](int64_t t) { return x + t * CD + QK + kh * DK; };
        auto v_at = [&](int64_t t) { return x + t * CD + 2 * QK + h * DV; };
        auto step = [&](float* st, int64_t t) {
          gates_at(d, p, t, h, ga.data(), ge.data(), gw.data());
          delta_step(st, k_at(t), v_at(t), ga.data(), ge.data(), gw.data(), tmp.data(), DK, DV);
        };
        // forward again, keeping the state at each chunk's start
        std::vector<float> st(static_cast<size_t>(SZ), 0.0f);
        for (int64_t s = 0; s < S; ++s) {
          const int64_t t = s * B + b;
          if (starts_document(starts, t, s)) std::fill(st.begin(), st.end(), 0.0f);
          if (s % kChunk == 0) std::copy(st.begin(), st.end(), ckpt.begin() + (s / kChunk) * SZ);
          step(st.data(), t);
        }
        std::fill(ds.begin(), ds.end(), 0.0f);
        for (int64_t c = chunks - 1; c >= 0; --c) {
          const int64_t s0 = c * kChunk, len = std::min(kChunk, S - s0);
          std::copy(ckpt.begin() + c * SZ, ckpt.begin() + (c + 1) * SZ, states.begin());
          for (int64_t i = 0; i < len; ++i) {
            const int64_t t = (s0 + i) * B + b;
            if (starts_document(starts, t, s0 + i))  // the step reads the zero state (none before the document)
              std::fill(states.begin() + (i + 1) * SZ, states.begin() + (i + 2) * SZ, 0.0f);
            else
              std::copy(states.begin() + i * SZ, states.begin() + (i + 1) * SZ, states.begin() + (i + 1) * SZ);
            step(states.data() + (i + 1) * SZ, t);
          }
          for (int64_t i = len - 1; i >= 0; --i) {
            const int64_t t = (s0 + i) * B + b;
            const bool reset = starts_document(starts, t, s0 + i);  // the step read the zero state
            const float* prev = reset ? zero.data() : states.data() + i * SZ;
            const float* cur = states.data() + (i + 1) * SZ;
            const float *q = q_at(t), *k = k_at(t), *v = v_at(t), *dov = dop + t * VD + h * DV;
            gates_at(d, p, t, h, ga.data(), ge.data(), gw.data());
            float* dq = dqv + t * NV * DK + h * DK;
            float* dk = dkv + t * NV * DK + h * DK;
            // o = curᵀ (q·scale)
            for (int64_t ii = 0; ii < DK; ++ii) {
              double acc = 0.0;
              for (int64_t j = 0; j < DV; ++j) {
                ds[static_cast<size_t>(ii * DV + j)] += scale * q[ii] * dov[j];
                acc += static_cast<double>(cur[ii * DV + j]) * dov[j];
              }
              dq[ii] += scale * static_cast<float>(acc);
            }
            // P = Diag(a)·prev, kv = Pᵀ(e ⊙ k), u = ω ⊙ v − kv, cur = P + k ⊗ u
            for (int64_t ii = 0; ii < DK; ++ii)
              for (int64_t j = 0; j < DV; ++j)
                pm[static_cast<size_t>(ii * DV + j)] = ga[static_cast<size_t>(ii)] * prev[ii * DV + j];
            std::fill(kvv.begin(), kvv.end(), 0.0f);
            for (int64_t ii = 0; ii < DK; ++ii) {
              const float ek = ge[static_cast<size_t>(ii)] * k[ii];
              for (int64_t j = 0; j < DV; ++j) kvv[static_cast<size_t>(j)] += ek * pm[static_cast<size_t>(ii * DV + j)];
            }
            for (int64_t j = 0; j < DV; ++j)
              uu[static_cast<size_t>(j)] = gw[static_cast<size_t>(j)] * v[j] - kvv[static_cast<size_t>(j)];
            std::fill(du.begin(), du.end(), 0.0f);
            for (int64_t ii = 0; ii < DK; ++ii) {
              double acc = 0.0;
              for (int64_t j = 0; j < DV; ++j) {
                const float dsv = ds[static_cast<size_t>(ii * DV + j)];
                acc += static_cast<double>(dsv) * uu[static_cast<size_t>(j)];
                du[static_cast<size_t>(j)] += dsv * k[ii];
              }
              dk[ii] += static_cast<float>(acc);
            }
            for (int64_t j = 0; j < DV; ++j) {
              dwp[t * VD + h * DV + j] = du[static_cast<size_t>(j)] * v[j];
              dx[t * CD + 2 * QK + h * DV + j] = gw[static_cast<size_t>(j)] * du[static_cast<size_t>(j)];
              du[static_cast<size_t>(j)] = -du[static_cast<size_t>(j)];  // now d kv
            }
            for (int64_t ii = 0; ii < DK; ++ii) {
              const float ek = ge[static_cast<size_t>(ii)] * k[ii], a = ga[static_cast<size_t>(ii)];
              double dek = 0.0, da = 0.0;
              for (int64_t j = 0; j < DV; ++j) {
                const size_t n = static_cast<size_t>(ii * DV + j);
                dek += static_cast<double>(pm[n]) * du[static_cast<size_t>(j)];
                const float dp = ds[n] + ek * du[static_cast<size_t>(j)];
                da += static_cast<double>(dp) * prev[n];
                ds[n] = reset ? 0.0f : a * dp;  // a document's start: nothing flows to the position before
              }
              dep[t * NV * DK + h * DK + ii] = static_cast<float>(dek) * k[ii];
              dk[ii] += static_cast<float>(dek) * ge[static_cast<size_t>(ii)];
              dgp[t * NV * DK + h * DK + ii] = static_cast<float>(da) * a;
            }
          }
        }
      }
    });
  }
  d_o = Tensor();
  gate_backward(d, w, of, p, zxp, dg, de, dwg, dzx);
  // Key heads: sum their value heads' q and k gradients, then the l2norm's backward
  // dx = r·(dy − y·(y·dy)) with y the normalised vector.
  {
    const float *dqv = dq_v.data<float>(), *dkv = dk_v.data<float>(), *rq = p.rq.data<float>(), *rk = p.rk.data<float>();
    float* dx = d_qkv.data<float>();
    parallel_for(T, 16, [&](int64_t b0, int64_t e0) {
      std::vector<float> dy(static_cast<size_t>(DK));
      for (int64_t t = b0; t < e0; ++t)
        for (int64_t part = 0; part < 2; ++part)
          for (int64_t kh = 0; kh < NK; ++kh) {
            const float* src = part == 0 ? dqv : dkv;
            std::fill(dy.begin(), dy.end(), 0.0f);
            for (int64_t h = kh * r; h < (kh + 1) * r; ++h)
              for (int64_t i = 0; i < DK; ++i) dy[static_cast<size_t>(i)] += src[t * NV * DK + h * DK + i];
            const float* y = x + t * CD + part * QK + kh * DK;
            double dot = 0.0;
            for (int64_t i = 0; i < DK; ++i) dot += static_cast<double>(y[i]) * dy[static_cast<size_t>(i)];
            const float rr = (part == 0 ? rq : rk)[t * NK + kh];
            for (int64_t i = 0; i < DK; ++i)
              dx[t * CD + part * QK + kh * DK + i] = rr * (dy[static_cast<size_t>(i)] - y[i] * static_cast<float>(dot));
          }
    });
  }
  // SiLU, then the convolution (into in_proj's q | k | v columns).
  {
    float* dx = d_qkv.data<float>();
    const float* cp = sv.conv_pre.data<float>();
    for (int64_t i = 0; i < T * CD; ++i) dx[i] *= dsiluf(cp[i]);
    causal_conv1d_backward(dx, zxp, of.R, w.conv_w, dzx, of.R, w.g_conv_w, nullptr, CD, d.K, S, B, starts);
  }
  sv.conv_pre = Tensor();
  cpw.add_grads();
  if (w_tp.cp.on()) d_zx = gdn_cp_seq_to_heads_backward(w_tp.cp, d_tp, d_zx);  // [S_local·B, R]
  Tensor du = column_parallel_linear_backward(w_tp.tp, d_zx, sv.u, w_tp.in_proj);
  if (w_tp.lora_in.a) {
    if (tp_parallel(w_tp.tp)) {  // this rank's rows of B give a partial input gradient, reduced as in_proj's
      Tensor partial = Tensor::zeros(sv.u.shape(), DType::kF32);
      lora_backward(d_zx, sv.u, sv.lora_in_u, w_tp.lora_in, partial);
      partial = w_tp.tp.sequence_parallel ? reduce_scatter_to_sequence_parallel_region(partial, *w_tp.tp.tp)
                                          : reduce_from_tp_region(partial, *w_tp.tp.tp);
      add_into(du, partial);
    } else {
      lora_backward(d_zx, sv.u, sv.lora_in_u, w_tp.lora_in, du);
    }
  }
  sv.u = sv.zx = sv.lora_in_u = Tensor();
  return du;
}

}  // namespace gale
