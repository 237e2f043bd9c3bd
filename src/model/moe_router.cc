// MoE router forward/backward: score functions, (group-limited) top-k, expert bias, token dropping, aux losses.
#include "model/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "core/threads.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/norm.h"
#include "model/linear.h"

namespace gale {

namespace {

// The router in f32 (no bf16 or f16 copy is used even under --bf16 / --fp16).
LinearWeight router_weight(const OpTable& ops, const ParamBuffer& pb, int id) {
  LinearWeight w = linear_weight(pb, id, ops.gemm, ops.bf16_gemm);
  w.w_bf16 = nullptr;
  w.w_f16 = nullptr;
  return w;
}

bool splits(const Comm& g) { return g && g->size() > 1; }

// The scores and weights a layer routes with: the configured ones, or sinkhorn's (sigmoid when
// k = 1, else softmax over all E taken at the chosen experts; no scaling).
struct Scoring {
  bool sigmoid = false;
  bool pre_softmax = false;
  double scaling = 1.0;
};

Scoring scoring(const MoeConfig& m) {
  if (m.sinkhorn) return {m.topk == 1, true, 1.0};
  return {m.sigmoid, m.pre_softmax, m.topk_scaling_factor};
}

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// The router's GEMM input: x in f32, times the jitter noise with --moe-input-jitter-eps (a copy).
Tensor router_input(const ModelConfig& c, const Tensor& x, const MoeRouterKey& key) {
  if (c.moe.input_jitter_eps == 0.0) return to_f32(x);
  const Tensor xf = to_f32(x);
  const int64_t T = x.size(0), H = x.size(1);
  Tensor y = Tensor::empty({T, H});
  parallel_for(T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t id = key.row_ids ? key.row_ids[t] : t;
      for (int64_t h = 0; h < H; ++h)
        y.data<float>()[t * H + h] = xf.data<float>()[t * H + h] * moe_input_jitter(c, key.layer, id, h);
    }
  });
  return y;
}

// Drops the pairs over each expert's capacity (experts[t·k + j] = -1).
void drop_over_capacity(const ModelConfig& c, int64_t T, const Tensor& probs, std::vector<int32_t>* experts) {
  const int64_t E = c.moe.num_experts, k = c.moe.topk;
  const int64_t capacity = moe_expert_capacity(T, k, E, c.moe.capacity_factor);
  if (capacity > T) return;  // Megatron: no expert can overflow
  std::vector<std::vector<int64_t>> pairs(static_cast<size_t>(E));  // per expert its slots, in token order
  for (int64_t i = 0; i < T * k; ++i) pairs[(*experts)[i]].push_back(i);
  const float* q = probs.data<float>();
  for (auto& slots : pairs) {
    if (static_cast<int64_t>(slots.size()) <= capacity) continue;
    if (!c.moe.drop_by_position)  // keep the largest weights, the earlier token first among equal ones
      std::stable_sort(slots.begin(), slots.end(), [&](int64_t a, int64_t b) { return q[a] > q[b]; });
    for (size_t i = static_cast<size_t>(capacity); i < slots.size(); ++i) (*experts)[slots[i]] = -1;
  }
}

// --moe-pad-expert-input-to-capacity: each expert's rows filled up to min(C, T) with the earliest
// tokens that did not choose it (after dropping an expert below capacity lost no pair).
void pad_to_capacity(const ModelConfig& c, int64_t T, MoeRouting* r) {
  const int64_t E = c.moe.num_experts, k = c.moe.topk;
  const int64_t rows = std::min(moe_expert_capacity(T, k, E, c.moe.capacity_factor), T);
  r->padding.assign(static_cast<size_t>(E), {});
  std::vector<char> chose(static_cast<size_t>(T));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t t = 0; t < T; ++t) {
      chose[t] = 0;
      for (int64_t j = 0; j < k; ++j) chose[t] |= r->experts[t * k + j] == e;
    }
    for (int64_t t = 0; t < T && r->tokens_per_expert[e] < rows; ++t)
      if (!chose[t]) {
        r->padding[e].push_back(t);
        ++r->tokens_per_expert[e];
      }
  }
}

