// MoE shared expert forward/backward: TP MLP (SP all-gather, column fc1, row fc2, reduce-scatter) and its gate.
#include "model/moe_shared_expert.h"

#include <cmath>

#include "core/status.h"
#include "kernels/cpu/activation.h"
#include "model/linear.h"
#include "model/lora.h"
#include "model/lora_expert.h"
#include "model/mlp_activation.h"
#include "model/param_builders.h"
#include "parallel/mappings.h"

namespace gale {

namespace {

std::string shared_name(int64_t layer, const char* rest) {
  return str_cat("decoder.layers.", layer, ".mlp.shared_experts.", rest);
}

LinearWeight weight(const OpTable& ops, const ParamBuffer& pb, int id) {
  return linear_weight(pb, id, ops.gemm, ops.bf16_gemm);
}

// The LoRA adapter of the shared expert's linear `id` (registered beside it); a null when not adapted.
LoraWeights adapter(const ModelConfig& c, const OpTable& ops, const ParamBuffer& pb, int id) {
  if (!c.lora.enabled()) return LoraWeights{};
  const LoraIds ids{pb.find(lora_a_name(pb.spec(id).name)), pb.find(lora_b_name(pb.spec(id).name))};
  return ids.defined() ? lora_weights(pb, ids, c.lora.scaling(), ops.gemm) : LoraWeights{};
}

}  // namespace

std::vector<int> SharedExpertIds::all() const {
  std::vector<int> ids;
  for (int id : {fc1_w, fc2_w, gate_w})
    if (id >= 0) ids.push_back(id);
  return ids;
}

SharedExpertIds register_shared_expert_params(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part,
                                              int64_t layer) {
  SharedExpertIds w;
  const int64_t Fs = c.moe.shared_ffn, H = c.hidden;
  if (Fs <= 0) return w;
  GALE_CHECK(!c.add_bias_linear) << "the MoE shared expert has no biases (--disable-bias-linear)";
  GALE_CHECK(part.tp_size() == 1 || part.sequence_parallel) << "the MoE shared expert under TP needs sequence parallelism";
  GALE_CHECK_EQ(Fs % part.tp_size(), 0) << "--moe-shared-expert-intermediate-size over TP";
  const float out_std = c.init_std / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  const int blocks = c.gated() ? 2 : 1;  // SwiGLU fc1 [gate; up]: each half split
  w.fc1_w = pb.add(tp_split(make_param_spec(shared_name(layer, "linear_fc1.weight"), {c.gated() ? 2 * Fs : Fs, H},
                                            InitKind::kNormal, c.init_std, true),
                            part, 0, blocks));
  // LoRA (peft matches the module names' last part, so linear_fc1 / linear_fc2 also name the shared
  // experts'): split over TP as the dense MLP's adapters (model/lora.h).
  if (lora_targets(c.lora, LoraTarget::kFc1))
    register_lora_params(pb, c.lora, part, shared_name(layer, "linear_fc1.weight"), c.gated() ? 2 * Fs : Fs, H,
                         LoraSplit::kColumn, blocks);
  w.fc2_w = pb.add(tp_split(
      make_param_spec(shared_name(layer, "linear_fc2.weight"), {H, Fs}, InitKind::kNormal, out_std, true), part, 1));
  if (lora_targets(c.lora, LoraTarget::kFc2))
    register_lora_params(pb, c.lora, part, shared_name(layer, "linear_fc2.weight"), H, Fs, LoraSplit::kRow);
  if (c.moe.shared_gate) {
    ParamSpec g = make_param_spec(shared_name(layer, "gate_weight"), {1, H}, InitKind::kNormal, c.init_std, true);
    g.sequence_parallel = part.tp_size() > 1;  // each TP rank gates its own tokens
    w.gate_w = pb.add(g);
  }
  return w;
}

Tensor shared_expert_forward(const ModelConfig& c, const OpTable& ops, const ParamBuffer& pb,
                             const SharedExpertIds& w, const ModelPartition& part, const Tensor& x,
                             SharedExpertSaved* saved) {
  const int64_t Tl = x.size(0), H = c.hidden, Fl = c.moe.shared_ffn / part.tp_size();
  Communicator& tp = *part.tp;
  const Tensor x_full = gather_from_sequence_parallel_region(x, tp);  // [T, H]
  const int64_t T = x_full.size(0);
  Tensor u = linear_forward(x_full, weight(ops, pb, w.fc1_w));  // [T, Fl or 2Fl]
  const LoraWeights lora1 = adapter(c, ops, pb, w.fc1_w), lora2 = adapter(c, ops, pb, w.fc2_w);
  if (lora1.a) lora_forward(x_full, lora1, u);
  Tensor act = Tensor::empty({T, Fl});
  mlp_activation_forward(c, ops)(u.data<float>(), nullptr, act.data<float>(), T, Fl);
  act = to_gemm_input(act, c.gemm_dtype());
  Tensor y = linear_forward(act, weight(ops, pb, w.fc2_w));  // [T, H], partial over TP
  if (lora2.a) lora_forward(act, lora2, y);
  Tensor m = reduce_scatter_to_sequence_parallel_region(y, tp);  // [Tl, H]
  y = Tensor();
  Tensor out = m, gate;
  if (w.gate_w >= 0) {
    const Tensor xf = to_f32(x);
    const float* gw = pb.param_data(w.gate_w);
    gate = Tensor::empty({Tl});
    out = Tensor::empty({Tl, H});
    for (int64_t t = 0; t < Tl; ++t) {
      const float* xt = xf.data<float>() + t * H;
      double logit = 0.0;
      for (int64_t h = 0; h < H; ++h) logit += static_cast<double>(xt[h]) * gw[h];
      const float g = static_cast<float>(1.0 / (1.0 + std::exp(-logit)));
      gate.data<float>()[t] = g;
      const float* mt = m.data<float>() + t * H;
      float* ot = out.data<float>() + t * H;
      for (int64_t h = 0; h < H; ++h) ot[h] = g * mt[h];
    }
  }
  if (saved) {
    saved->x = x;
    saved->x_full = x_full;
    saved->fc1_out = u;
    saved->act = act;
    if (w.gate_w >= 0) {
      saved->m = m;
      saved->gate = gate;
    }
  }
  return out;
}

Tensor shared_expert_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const SharedExpertIds& w,
                              const ModelPartition& part, SharedExpertSaved& s, const Tensor& d_out,
                              WeightGradStore* defer_weight_grads) {
  const int64_t Tl = d_out.size(0), H = c.hidden, Fl = c.moe.shared_ffn / part.tp_size();
  Communicator& tp = *part.tp;
  Tensor dm = d_out;
  Tensor dx_gate;  // the gate's input gradient [Tl, H]
  if (w.gate_w >= 0) {
    // out = g ⊙ m, g = sigmoid(l), l = x·wᵀ: dm = g·d_out, dl = (d_out·m)·g(1-g), dw += Σ_t dl_t x_t,
    // dx = dl·w.
    const Tensor xf = to_f32(s.x);
    const float* gw = pb.param_data(w.gate_w);
    float* dgw = pb.grad_data(w.gate_w);
    dm = Tensor::empty({Tl, H});
    dx_gate = Tensor::empty({Tl, H});
    std::vector<double> dw(static_cast<size_t>(H), 0.0);
    for (int64_t t = 0; t < Tl; ++t) {
      const float g = s.gate.data<float>()[t];
      const float* dot_ = d_out.data<float>() + t * H;
      const float* mt = s.m.data<float>() + t * H;
      double dg = 0.0;
      for (int64_t h = 0; h < H; ++h) {
        dg += static_cast<double>(dot_[h]) * mt[h];
        dm.data<float>()[t * H + h] = g * dot_[h];
      }
      const double dl = dg * g * (1.0 - g);
      const float* xt = xf.data<float>() + t * H;
      float* dxt = dx_gate.data<float>() + t * H;
      for (int64_t h = 0; h < H; ++h) {
        dw[h] += dl * xt[h];
        dxt[h] = static_cast<float>(dl * gw[h]);
      }
    }
    if (dgw)
      for (int64_t h = 0; h < H; ++h) dgw[h] += static_cast<float>(dw[h]);
  }
  const Tensor dm_full = reduce_scatter_to_sequence_parallel_region_backward(dm, tp);  // [T, H]
  dm = Tensor();
  const int64_t T = dm_full.size(0);
  LinearWeight fc2 = weight(ops, pb, w.fc2_w), fc1 = weight(ops, pb, w.fc1_w);
  fc2.defer = fc1.defer = defer_weight_grads;
  Tensor d_act = linear_backward(dm_full, s.act, fc2);  // [T, Fl]
  // The adapters' backward (model/lora_expert.h: u = x·Aᵀ recomputed, so forward keeps nothing more).
  const LoraWeights lora1 = adapter(c, ops, pb, w.fc1_w), lora2 = adapter(c, ops, pb, w.fc2_w);
  if (lora2.a) {
    lora_backward_input(dm_full, lora2, d_act);
    lora_backward_weights(dm_full, s.act, lora2);
  }
  s.act = Tensor();
  Tensor du = Tensor::empty(s.fc1_out.shape());
  mlp_activation_backward(c, ops)(d_act.data<float>(), s.fc1_out.data<float>(), du.data<float>(), nullptr, T, Fl);
  d_act = Tensor();
  s.fc1_out = Tensor();
  Tensor dx_full = linear_backward(du, s.x_full, fc1);  // [T, H], partial over TP
  if (lora1.a) {
    lora_backward_input(du, lora1, dx_full);
    lora_backward_weights(du, s.x_full, lora1);
  }
  Tensor dx = gather_from_sequence_parallel_region_backward(dx_full, tp);
  dx_full = Tensor();
  if (dx_gate.defined()) add_inplace(dx.data<float>(), dx_gate.data<float>(), Tl * H);
  s = SharedExpertSaved{};
  return dx;
}

}  // namespace gale
