// MoE MLP forward/backward: router, top-k, permutation, expert GEMMs, weighted un-permutation, aux losses.
#include "model/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/threads.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/norm.h"
#include "model/linear.h"
#include "model/param_builders.h"

namespace gale {

namespace {

std::string expert_name(int64_t layer, int64_t expert, const char* rest) {
  return str_cat("decoder.layers.", layer, ".mlp.experts.local_experts.", expert, ".", rest);
}

LinearWeight weight(const OpTable& ops, const ParamBuffer& pb, int id) { return linear_weight(pb, id, ops.gemm); }

// Calls fn(e) for every expert. The experts run concurrently, one per thread (dynamic schedule:
// they get different token counts), and each expert's GEMMs and kernels then run on its one thread
// (OpenMP does not nest; oneDNN runs sequentially inside a parallel region). Splitting every small
// per-expert GEMM over all threads instead left the threads waiting at the end of each region:
// 2 threads ran 2-4x slower than 1 (docs/model.md). fn must only write what belongs to expert e.
template <class Fn>
void for_each_expert(int64_t E, Fn&& fn) {
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), E));
  if (threads <= 1) {
    for (int64_t e = 0; e < E; ++e) fn(e);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t e = 0; e < E; ++e) fn(e);
}

// The router in f32 (no bf16 copy is used even under --bf16).
LinearWeight router_weight(const OpTable& ops, const ParamBuffer& pb, int id) {
  LinearWeight w = weight(ops, pb, id);
  w.w_bf16 = nullptr;
  return w;
}

// Rows `rows` of x [T, H] (f32 or bf16) into a new [rows.size(), H] tensor of the same type.
Tensor gather_rows(const Tensor& x, const int64_t* rows, int64_t n, int64_t k) {
  const int64_t H = x.size(1);
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(x.dtype());
  Tensor out = Tensor::empty({n, H}, x.dtype());
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t r = 0; r < n; ++r) std::memcpy(dst + r * row_bytes, src + rows[r] / k * row_bytes, row_bytes);
  return out;
}

}  // namespace

std::vector<int> MoeParamIds::all() const {
  std::vector<int> ids;
  if (router_w >= 0) ids.push_back(router_w);
  for (size_t e = 0; e < fc1_w.size(); ++e)
    for (int id : {fc1_w[e], fc1_b[e], fc2_w[e], fc2_b[e]})
      if (id >= 0) ids.push_back(id);
  return ids;
}

MoeParamIds register_moe_params(ParamBuffer& pb, const ModelConfig& c, int64_t layer, int64_t ep_size,
                                int64_t ep_rank) {
  MoeParamIds w;
  GALE_CHECK(ep_size >= 1 && c.moe.num_experts % ep_size == 0 && ep_rank >= 0 && ep_rank < ep_size)
      << c.moe.num_experts << " experts over expert-parallel rank " << ep_rank << " of " << ep_size;
  const int64_t El = c.moe.num_experts / ep_size, H = c.hidden, Fe = c.moe.ffn;
  // A local expert's spec: its local name, and under EP the global expert's name.
  auto expert_spec = [&](int64_t j, const char* rest, Shape shape, InitKind init, float std, bool decay) {
    ParamSpec s = make_param_spec(expert_name(layer, j, rest), std::move(shape), init, std, decay);
    if (ep_size > 1) {
      s.expert_parallel = true;
      s.global_name = expert_name(layer, ep_rank * El + j, rest);
    }
    return s;
  };
  const float out_std = c.init_std / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  w.router_w = pb.add(make_param_spec(str_cat("decoder.layers.", layer, ".mlp.router.weight"), {c.moe.num_experts, H},
                                      InitKind::kNormal, c.init_std, true));
  for (int64_t e = 0; e < El; ++e) {
    const int64_t fc1_rows = c.swiglu ? 2 * Fe : Fe;
    w.fc1_w.push_back(pb.add(expert_spec(e, "linear_fc1.weight", {fc1_rows, H}, InitKind::kNormal, c.init_std, true)));
    w.fc1_b.push_back(c.add_bias_linear ? pb.add(expert_spec(e, "linear_fc1.bias", {fc1_rows}, InitKind::kZeros, 0, false))
                                        : -1);
    w.fc2_w.push_back(pb.add(expert_spec(e, "linear_fc2.weight", {H, Fe}, InitKind::kNormal, out_std, true)));
    w.fc2_b.push_back(c.add_bias_linear ? pb.add(expert_spec(e, "linear_fc2.bias", {H}, InitKind::kZeros, 0, false))
                                        : -1);
  }
  return w;
}