// quantile_balancing (Megatron main's TopKRouter.quantile_balancing): the experts of this rank's T
// tokens [T·k] from qb_dual_update with the layer's qb_beta. A counting training forward (`update`)
// runs it on the f32 logits all-gathered over `seq` (TP×CP; rows in rank order, this rank's rows
// taken back), so the column quantile covers the whole sequence, and adds that quantile to the
// layer's step sums; otherwise the choice is per token (the same rows without the gather).
std::vector<int32_t> quantile_balancing_choice(const ModelConfig& c, const ParamBuffer& pb, const MoeRouterIds& w,
                                               const Tensor& logits, bool update, const Comm& seq) {
  const int64_t T = logits.size(0), E = c.moe.num_experts, k = c.moe.topk;
  GALE_CHECK(w.qb_beta >= 0 && w.qb) << "quantile balancing without its qb_beta buffer";
  const float* beta = pb.param_data(w.qb_beta);
  std::vector<int32_t> chosen(static_cast<size_t>(T * k));
  if (!update) {
    moe_qb_dual_update(logits.data<float>(), T, E, k, beta, chosen.data(), nullptr);
    return chosen;
  }
  const int64_t parts = splits(seq) ? seq->size() : 1, rank = parts > 1 ? seq->rank() : 0;
  std::vector<float> full;
  const float* all = logits.data<float>();
  if (parts > 1) {
    full.resize(static_cast<size_t>(parts * T * E));
    seq->all_gather(logits.data<float>(), full.data(), T * E, DType::kF32);
    all = full.data();
  }
  std::vector<int32_t> full_chosen(static_cast<size_t>(parts * T * k));
  std::vector<float> quantile(static_cast<size_t>(E));
  moe_qb_dual_update(all, parts * T, E, k, beta, full_chosen.data(), quantile.data());
  std::copy(full_chosen.begin() + rank * T * k, full_chosen.begin() + (rank + 1) * T * k, chosen.begin());
  for (int64_t e = 0; e < E; ++e) w.qb->sum[e] += quantile[e];
  ++w.qb->count;
  return chosen;
}

}  // namespace

void moe_top_k(const float* v, int64_t E, int64_t k, int64_t num_groups, int64_t group_topk, int32_t* out) {
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  if (num_groups > 0 && group_topk > 0) {
    const int64_t per = E / num_groups, m = k / group_topk;
    std::vector<double> group_score(static_cast<size_t>(num_groups));
    std::vector<float> vals(static_cast<size_t>(per));
    for (int64_t g = 0; g < num_groups; ++g) {
      std::copy(v + g * per, v + (g + 1) * per, vals.begin());
      std::partial_sort(vals.begin(), vals.begin() + m, vals.end(), std::greater<float>());
      double sum = 0.0;
      for (int64_t i = 0; i < m; ++i) sum += vals[i];
      group_score[g] = sum;
    }
    std::vector<int32_t> groups(static_cast<size_t>(num_groups));
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(), [&](int32_t a, int32_t b) { return group_score[a] > group_score[b]; });
    std::vector<char> eligible(static_cast<size_t>(num_groups), 0);
    for (int64_t i = 0; i < group_topk; ++i) eligible[groups[i]] = 1;
    order.erase(std::remove_if(order.begin(), order.end(), [&](int32_t e) { return !eligible[e / per]; }), order.end());
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  GALE_CHECK_GE(static_cast<int64_t>(order.size()), k) << "top-" << k << " of " << order.size() << " eligible experts";
  std::copy(order.begin(), order.begin() + k, out);
}

