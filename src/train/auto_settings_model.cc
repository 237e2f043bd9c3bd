// --auto-settings' memory and step-time models (see the header for the formulas).
#include "train/auto_settings_model.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace gale {

namespace {

// Bandwidth bounds: a measured cost below the timers' noise would otherwise make communication free.
constexpr double kMinBandwidth = 1e8, kMaxBandwidth = 1e12;

double transient_bytes(const RunProfile& p) {
  int64_t worst = 0;
  for (size_t r = 0; r < p.peak_bytes.size(); ++r) worst = std::max(worst, p.peak_bytes[r] - p.persistent_bytes[r]);
  return static_cast<double>(worst);
}

double per_micro_batch_seconds(const RunProfile& p) {
  const double fb = p.forward_backward_seconds >= 0.0 ? p.forward_backward_seconds : p.step_seconds;
  return fb / static_cast<double>(std::max<int64_t>(1, p.num_micro_batches));
}

}  // namespace

SplitFit fit_split(const std::vector<std::pair<double, double>>& points) {
  SplitFit f;
  if (points.empty()) return f;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = static_cast<double>(points.size());
  for (const auto& [d, y] : points) {
    const double x = 1.0 / d;
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double den = n * sxx - sx * sx;
  if (std::fabs(den) < 1e-12 * std::max(1.0, n * sxx)) {  // one distinct degree: everything splits
    f.beta = sy / sx;
    return f;
  }
  f.beta = (n * sxy - sx * sy) / den;
  f.alpha = (sy - f.beta * sx) / n;
  return f;
}

const PairMeasure* AutoModels::pair(int64_t tp, int64_t cp) const {
  for (const PairMeasure& p : pairs)
    if (p.tp == tp && p.cp == cp) return &p;
  return nullptr;
}

StatusOr<AutoModels> fit_auto_models(const std::vector<RunProfile>& profiles, const AutoTarget& target) {
  AutoModels m;
  m.target = target;
  std::map<std::pair<int64_t, int64_t>, std::map<int64_t, const RunProfile*>> by_pair;
  const RunProfile* staged = nullptr;  // the PP 2 run (TP = CP = DP = 1)
  for (const RunProfile& p : profiles) {
    if (p.pp == 2 && p.tp == 1 && p.cp == 1 && p.dp == 1 && p.num_layers == 2 && p.world_size == 2) {
      staged = &p;
      continue;
    }
    if (p.pp != 1 || p.dp != 1)
      return InvalidArgument("--auto-settings: a profiling run of pipeline size ", p.pp, " and data-parallel size ", p.dp,
                             " (expected 1 and 1, or a 2-layer run of pipeline size 2)");
    by_pair[{p.tp, p.cp}][p.num_layers] = &p;
  }
  std::vector<std::pair<double, double>> lp, fp, la, fa, fs;
  double opt_sum = 0;
  int opt_n = 0;
  for (const auto& [key, runs] : by_pair) {
    if (runs.size() < 2) continue;
    const RunProfile& a = *runs.begin()->second;
    const RunProfile& b = *std::next(runs.begin())->second;
    const double dl = static_cast<double>(b.num_layers - a.num_layers);
    PairMeasure pm;
    pm.tp = key.first;
    pm.cp = key.second;
    const double pa = static_cast<double>(a.max_param_elems()), pb = static_cast<double>(b.max_param_elems());
    pm.layer_params = (pb - pa) / dl;
    pm.fixed_params = pa - pm.layer_params * static_cast<double>(a.num_layers);
    const double ta = transient_bytes(a), tb = transient_bytes(b);
    pm.layer_activation = std::max(0.0, (tb - ta) / dl);
    pm.fixed_activation = std::max(0.0, ta - pm.layer_activation * static_cast<double>(a.num_layers));
    const double sa = per_micro_batch_seconds(a), sb = per_micro_batch_seconds(b);
    pm.layer_seconds = std::max(1e-9, (sb - sa) / dl);
    pm.fixed_seconds = std::max(0.0, sa - pm.layer_seconds * static_cast<double>(a.num_layers));
    const double ca = static_cast<double>(a.tp_comm_bytes + a.cp_comm_bytes) / static_cast<double>(a.num_micro_batches);
    const double cb = static_cast<double>(b.tp_comm_bytes + b.cp_comm_bytes) / static_cast<double>(b.num_micro_batches);
    pm.layer_comm_bytes = std::max(0.0, (cb - ca) / dl);
    pm.fixed_comm_bytes = std::max(0.0, ca - pm.layer_comm_bytes * static_cast<double>(a.num_layers));
    if (a.flops_per_iteration > 0.0 && b.flops_per_iteration > 0.0 && a.forward_backward_seconds >= 0.0 &&
        b.forward_backward_seconds >= 0.0) {
      const double ma = static_cast<double>(a.num_micro_batches), mb = static_cast<double>(b.num_micro_batches);
      pm.run_flops = a.flops_per_iteration + b.flops_per_iteration;
      pm.run_seconds = a.forward_backward_seconds + b.forward_backward_seconds;
      pm.run_comm_bytes = static_cast<double>(a.tp_comm_bytes + a.cp_comm_bytes + b.tp_comm_bytes + b.cp_comm_bytes);
      pm.layer_flops = (b.flops_per_iteration / mb - a.flops_per_iteration / ma) / dl;
      pm.fixed_flops = a.flops_per_iteration / ma - pm.layer_flops * static_cast<double>(a.num_layers);
    }
    m.pairs.push_back(pm);
    const double d = static_cast<double>(pm.tp * pm.cp);
    if (pm.cp == 1) {
      lp.push_back({static_cast<double>(pm.tp), pm.layer_params});
      fp.push_back({static_cast<double>(pm.tp), pm.fixed_params});
    }
    la.push_back({d, pm.layer_activation});
    fa.push_back({d, pm.fixed_activation});
    fs.push_back({d, pm.fixed_seconds});
    if (key == std::make_pair<int64_t, int64_t>(1, 1)) {
      const double pers_a = static_cast<double>(a.max_persistent_bytes());
      const double pers_b = static_cast<double>(b.max_persistent_bytes());
      m.bytes_per_param = (pers_b - pers_a) / (pb - pa);
      m.persistent_intercept = pers_a - m.bytes_per_param * pa;
      m.layer_seconds_1 = pm.layer_seconds;
    }
    for (const RunProfile* r : {&a, &b})
      if (r->optimizer_seconds >= 0.0 && r->max_param_elems() > 0) {
        opt_sum += r->optimizer_seconds / static_cast<double>(r->max_param_elems());
        ++opt_n;
      }
  }
  const PairMeasure* base = m.pair(1, 1);
  if (!base)
    return InvalidArgument("--auto-settings: the profiles lack runs of 1 and 2 layers at tensor- and context-parallel size 1");
  m.layer_params = fit_split(lp);
  m.fixed_params = fit_split(fp);
  m.layer_activation = fit_split(la);
  m.fixed_activation = fit_split(fa);
  m.fixed_seconds = fit_split(fs);
  m.optimizer_seconds_per_param = opt_n > 0 ? opt_sum / opt_n : 0.0;
  // Intra-node bandwidth: what the d = 2 runs' TP/CP bytes cost beyond half the TP = CP = 1 layer.
  double bytes_sum = 0, extra_sum = 0;
  int bw_n = 0;
  for (const PairMeasure& pm : m.pairs) {
    if (pm.tp * pm.cp != 2 || pm.layer_comm_bytes <= 0.0) continue;
    bytes_sum += pm.layer_comm_bytes;
    extra_sum += pm.layer_seconds - m.layer_seconds_1 / 2.0;
    ++bw_n;
  }
  if (bw_n > 0) {
    m.intra_bandwidth = std::clamp(extra_sum > 0.0 ? bytes_sum / extra_sum : kMaxBandwidth, kMinBandwidth, kMaxBandwidth);
    m.layer_comm_bytes = bytes_sum / bw_n;
    m.bandwidth_measured = true;
  }
  // The PP 2 run (one layer a stage): which shares of the fixed parameters and activations the
  // first and the last stage hold, beyond their layer and its micro-batches in flight.
  if (staged && base->fixed_params > 0.0 && base->fixed_activation > 0.0) {
    const double in_flight = std::min<double>(2.0, static_cast<double>(staged->num_micro_batches));
    auto transient = [&](size_t r) { return static_cast<double>(staged->peak_bytes[r] - staged->persistent_bytes[r]); };
    m.first_param_share = std::max(0.0, (static_cast<double>(staged->param_elems[0]) - base->layer_params) / base->fixed_params);
    m.last_param_share = std::max(0.0, (static_cast<double>(staged->param_elems[1]) - base->layer_params) / base->fixed_params);
    m.first_activation_share = std::max(0.0, (transient(0) - in_flight * base->layer_activation) / base->fixed_activation);
    m.last_activation_share = std::max(0.0, (transient(1) - base->layer_activation) / base->fixed_activation);
    m.stage_shares = true;
  }
  // With Megatron's FLOPs in every profile (and the forward-backward timer), times come from
  // totals instead of differences of two short runs, which a loaded host makes noisy: one compute
  // rate (FLOP/s of a rank) from the TP = CP = 1 runs; the d > 1 runs' time beyond their FLOPs at
  // that rate, over the TP/CP bytes they passed, is the bandwidth; every pair's layer and fixed
  // times follow from its FLOPs and bytes.
  bool flops = true;
  for (const PairMeasure& pm : m.pairs) flops = flops && pm.run_flops > 0.0 && pm.run_seconds > 0.0;
  if (flops) {
    m.flops_per_second = base->run_flops / base->run_seconds;
    double bytes = 0, extra = 0;
    for (const PairMeasure& pm : m.pairs) {
      const double d = static_cast<double>(pm.tp * pm.cp);
      if (d == 1.0 || pm.run_comm_bytes <= 0.0) continue;
      bytes += pm.run_comm_bytes * 2.0 * (d - 1.0) / d;
      extra += pm.run_seconds - pm.run_flops / d / m.flops_per_second;
    }
    if (bytes > 0.0) {
      m.intra_bandwidth = std::clamp(extra > 0.0 ? bytes / extra : kMaxBandwidth, kMinBandwidth, kMaxBandwidth);
      m.bandwidth_measured = true;
    }
    std::vector<std::pair<double, double>> fixed_times;
    for (PairMeasure& pm : m.pairs) {
      const double d = static_cast<double>(pm.tp * pm.cp);
      const double wire = 2.0 * (d - 1.0) / d;
      pm.layer_seconds = pm.layer_flops / d / m.flops_per_second + pm.layer_comm_bytes * wire / m.intra_bandwidth;
      pm.fixed_seconds = pm.fixed_flops / d / m.flops_per_second + pm.fixed_comm_bytes * wire / m.intra_bandwidth;
      fixed_times.push_back({d, pm.fixed_seconds});
    }
    m.layer_seconds_1 = base->layer_seconds;
    m.fixed_seconds = fit_split(fixed_times);
  }
  return m;
}

AutoPrediction predict(const AutoModels& m, const AutoLayout& l) {
  const AutoTarget& t = m.target;
  AutoPrediction r;
  const double d = static_cast<double>(l.tp * l.cp);
  const double layers = static_cast<double>(t.num_layers) / static_cast<double>(l.pp);
  const double micro = static_cast<double>(t.global_batch_size) / static_cast<double>(t.micro_batch_size * l.dp);
  const PairMeasure* pm = m.pair(l.tp, l.cp);
  const double tp = static_cast<double>(l.tp);
  const double p_layer = pm ? pm->layer_params : m.layer_params.at(tp);
  const double p_fixed_all = pm ? pm->fixed_params : m.fixed_params.at(tp);
  // b comes from the TP = CP = 1 runs (unsharded); the distributed optimizer shards over the
  // data-parallel group with CP (Megatron's).
  const double dp_cp = static_cast<double>(l.dp * l.cp);
  double per_param = m.bytes_per_param;
  if (t.distributed_optimizer) per_param -= t.shardable_bytes_per_param * (1.0 - 1.0 / dp_cp);
  const double a_layer = pm ? pm->layer_activation : m.layer_activation.at(d);
  const double a_fixed = pm ? pm->fixed_activation : m.fixed_activation.at(d);
  const double in_flight = std::min(static_cast<double>(l.pp), micro);
  double params;
  if (l.pp > 1 && m.stage_shares) {
    // The first stage: its layers with min(PP, m) micro-batches in flight and its share of the
    // fixed part; the last: one micro-batch in flight and its share. The larger peak counts.
    const double first_params = layers * p_layer + m.first_param_share * p_fixed_all;
    const double last_params = layers * p_layer + m.last_param_share * p_fixed_all;
    const double first = per_param * first_params + m.persistent_intercept + layers * in_flight * a_layer +
                         m.first_activation_share * a_fixed;
    const double last =
        per_param * last_params + m.persistent_intercept + layers * a_layer + m.last_activation_share * a_fixed;
    params = std::max(first_params, last_params);
    r.peak_bytes = std::max(first, last);
    r.persistent_bytes = per_param * (first >= last ? first_params : last_params) + m.persistent_intercept;
  } else {
    // Without the PP 2 run: every stage charged the whole fixed activation (conservative) and,
    // with PP > 1, the fixed parameters (tied embeddings: both ends hold the embedding) or half.
    params = layers * p_layer + (l.pp == 1 || t.tied_embeddings ? p_fixed_all : p_fixed_all / 2.0);
    r.persistent_bytes = per_param * params + m.persistent_intercept;
    r.peak_bytes = r.persistent_bytes + layers * in_flight * a_layer + a_fixed;  // the first stage holds the most
  }

  const int64_t rpn = std::max<int64_t>(1, t.ranks_per_node);
  r.tp_cp_spans_nodes = l.tp * l.cp > rpn;
  r.dp_spans_nodes = l.dp * l.cp > 1 && l.tp * l.cp * l.dp > rpn;
  r.pp_spans_nodes = l.pp > 1 && l.tp * l.cp * l.dp * l.pp > rpn;
  const double intra = m.intra_bandwidth, inter = m.intra_bandwidth * t.inter_node_bandwidth_ratio;
  // TP/CP traffic per layer and micro-batch: what a d = 2 run passed (white box without one:
  // four f32 activations per layer), on the wire 2(d − 1)/d of it (ring collectives).
  const double act_bytes = 4.0 * static_cast<double>(t.micro_batch_size * t.seq_length * t.hidden_size);
  const double size = m.layer_comm_bytes > 0.0 ? m.layer_comm_bytes : 4.0 * act_bytes;
  const double wire = d > 1.0 ? size * 2.0 * (d - 1.0) / d : 0.0;
  double compute, comm;
  if (pm && !r.tp_cp_spans_nodes) {
    const double pair_wire = d > 1.0 ? pm->layer_comm_bytes * 2.0 * (d - 1.0) / d : 0.0;
    comm = std::min(pm->layer_seconds, pair_wire / intra);
    compute = pm->layer_seconds - comm;
  } else {
    compute = m.layer_seconds_1 / d;
    comm = wire / (r.tp_cp_spans_nodes ? inter : intra);
  }
  const double t_fixed = pm ? pm->fixed_seconds : std::max(0.0, m.fixed_seconds.at(d));
  const double p2p_bytes = act_bytes / static_cast<double>(l.cp) / (t.sequence_parallel ? tp : 1.0);
  const double p2p = l.pp > 1 ? 2.0 * p2p_bytes / (r.pp_spans_nodes ? inter : intra) : 0.0;
  const double per_micro = layers * (compute + comm) + t_fixed + p2p;
  r.compute_seconds = micro * (layers * compute + t_fixed);
  r.tp_cp_comm_seconds = micro * layers * comm;
  r.pp_comm_seconds = micro * p2p;
  r.bubble_seconds = static_cast<double>(l.pp - 1) * per_micro;
  const double shard = t.distributed_optimizer ? dp_cp : 1.0;
  r.optimizer_seconds = m.optimizer_seconds_per_param * params / shard;
  // Gradients are reduced over DP × CP (f32, ring: 2(n − 1)/n of them on the wire).
  r.dp_comm_seconds = dp_cp > 1.0 ? 4.0 * params * 2.0 * (dp_cp - 1.0) / dp_cp / (r.dp_spans_nodes ? inter : intra) : 0.0;
  r.step_seconds = (micro + static_cast<double>(l.pp - 1)) * per_micro + r.optimizer_seconds + r.dp_comm_seconds;
  return r;
}

}  // namespace gale