Tensor moe_forward(const ModelConfig& c, const OpTable& ops, const ParamBuffer& pb, const MoeParamIds& w,
                   const Tensor& x, MoeSaved* saved, MoeAuxLosses* losses, const Comm& ep) {
  const int64_t T = x.size(0), H = c.hidden, E = c.moe.num_experts, k = c.moe.topk, Fe = c.moe.ffn;
  GALE_CHECK(k >= 1 && k <= E) << "moe top-k " << k << " of " << E << " experts";
  // ---- router ----
  const Tensor logits = linear_forward(to_f32(x), router_weight(ops, pb, w.router_w));  // [T, E]
  Tensor scores = Tensor::empty({T, E}), lse = Tensor::empty({T}), probs = Tensor::empty({T, k});
  std::vector<int32_t> experts(static_cast<size_t>(T * k));
  std::vector<int64_t> counts(static_cast<size_t>(E), 0);
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.data<float>() + t * E;
    float* s = scores.data<float>() + t * E;
    const float mx = *std::max_element(l, l + E);
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e] - mx));
    for (int64_t e = 0; e < E; ++e) s[e] = static_cast<float>(std::exp(static_cast<double>(l[e] - mx)) / sum);
    lse.data<float>()[t] = mx + static_cast<float>(std::log(sum));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
    double selected = 0.0;
    for (int64_t j = 0; j < k; ++j) selected += s[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[j];
      experts[t * k + j] = e;
      ++counts[e];
      probs.data<float>()[t * k + j] = c.moe.pre_softmax ? s[e] : static_cast<float>(s[e] / selected);
    }
  }
  // ---- permutation: each expert's rows in token order ----
  std::vector<int64_t> offsets(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  std::vector<int64_t> permuted(static_cast<size_t>(T * k));
  {
    std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) permuted[next[experts[t * k + j]]++] = t * k + j;
  }
  // ---- dispatch to the experts' ranks (expert parallelism), local experts ----
  MoeDispatchPlan plan = make_dispatch_plan(ep, counts);
  const int64_t El = plan.local_experts;
  GALE_CHECK_EQ(static_cast<int64_t>(w.fc1_w.size()), El) << "local experts";
  Tensor expert_in = dispatch_rows(ep, plan, gather_rows(x, permuted.data(), T * k, k));  // [N, H] local expert-major
  const std::vector<int64_t>& local = plan.expert_offsets;
  Tensor local_out = Tensor::empty({plan.num_received(), H});
  std::vector<Tensor> fc1_outs(static_cast<size_t>(El)), acts(static_cast<size_t>(El));
  for_each_expert(El, [&](int64_t e) {
    const int64_t n = local[e + 1] - local[e];
    if (n == 0) return;
    const Tensor xe = expert_in.slice(local[e], n);
    Tensor u = linear_forward(xe, weight(ops, pb, w.fc1_w[e]));  // [n, Fe or 2Fe]
    Tensor act = Tensor::empty({n, Fe});
    const float* b1 = w.fc1_b[e] >= 0 ? pb.param_data(w.fc1_b[e]) : nullptr;
    if (c.swiglu)
      ops.swiglu_forward(u.data<float>(), b1, act.data<float>(), n, Fe);
    else
      ops.gelu_forward(u.data<float>(), b1, act.data<float>(), n, Fe);
    act = to_gemm_input(act, c.bf16);
    Tensor ye = linear_forward(act, weight(ops, pb, w.fc2_w[e]));  // [n, H]
    if (w.fc2_b[e] >= 0) add_bias_ref(ye.data<float>(), pb.param_data(w.fc2_b[e]), n, H);
    std::memcpy(local_out.data<float>() + local[e] * H, ye.data<float>(), static_cast<size_t>(n * H) * sizeof(float));
    fc1_outs[e] = u;
    acts[e] = act;
  });
  // ---- back to this rank's permuted rows ----
  Tensor expert_out = combine_rows(ep, plan, local_out);  // [T·k, H]
  local_out = Tensor();
  // ---- weighted un-permutation ----
  Tensor y = Tensor::zeros({T, H});
  for (int64_t r = 0; r < T * k; ++r) {
    const int64_t t = permuted[r] / k;
    const float q = probs.data<float>()[permuted[r]];
    const float* src = expert_out.data<float>() + r * H;
    float* dst = y.data<float>() + t * H;
    for (int64_t h = 0; h < H; ++h) dst[h] += q * src[h];
  }
  if (saved) {
    if (losses) {
      *losses = MoeAuxLosses{};
      if (c.moe.aux_loss_coeff > 0.0) {
        double sum = 0.0;
        for (int64_t e = 0; e < E; ++e) {
          double p = 0.0;
          for (int64_t t = 0; t < T; ++t) p += scores.data<float>()[t * E + e];
          sum += p * static_cast<double>(counts[e]);
        }
        losses->load_balancing = sum * static_cast<double>(E) / (static_cast<double>(T) * T * k);
      }
      if (c.moe.z_loss_coeff > 0.0) {
        double z = 0.0;
        for (int64_t t = 0; t < T; ++t) z += static_cast<double>(lse.data<float>()[t]) * lse.data<float>()[t];
        losses->z = z / static_cast<double>(T);
      }
    }
    saved->x = x;
    saved->scores = scores;
    saved->logsumexp = lse;
    saved->probs = probs;
    saved->experts = std::move(experts);
    saved->offsets = std::move(offsets);
    saved->permuted_slot = std::move(permuted);
    saved->plan = std::move(plan);
    saved->expert_in = expert_in;
    saved->fc1_out = std::move(fc1_outs);
    saved->act = std::move(acts);
    saved->expert_out = expert_out;
  }
  return y;
}