void moe_sinkhorn(const float* logits, int64_t T, int64_t E, float* out) {
  constexpr double kEps = 1e-8, kTolerance = 1e-4;
  constexpr int kMaxRounds = 10000;
  std::vector<double> cost(static_cast<size_t>(T * E)), d0(static_cast<size_t>(T), 1.0), d1(static_cast<size_t>(E), 1.0);
  for (int64_t i = 0; i < T * E; ++i) cost[i] = std::exp(static_cast<double>(logits[i]));
  std::vector<double> col(static_cast<size_t>(E));
  for (int round = 0; round < kMaxRounds; ++round) {
    for (int64_t t = 0; t < T; ++t) {
      double row = 0.0;
      for (int64_t e = 0; e < E; ++e) row += d1[e] * cost[t * E + e];
      d0[t] = 1.0 / static_cast<double>(T) / (row + kEps);
    }
    std::fill(col.begin(), col.end(), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) col[e] += d0[t] * cost[t * E + e];
    double change = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      const double next = 1.0 / static_cast<double>(E) / (col[e] + kEps);
      change += std::abs(next - d1[e]);
      d1[e] = next;
    }
    if (!(change / static_cast<double>(E) > kTolerance)) break;  // also stops on NaN, as Megatron's loop
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) out[t * E + e] = static_cast<float>(d1[e] * cost[t * E + e] * d0[t]);
}

int64_t moe_expert_capacity(int64_t tokens, int64_t k, int64_t E, double factor) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(tokens * k) / static_cast<double>(E) * factor));
}

void moe_qb_dual_update(const float* scores, int64_t m, int64_t E, int64_t k, const float* beta, int32_t* indices,
                        float* beta_local) {
  GALE_CHECK(k >= 1 && k < E) << "quantile balancing: top-" << k << " of " << E << " experts (needs k < E)";
  std::vector<float> alpha(static_cast<size_t>(m));
  parallel_for(m, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> v(static_cast<size_t>(E));
    std::vector<int32_t> top(static_cast<size_t>(k + 1));
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t e = 0; e < E; ++e) v[e] = scores[t * E + e] - beta[e];  // f32, as torch's (scores - beta)
      moe_top_k(v.data(), E, k + 1, 0, 0, top.data());
      std::copy(top.begin(), top.begin() + k, indices + t * k);
      alpha[t] = v[top[k]];
    }
  });
  if (!beta_local) return;
  GALE_CHECK_EQ((m * k) % E, 0) << "quantile balancing: " << m << " tokens * top-" << k
                                << " routed assignments are not divisible by " << E << " experts";
  const int64_t rank = m * k / E;  // the (rank + 1)-th largest of each column
  parallel_for(E, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> col(static_cast<size_t>(m));
    for (int64_t e = begin; e < end; ++e) {
      for (int64_t t = 0; t < m; ++t) col[t] = scores[t * E + e] - alpha[t];
      std::nth_element(col.begin(), col.begin() + rank, col.end(), std::greater<float>());
      beta_local[e] = col[rank];
    }
  });
}

void update_qb_beta(float* beta, const double* avg, int64_t E, double ema) {
  std::vector<double> next(static_cast<size_t>(E));
  double mean = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    next[e] = ema * static_cast<double>(beta[e]) + (1.0 - ema) * avg[e];
    mean += next[e];
  }
  mean /= static_cast<double>(E);
  for (int64_t e = 0; e < E; ++e) beta[e] = static_cast<float>(next[e] - mean);
}

void update_expert_bias(float* bias, const double* counts, int64_t E, double rate) {
  double mean = 0.0;
  for (int64_t e = 0; e < E; ++e) mean += counts[e];
  mean /= static_cast<double>(E);
  for (int64_t e = 0; e < E; ++e) {
    const double offset = mean - counts[e];
    const float step = static_cast<float>(rate);
    if (offset > 0.0) bias[e] += step;
    if (offset < 0.0) bias[e] -= step;
  }
}

float moe_random_logit(const ModelConfig& c, int64_t layer, int64_t id, int64_t e) {
  const uint64_t stream = mix_stream(c.seed, 0x7a4d, static_cast<uint64_t>(layer + 1));
  return normal_at(c.seed, stream, static_cast<uint64_t>(id * c.moe.num_experts + e));
}

float moe_input_jitter(const ModelConfig& c, int64_t layer, int64_t id, int64_t h) {
  const double eps = c.moe.input_jitter_eps;
  if (eps == 0.0) return 1.0f;
  const uint64_t stream = mix_stream(c.seed, 0x717, static_cast<uint64_t>(layer + 1));
  const double u = uniform_at(c.seed, stream, static_cast<uint64_t>(id * c.hidden + h));
  return static_cast<float>(1.0 - eps + 2.0 * eps * u);
}

MoeRouting moe_router_forward(const ModelConfig& c, const OpTable& ops, const ParamBuffer& pb, const MoeRouterIds& w,
                              const Tensor& x, int64_t batch, MoeRouterSaved* saved, MoeAuxLosses* losses,
                              const Comm& seq, const MoeRouterKey& key) {
  const MoeConfig& m = c.moe;
  const Scoring how = scoring(m);
  const int64_t T = x.size(0), E = m.num_experts, k = m.topk;
  GALE_CHECK(k >= 1 && k <= E) << "moe top-k " << k << " of " << E << " experts";
  Tensor logits = linear_forward(router_input(c, x, key), router_weight(ops, pb, w.weight));  // [T, E]
  if (w.bias >= 0) add_bias_ref(logits.data<float>(), pb.param_data(w.bias), T, E);  // --add-bias-linear
  if (m.force_load_balancing)  // random logits (straight-through: backward treats them as the real ones)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e)
        logits.data<float>()[t * E + e] = moe_random_logit(c, key.layer, key.row_ids ? key.row_ids[t] : t, e);
  const float* bias = w.expert_bias >= 0 ? pb.param_data(w.expert_bias) : nullptr;
  std::vector<float> balanced;  // sinkhorn, training: the top-k is taken on the balanced logits
  if (m.sinkhorn && key.training) {
    balanced.resize(static_cast<size_t>(T * E));
    moe_sinkhorn(logits.data<float>(), T, E, balanced.data());
  }
  std::vector<int32_t> qb_choice;  // quantile_balancing: [T·k] the experts qb_dual_update chose
  if (m.quantile_balancing) qb_choice = quantile_balancing_choice(c, pb, w, logits, saved && losses && key.training, seq);
  Tensor scores = Tensor::empty({T, E}), lse = Tensor::empty({T}), q = Tensor::empty({T, k});
  std::vector<int32_t> experts(static_cast<size_t>(T * k));
  std::vector<float> v(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.data<float>() + t * E;
    float* s = scores.data<float>() + t * E;
    const float mx = *std::max_element(l, l + E);
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e] - mx));
    lse.data<float>()[t] = mx + static_cast<float>(std::log(sum));
    if (how.sigmoid) {
      for (int64_t e = 0; e < E; ++e) s[e] = static_cast<float>(sigmoid(l[e]));
      for (int64_t e = 0; e < E; ++e) v[e] = bias ? s[e] + bias[e] : s[e];
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = static_cast<float>(std::exp(static_cast<double>(l[e] - mx)) / sum);
      std::copy(how.pre_softmax ? s : l, (how.pre_softmax ? s : l) + E, v.begin());
    }
    if (!balanced.empty()) std::copy(balanced.begin() + t * E, balanced.begin() + (t + 1) * E, v.begin());
    int32_t* ex = experts.data() + t * k;
    if (!qb_choice.empty())
      std::copy(qb_choice.begin() + t * k, qb_choice.begin() + (t + 1) * k, ex);
    else
      moe_top_k(v.data(), E, k, m.num_groups, m.group_topk, ex);
    double selected = 0.0;
    for (int64_t j = 0; j < k; ++j) selected += s[ex[j]];
    float* qt = q.data<float>() + t * k;
    for (int64_t j = 0; j < k; ++j) {
      if (how.sigmoid)
        qt[j] = k > 1 ? static_cast<float>(s[ex[j]] / (selected + 1e-20)) : s[ex[j]];
      else
        qt[j] = how.pre_softmax ? s[ex[j]] : static_cast<float>(s[ex[j]] / selected);
    }
  }
  MoeRouting r;
  r.probs = q;
  if (how.scaling != 1.0) {
    r.probs = Tensor::empty({T, k});
    for (int64_t i = 0; i < T * k; ++i) r.probs.data<float>()[i] = static_cast<float>(q.data<float>()[i] * how.scaling);
  }
  r.experts = experts;
  if (m.fix_router)  // the weights stay those of the real choice (`experts`, which backward uses)
    for (int64_t i = 0; i < T * k; ++i) r.experts[i] = static_cast<int32_t>(i % E);
  if (m.capacity_factor > 0.0) drop_over_capacity(c, T, r.probs, &r.experts);
  r.tokens_per_expert.assign(static_cast<size_t>(E), 0);
  for (int32_t e : r.experts)
    if (e >= 0) ++r.tokens_per_expert[e];
  if (m.capacity_factor > 0.0 && m.pad_to_capacity) pad_to_capacity(c, T, &r);
  if (!saved) return r;

  // ---- auxiliary losses over the whole sequence (Megatron's sequence_partition_group, TP×CP):
  // the aux top-k's counts summed over `seq`, the scores' sums kept local, so each rank's gradient
  // is its tokens' share of the whole sequence's loss; global_aux_loss: over the whole stage's
  // group instead, averaged over the step's micro-batches. Each load-balancing loss that is on
  // (several with Megatron's list form) gets its own term. ----
  std::vector<int32_t> aux_top;  // [T·k] the plain top-k of p (= of the logits): no bias, groups or dropping
  if (m.any_aux_loss()) {
    aux_top.resize(static_cast<size_t>(T * k));
    for (int64_t t = 0; t < T; ++t) moe_top_k(logits.data<float>() + t * E, E, k, 0, 0, aux_top.data() + t * k);
  }
  // Σ_t p_t,e per aux group g = t mod G: p = softmax(l), or σ / (Σ_E σ + 1e-20) under sigmoid.
  const auto score_sums = [&](int64_t G) {
    std::vector<double> p_sum(static_cast<size_t>(G * E), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      const float* s = scores.data<float>() + t * E;
      double* ps = p_sum.data() + (t % G) * E;
      if (how.sigmoid) {
        double z = 1e-20;
        for (int64_t e = 0; e < E; ++e) z += s[e];
        for (int64_t e = 0; e < E; ++e) ps[e] += s[e] / z;
      } else {
        for (int64_t e = 0; e < E; ++e) ps[e] += s[e];
      }
    }
    return p_sum;
  };
  std::vector<MoeRouterSaved::AuxTerm> terms;
  double sums[kMoeAuxKinds + 1] = {};  // this rank's share of each load-balancing loss, then Σ lse²
  MoeGlobalAux* global = nullptr;
  for (int kind = 0; kind < kMoeAuxKinds; ++kind) {
    MoeRouterSaved::AuxTerm term;
    term.kind = kind;
    term.coeff = m.aux_coeff(kind);
    if (!(term.coeff > 0.0)) continue;
    if (kind == kMoeGlobalAux) {
      global = w.global_aux;
      GALE_CHECK(global) << "global_aux_loss without its state";
    }
    const Comm& group = kind == kMoeGlobalAux ? global->group : seq;
    const int64_t parts = splits(group) ? group->size() : 1;
    term.groups = kind == kMoeSeqAux ? batch : 1;
    const int64_t G = term.groups;
    GALE_CHECK_EQ(T % G, 0) << "seq_aux_loss: " << T << " tokens are not " << G << " sequences";
    const bool rerun_global = kind == kMoeGlobalAux && key.global_aux_counts;
    if (rerun_global) {  // --recompute-modules moe: the n̄ of its forward
      GALE_CHECK_EQ(static_cast<int64_t>(key.global_aux_counts->size()), E) << "global_aux_loss rerun counts";
      term.counts = *key.global_aux_counts;
    } else {
      std::vector<int64_t> counts(static_cast<size_t>(G * E), 0);
      for (int64_t i = 0; i < T * k; ++i) ++counts[((i / k) % G) * E + aux_top[i]];
      if (parts > 1) group->all_reduce(counts.data(), G * E, DType::kI64, ReduceOp::kSum);
      term.counts.assign(counts.begin(), counts.end());
    }
    if (kind == kMoeGlobalAux && !rerun_global) {
      GALE_CHECK(losses) << "global_aux_loss: a rerun of the router without its forward's token counts";
      for (int64_t e = 0; e < E; ++e) global->counts[e] += term.counts[e];
      ++global->micro_batches;
      for (int64_t e = 0; e < E; ++e) term.counts[e] = global->counts[e] / static_cast<double>(global->micro_batches);
    }
    term.tokens = T / G * parts;
    if (losses) {
      const std::vector<double> p_sum = score_sums(G);
      double sum = 0.0;
      for (int64_t i = 0; i < G * E; ++i) sum += p_sum[i] * term.counts[i];
      const double N = static_cast<double>(term.tokens);
      sums[kind] = sum * static_cast<double>(E) / (N * N * k) / static_cast<double>(G);
    }
    terms.push_back(std::move(term));
  }
  const int64_t seq_parts = splits(seq) ? seq->size() : 1;  // the z-loss's tokens: T·|seq|
  if (losses) {
    if (m.z_loss_coeff > 0.0)
      for (int64_t t = 0; t < T; ++t)
        sums[kMoeAuxKinds] += static_cast<double>(lse.data<float>()[t]) * lse.data<float>()[t];
    if (global && splits(global->group))  // Megatron: no DP average
      global->group->all_reduce(sums + kMoeGlobalAux, 1, DType::kF64, ReduceOp::kSum);
    // aux_loss, seq_aux_loss and the z-loss over `seq` (one all-reduce; the global slot is skipped)
    double over_seq[3] = {sums[kMoeAux], sums[kMoeSeqAux], sums[kMoeAuxKinds]};
    if (seq_parts > 1 && (m.aux_loss_coeff > 0.0 || m.seq_aux_loss_coeff > 0.0 || m.z_loss_coeff > 0.0))
      seq->all_reduce(over_seq, 3, DType::kF64, ReduceOp::kSum);
    MoeAuxLosses l;
    l.load_balancing = over_seq[0];
    l.seq_load_balancing = over_seq[1];
    l.global_load_balancing = sums[kMoeGlobalAux];
    l.z = over_seq[2] / static_cast<double>(T * seq_parts);
    *losses = l;
  }
  saved->scores = scores;
  saved->logsumexp = lse;
  saved->probs = q;
  saved->experts = std::move(experts);
  saved->aux = std::move(terms);
  saved->z_tokens = T * seq_parts;
  saved->key = key;
  if (how.sigmoid && m.z_loss_coeff > 0.0) saved->logits = logits;
  return r;
}