Tensor moe_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const MoeParamIds& w, MoeSaved& s,
                    const Tensor& dy, double aux_scale, const Comm& ep) {
  const int64_t T = dy.size(0), H = c.hidden, E = c.moe.num_experts, k = c.moe.topk, Fe = c.moe.ffn;
  const float* g = dy.data<float>();
  // ---- un-permutation: d(routing weight) and each permuted row's output gradient ----
  Tensor dprobs = Tensor::empty({T, k});
  Tensor d_expert_out = Tensor::empty({T * k, H});
  for (int64_t r = 0; r < T * k; ++r) {
    const int64_t slot = s.permuted_slot[r], t = slot / k;
    const float q = s.probs.data<float>()[slot];
    const float* out = s.expert_out.data<float>() + r * H;
    float* d = d_expert_out.data<float>() + r * H;
    double dot = 0.0;
    for (int64_t h = 0; h < H; ++h) {
      dot += static_cast<double>(g[t * H + h]) * out[h];
      d[h] = q * g[t * H + h];
    }
    dprobs.data<float>()[slot] = static_cast<float>(dot);
  }
  s.expert_out = Tensor();
  // ---- to the experts' ranks, local experts, back to the token rows ----
  const Tensor d_local_out = dispatch_rows(ep, s.plan, d_expert_out);  // [N, H] local expert-major
  const std::vector<int64_t>& local = s.plan.expert_offsets;
  Tensor d_expert_in = Tensor::empty({s.plan.num_received(), H});
  for_each_expert(s.plan.local_experts, [&](int64_t e) {
    const int64_t first = local[e], n = local[e + 1] - first;
    if (n == 0) return;
    const Tensor d_ye = Tensor::from_blob(d_local_out.data<float>() + first * H, {n, H}, DType::kF32);
    if (w.fc2_b[e] >= 0) column_sum_accumulate(d_ye.data<float>(), pb.grad_data(w.fc2_b[e]), n, H);
    Tensor d_act = linear_backward(d_ye, s.act[e], weight(ops, pb, w.fc2_w[e]));  // [n, Fe]
    s.act[e] = Tensor();
    Tensor du = Tensor::empty(s.fc1_out[e].shape());
    float* db1 = w.fc1_b[e] >= 0 ? pb.grad_data(w.fc1_b[e]) : nullptr;
    if (c.swiglu)
      ops.swiglu_backward(d_act.data<float>(), s.fc1_out[e].data<float>(), du.data<float>(), db1, n, Fe);
    else
      ops.gelu_backward(d_act.data<float>(), s.fc1_out[e].data<float>(), du.data<float>(), db1, n, Fe);
    s.fc1_out[e] = Tensor();
    const Tensor dxe = linear_backward(du, s.expert_in.slice(first, n), weight(ops, pb, w.fc1_w[e]));  // [n, H]
    std::memcpy(d_expert_in.data<float>() + first * H, dxe.data<float>(), static_cast<size_t>(n * H) * sizeof(float));
  });
  s.expert_in = Tensor();
  const Tensor d_rows = combine_rows(ep, s.plan, d_expert_in);  // [T·k, H] this rank's permuted rows
  d_expert_in = Tensor();
  Tensor dx = Tensor::zeros({T, H});
  for (int64_t r = 0; r < T * k; ++r)
    add_inplace(dx.data<float>() + s.permuted_slot[r] / k * H, d_rows.data<float>() + r * H, H);
  d_expert_out = Tensor();
  // ---- router: routing weights and auxiliary losses -> logits ----
  std::vector<int64_t> counts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) counts[e] = s.offsets[e + 1] - s.offsets[e];
  const double aux_coeff = c.moe.aux_loss_coeff * aux_scale;
  const double aux_factor = aux_coeff * static_cast<double>(E) / (static_cast<double>(T) * T * k);
  const double z_factor = c.moe.z_loss_coeff * aux_scale * 2.0 / static_cast<double>(T);
  Tensor dlogits = Tensor::empty({T, E});
  std::vector<double> ds(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* sc = s.scores.data<float>() + t * E;
    const float* q = s.probs.data<float>() + t * k;
    const float* dq = dprobs.data<float>() + t * k;
    const int32_t* ex = s.experts.data() + t * k;
    float* dl = dlogits.data<float>() + t * E;
    for (int64_t e = 0; e < E; ++e) ds[e] = aux_factor * static_cast<double>(counts[e]);  // ∂aux/∂s
    for (int64_t e = 0; e < E; ++e) dl[e] = 0.0f;
    if (c.moe.pre_softmax) {
      for (int64_t j = 0; j < k; ++j) ds[ex[j]] += dq[j];
    } else {  // q = softmax over the selected logits
      double qdq = 0.0;
      for (int64_t j = 0; j < k; ++j) qdq += static_cast<double>(q[j]) * dq[j];
      for (int64_t j = 0; j < k; ++j) dl[ex[j]] = static_cast<float>(q[j] * (dq[j] - qdq));
    }
    double sds = 0.0;  // through s = softmax over all logits
    for (int64_t e = 0; e < E; ++e) sds += sc[e] * ds[e];
    const double z = z_factor * s.logsumexp.data<float>()[t];
    for (int64_t e = 0; e < E; ++e) dl[e] += static_cast<float>(sc[e] * (ds[e] - sds) + z * sc[e]);
  }
  const Tensor d_router_in = linear_backward(dlogits, to_f32(s.x), router_weight(ops, pb, w.router_w));
  add_inplace(dx.data<float>(), d_router_in.data<float>(), T * H);
  s = MoeSaved{};
  return dx;
}

}  // namespace gale