Tensor moe_router_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const MoeRouterIds& w,
                           MoeRouterSaved& s, const Tensor& x, const Tensor& dprobs, double aux_scale) {
  const MoeConfig& m = c.moe;
  const Scoring how = scoring(m);
  const int64_t T = x.size(0), E = m.num_experts, k = m.topk;
  // --calculate-per-token-loss: every loss times this router's tokens over the sequence group
  if (s.key.per_token_loss) aux_scale *= static_cast<double>(s.z_tokens);
  // ∂(Σ coeff · loss)/∂p_t,e = Σ over the load-balancing terms of factor · n_(t mod G),e
  std::vector<double> aux_factor;
  for (const MoeRouterSaved::AuxTerm& a : s.aux) {
    const double N = static_cast<double>(a.tokens);
    aux_factor.push_back(a.coeff * aux_scale * static_cast<double>(E) / (N * N * k) / static_cast<double>(a.groups));
  }
  const double z_factor = m.z_loss_coeff * aux_scale * 2.0 / static_cast<double>(s.z_tokens);
  const bool aux = !s.aux.empty();
  Tensor dlogits = Tensor::empty({T, E});
  std::vector<double> ds(static_cast<size_t>(E)), g(static_cast<size_t>(k)), dsig(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* sc = s.scores.data<float>() + t * E;
    const float* q = s.probs.data<float>() + t * k;
    const int32_t* ex = s.experts.data() + t * k;
    float* dl = dlogits.data<float>() + t * E;
    for (int64_t j = 0; j < k; ++j) g[j] = how.scaling * dprobs.data<float>()[t * k + j];
    std::fill(ds.begin(), ds.end(), 0.0);  // ∂aux/∂p
    for (size_t i = 0; i < s.aux.size(); ++i) {
      const double* n = s.aux[i].counts.data() + (t % s.aux[i].groups) * E;
      for (int64_t e = 0; e < E; ++e) ds[e] += aux_factor[i] * n[e];
    }
    const double z = z_factor * s.logsumexp.data<float>()[t];
    if (how.sigmoid) {
      // σ: the selected weights q = σ_sel / Σ_sel σ (k > 1) and the aux scores p = σ / Σ_E σ.
      std::fill(dsig.begin(), dsig.end(), 0.0);
      if (k > 1) {
        double zsel = 1e-20, gq = 0.0;
        for (int64_t j = 0; j < k; ++j) zsel += sc[ex[j]];
        for (int64_t j = 0; j < k; ++j) gq += g[j] * q[j];
        for (int64_t j = 0; j < k; ++j) dsig[ex[j]] += (g[j] - gq) / zsel;
      } else {
        dsig[ex[0]] += g[0];
      }
      if (aux) {
        double zall = 1e-20, dsp = 0.0;
        for (int64_t e = 0; e < E; ++e) zall += sc[e];
        for (int64_t e = 0; e < E; ++e) dsp += ds[e] * sc[e] / zall;
        for (int64_t e = 0; e < E; ++e) dsig[e] += (ds[e] - dsp) / zall;
      }
      const float* l = s.logits.defined() ? s.logits.data<float>() + t * E : nullptr;
      const float lse = s.logsumexp.data<float>()[t];
      for (int64_t e = 0; e < E; ++e) {
        double d = dsig[e] * sc[e] * (1.0 - sc[e]);
        if (l) d += z * std::exp(static_cast<double>(l[e]) - lse);  // z-loss through softmax(l)
        dl[e] = static_cast<float>(d);
      }
      continue;
    }
    for (int64_t e = 0; e < E; ++e) dl[e] = 0.0f;
    if (how.pre_softmax) {
      for (int64_t j = 0; j < k; ++j) ds[ex[j]] += g[j];
    } else {  // q = softmax over the selected logits
      double qg = 0.0;
      for (int64_t j = 0; j < k; ++j) qg += static_cast<double>(q[j]) * g[j];
      for (int64_t j = 0; j < k; ++j) dl[ex[j]] = static_cast<float>(q[j] * (g[j] - qg));
    }
    double sds = 0.0;  // through s = softmax over all logits
    for (int64_t e = 0; e < E; ++e) sds += sc[e] * ds[e];
    for (int64_t e = 0; e < E; ++e) dl[e] += static_cast<float>(sc[e] * (ds[e] - sds) + z * sc[e]);
  }
  if (w.bias >= 0) column_sum_accumulate(dlogits.data<float>(), pb.grad_data(w.bias), T, E);
  Tensor dx = linear_backward(dlogits, router_input(c, x, s.key), router_weight(ops, pb, w.weight));
  if (m.input_jitter_eps != 0.0) {  // through x ⊙ n: the noise redrawn
    const int64_t H = x.size(1);
    parallel_for(T, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t id = s.key.row_ids ? s.key.row_ids[t] : t;
        for (int64_t h = 0; h < H; ++h) dx.data<float>()[t * H + h] *= moe_input_jitter(c, s.key.layer, id, h);
      }
    });
  }
  s = MoeRouterSaved{};
  return dx;
}

}  // namespace gale
