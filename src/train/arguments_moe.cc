// The mixture-of-experts flags (Megatron names and defaults) and their checks.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "train/arguments.h"
#include "train/moe_upcycling.h"

namespace gale {

void add_moe_args(ArgParser& p, MoeArgs& a) {
  p.group("mixture of experts");
  p.add("--num-experts", &a.num_experts, "experts per MoE layer (E); 0 or unset: dense MLPs");
  p.add("--moe-router-topk", &a.moe_router_topk, "experts each token is routed to (k)");
  p.add_flag("--moe-use-upcycling", &a.moe_use_upcycling,
             "load the dense checkpoint in --load, copy each MLP into every expert of its layer (routers start "
             "afresh), save the MoE model to --save at iteration 1 and train it from iteration 0 (Megatron)");
  p.add("--moe-upcycling-granularity", &a.moe_upcycling_granularity,
        "granular upcycling: how many times smaller the experts' FFN hidden size is than the dense FFN's; the "
        "dense checkpoint has --ffn-hidden-size x this, each dense MLP is cut into this many expert slices; 1: "
        "every expert is a whole copy (Megatron)");
  p.add_list("--moe-aux-loss-coeff", &a.moe_aux_loss_coeffs,
             "load-balancing loss coefficient (0 disables it); with a list of load-balancing types, one per type",
             "0.0");
  p.add("--moe-z-loss-coeff", &a.moe_z_loss_coeff, "router z-loss coefficient (unset disables it)");
  p.add_choice_list("--moe-router-load-balancing-type", &a.moe_router_load_balancing_types,
                    {"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "quantile_balancing", "none"},
                    "aux_loss (Switch-style load-balancing loss per micro-batch), seq_aux_loss (the same per "
                    "sequence, averaged; DeepSeek's), global_aux_loss (the same with the token counts of the "
                    "global batch so far: summed over TP x DP x CP and averaged over the step's micro-batches), "
                    "sinkhorn (S-BASE: training chooses the top-k of the Sinkhorn-balanced logits of each "
                    "micro-batch's local tokens; no aux loss), quantile_balancing (Megatron main's QB: the top-k "
                    "of the logits minus a per-expert bias qb_beta, moved after every step to the column quantile "
                    "that gives each expert tokens*topk/experts; no aux loss) or none; or a list of aux_loss, "
                    "seq_aux_loss, global_aux_loss and none, whose losses add up, each with its --moe-aux-loss-coeff",
                    "aux_loss");
  p.add("--moe-router-quantile-balancing-ema", &a.moe_router_quantile_balancing_ema,
        "quantile_balancing: qb_beta = ema * qb_beta + (1 - ema) * the step's mean quantile, then centred; "
        "0 (default): the latest quantile only");
  p.add_choice("--moe-router-score-function", &a.moe_router_score_function, {"softmax", "sigmoid"},
               "router score function: softmax, or sigmoid (the top-k of sigmoid(logits), weights normalised "
               "to sum 1 when top-k > 1)");
  p.add_flag("--moe-router-pre-softmax", &a.moe_router_pre_softmax,
             "softmax over all experts before the top-k (no renormalisation); default: top-k of the logits, "
             "softmax over the k selected");
  p.add("--moe-router-topk-scaling-factor", &a.moe_router_topk_scaling_factor,
        "multiplies the routing weights of the top-k experts; unset: 1");
  p.add_flag("--moe-router-enable-expert-bias", &a.moe_router_enable_expert_bias,
             "aux-loss-free load balancing: a per-expert bias added to the sigmoid scores for the top-k choice, "
             "moved after every step towards balance (needs --moe-router-score-function sigmoid)");
  p.add("--moe-router-bias-update-rate", &a.moe_router_bias_update_rate,
        "step of the expert-bias update: bias += rate * sign(mean count - count)");
  p.add("--moe-router-num-groups", &a.moe_router_num_groups,
        "group-limited routing: the experts in this many equal groups (with --moe-router-group-topk)");
  p.add("--moe-router-group-topk", &a.moe_router_group_topk,
        "group-limited routing: the groups each token may use (the best by the sum of their top-k/group-topk scores)");
  p.add("--moe-expert-capacity-factor", &a.moe_expert_capacity_factor,
        "token dropping: each expert keeps at most ceil(tokens*topk/experts*factor) of a micro-batch's local "
        "tokens; unset or negative: dropless");
  p.add_choice("--moe-token-drop-policy", &a.moe_token_drop_policy, {"probs", "position"},
               "which pairs an expert over capacity keeps: the largest routing weights (probs) or the earliest tokens");
  p.add_flag("--moe-pad-expert-input-to-capacity", &a.moe_pad_expert_input_to_capacity,
             "pad every expert's input to its capacity with weight-0 rows (needs --moe-expert-capacity-factor)");
  p.add_choice("--moe-token-dispatcher-type", &a.moe_token_dispatcher_type, {"allgather", "alltoall", "flex", "alltoall_seq"},
               "token dispatcher; with one expert-parallel rank allgather and alltoall route identically; flex and "
               "alltoall_seq are not supported yet");
  p.add_flag("--moe-grouped-gemm", &a.moe_grouped_gemm,
             "accepted: Gale always runs each expert's GEMMs on its gathered token rows (OpTable gemm)");
  p.add("--moe-ffn-hidden-size", &a.moe_ffn_hidden_size, "expert FFN hidden size; default --ffn-hidden-size");
  p.add("--moe-layer-freq", &a.moe_layer_freq,
        "MoE layers: int k (layer i is MoE iff i % k == 0) or a list such as \"[1,0,1,1]\" or \"([0]+[1]*3)\"");
  p.add("--expert-tensor-parallel-size", &a.expert_tensor_parallel_size,
        "tensor-parallel size of the experts; default --tensor-model-parallel-size (1 or the default)");
  p.add_flag("--moe-tp-extend-ep", &a.moe_tp_extend_ep,
             "MindSpeed: the TP ranks split the experts instead of their weights (= --expert-tensor-parallel-size 1 "
             "with expert-parallel size TP x --expert-model-parallel-size); needs alltoall, --moe-grouped-gemm, "
             "--moe-permutation-async-comm and no --moe-expert-capacity-factor");
  p.add_flag("--fix-router", &a.fix_router,
             "MindSpeed: route pair j of local token t to expert (t*topk + j) mod E (a balanced load for "
             "benchmarking; the routing weights still come from the real top-k); needs --expert-model-parallel-size > 1");
  p.add_flag("--moe-permutation-async-comm", &a.moe_permutation_async_comm,
             "accepted (MindSpeed overlaps the allgather dispatcher's permutation all-gathers; required with "
             "--moe-tp-extend-ep and --moe-alltoall-overlap-comm); no effect in Gale");
  p.add("--moe-shared-expert-intermediate-size", &a.moe_shared_expert_intermediate_size,
        "total FFN size of the shared experts every MoE layer adds to the routed ones (needs --disable-bias-linear)");
  p.add("--n-shared-experts", &a.n_shared_experts,
        "MindSpeed: K shared experts of --ffn-hidden-size each, i.e. --moe-shared-expert-intermediate-size "
        "K x --ffn-hidden-size (not together with it; 0: none)");
  p.add_flag("--moe-shared-expert-gate", &a.moe_shared_expert_gate,
             "gate the shared expert's output per token: sigmoid(x·gate_weightᵀ)");
  p.add_flag("--moe-shared-expert-overlap", &a.moe_shared_expert_overlap,
             "run the shared expert while the all-to-all dispatcher's exchange is in flight (needs alltoall)");
  p.add("--moe-input-jitter-eps", &a.moe_input_jitter_eps,
        "multiply the router's input (not the experts') by noise ~ U(1-eps, 1+eps), in training and evaluation; "
        "the noise comes from Gale's Philox streams keyed by layer and global token (the same for every "
        "parallel layout), not from torch's generator, so its values differ from Megatron's");
  p.add_flag("--moe-router-force-load-balancing", &a.moe_router_force_load_balancing,
             "benchmark only: replace the router's logits by N(0, 1) values (gradient straight through), drawn "
             "from Gale's Philox streams keyed by seed, layer, global token and expert (the same for every "
             "parallel layout and rerun), not from torch's generator, so its values differ from Megatron's");
}

namespace {

// One term of a Megatron layer-pattern expression: "[a,b,...]" optionally followed by "*n".
Status parse_pattern_term(const std::string& term, std::vector<int>* out) {
  const size_t open = term.find('['), close = term.find(']');
  if (open != 0 || close == std::string::npos) return InvalidArgument("'", term, "' is not a [..] list");
  std::vector<int> items;
  std::string item;
  for (size_t i = open + 1; i <= close; ++i) {
    const char ch = term[i];
    if (ch == ',' || ch == ']') {
      if (item.empty()) {
        if (ch == ']' && items.empty()) break;
        return InvalidArgument("empty element in '", term, "'");
      }
      if (item != "0" && item != "1") return InvalidArgument("element '", item, "' is not 0 or 1");
      items.push_back(item == "1" ? 1 : 0);
      item.clear();
    } else {
      item += ch;
    }
  }
  int64_t repeat = 1;
  const std::string rest = term.substr(close + 1);
  if (!rest.empty()) {
    if (rest[0] != '*' || rest.size() < 2) return InvalidArgument("'", rest, "' after a list: expected *<count>");
    for (size_t i = 1; i < rest.size(); ++i)
      if (!std::isdigit(static_cast<unsigned char>(rest[i]))) return InvalidArgument("'", rest, "' is not *<count>");
    repeat = std::stoll(rest.substr(1));
  }
  for (int64_t r = 0; r < repeat; ++r) out->insert(out->end(), items.begin(), items.end());
  return Status::Ok();
}

// MindSpeed's --n-shared-experts K (MoESharedExpertsFeature.pre_validate_args): K shared experts of
// --ffn-hidden-size each become Megatron's --moe-shared-expert-intermediate-size K·ffn; 0 (falsy)
// means none; both flags together are refused, as MindSpeed, even when they agree.
Status resolve_n_shared_experts(Arguments& a, const ArgParser& p) {
  MoeArgs& m = a.moe;
  const int64_t K = m.n_shared_experts;
  if (!p.was_set("--n-shared-experts") || K == 0) return Status::Ok();
  if (K < 0) return InvalidArgument("--n-shared-experts: expected a non-negative integer, found ", K);
  if (m.moe_shared_expert_intermediate_size != kUnset)
    return InvalidArgument("--n-shared-experts ", K, " cannot be used with --moe-shared-expert-intermediate-size ",
                           m.moe_shared_expert_intermediate_size, " (as MindSpeed): give one of them");
  m.moe_shared_expert_intermediate_size = K * a.model.ffn_hidden_size;
  return Status::Ok();
}

// The shared expert's flags (Megatron's rules: a positive size, no biases; the gate only with it).
Status validate_shared_expert_args(const Arguments& a, const ArgParser& p) {
  const MoeArgs& m = a.moe;
  const int64_t Fs = m.moe_shared_expert_intermediate_size, tp = a.parallel.tensor_model_parallel_size;
  if (Fs == kUnset) {
    for (const char* flag : {"--moe-shared-expert-gate", "--moe-shared-expert-overlap"})
      if (p.was_set(flag))
        return InvalidArgument(flag, " needs --moe-shared-expert-intermediate-size (a shared expert), found none");
    return Status::Ok();
  }
  if (Fs <= 0)
    return InvalidArgument("--moe-shared-expert-intermediate-size: expected a positive integer, found ", Fs);
  if (a.model.add_bias_linear)
    return InvalidArgument("--moe-shared-expert-intermediate-size: expected --disable-bias-linear (the shared "
                           "experts have no biases, as in Megatron), found the linear biases on");
  if (Fs % tp != 0)
    return InvalidArgument("--moe-shared-expert-intermediate-size ", Fs,
                           ": expected a multiple of --tensor-model-parallel-size ", tp);
  if (m.moe_shared_expert_overlap && m.moe_token_dispatcher_type != "alltoall")
    return InvalidArgument("--moe-shared-expert-overlap: expected --moe-token-dispatcher-type alltoall (the overlap "
                           "hides the shared expert behind its exchange, as Megatron), found ",
                           m.moe_token_dispatcher_type);
  return Status::Ok();
}

// A sum of terms, each a [..] list or a parenthesised sum, either optionally followed by "*n"
// (Megatron's Python list expressions such as "([1]*3+[0])*2").
Status parse_pattern_sum(const std::string& v, std::vector<int>* out) {
  size_t start = 0;
  while (start <= v.size()) {
    size_t end = start;
    int depth = 0;
    for (; end < v.size(); ++end) {
      if (v[end] == '(') ++depth;
      if (v[end] == ')') --depth;
      if (v[end] == '+' && depth == 0) break;
    }
    const std::string term = v.substr(start, end - start);
    if (!term.empty() && term[0] == '(') {
      const size_t close = term.rfind(')');
      if (close == std::string::npos) return InvalidArgument("unbalanced '(' in '", term, "'");
      std::vector<int> inner;
      GALE_RETURN_IF_ERROR(parse_pattern_sum(term.substr(1, close - 1), &inner));
      const std::string rest = term.substr(close + 1);
      int64_t repeat = 1;
      if (!rest.empty()) {
        if (rest[0] != '*' || rest.size() < 2 ||
            !std::all_of(rest.begin() + 1, rest.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); }))
          return InvalidArgument("'", rest, "' after a group: expected *<count>");
        repeat = std::stoll(rest.substr(1));
      }
      for (int64_t r = 0; r < repeat; ++r) out->insert(out->end(), inner.begin(), inner.end());
    } else {
      GALE_RETURN_IF_ERROR(parse_pattern_term(term, out));
    }
    start = end + 1;
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<int>> parse_moe_layer_freq(const std::string& value, int64_t num_layers) {
  return parse_layer_pattern("--moe-layer-freq", value, num_layers, [](int64_t k, int64_t i) { return i % k == 0; });
}

StatusOr<std::vector<int>> parse_layer_pattern(const char* flag, const std::string& value, int64_t num_layers,
                                               bool (*every)(int64_t k, int64_t i)) {
  std::string v;
  for (char ch : value)
    if (!std::isspace(static_cast<unsigned char>(ch))) v += ch;
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(flag, ": expected an integer >= 1 or a list of ", num_layers,
                           " zeros and ones, found '", value, "' (", why, ")");
  };
  std::vector<int> pattern;
  if (!v.empty() && std::all_of(v.begin(), v.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); })) {
    const int64_t k = std::stoll(v);
    if (k < 1) return bad("not positive");
    for (int64_t i = 0; i < num_layers; ++i) pattern.push_back(every(k, i) ? 1 : 0);
    return pattern;
  }
  const Status st = parse_pattern_sum(v, &pattern);
  if (!st.ok()) return bad(st.message());
  if (static_cast<int64_t>(pattern.size()) != num_layers)
    return bad(str_cat(pattern.size(), " entries for --num-layers ", num_layers));
  return pattern;
}

Status validate_moe_router_args(MoeArgs& m) {
  if (!unset(m.moe_router_topk_scaling_factor) && !(m.moe_router_topk_scaling_factor > 0.0))
    return InvalidArgument("--moe-router-topk-scaling-factor: expected a positive number, found ",
                           m.moe_router_topk_scaling_factor);
  // Megatron: the expert bias only with the sigmoid score function.
  if (m.moe_router_enable_expert_bias && m.moe_router_score_function != "sigmoid")
    return InvalidArgument("--moe-router-enable-expert-bias: expected --moe-router-score-function sigmoid, found ",
                           m.moe_router_score_function);
  if (!(m.moe_router_bias_update_rate >= 0.0))
    return InvalidArgument("--moe-router-bias-update-rate: expected a non-negative number, found ",
                           m.moe_router_bias_update_rate);
  const int64_t E = m.num_experts, k = m.moe_router_topk;
  if (m.moe_router_group_topk != kUnset) {
    const int64_t G = m.moe_router_num_groups, g = m.moe_router_group_topk;
    if (G == kUnset)
      return InvalidArgument("--moe-router-group-topk ", g, ": expected --moe-router-num-groups too, found it unset");
    if (G < 1 || E % G != 0)
      return InvalidArgument("--moe-router-num-groups: expected a divisor of --num-experts ", E, ", found ", G);
    if (g < 1 || g > G)
      return InvalidArgument("--moe-router-group-topk: expected 1 to --moe-router-num-groups ", G, ", found ", g);
    if (g > k)  // each chosen group's score sums its top k/g experts: at least one
      return InvalidArgument("--moe-router-group-topk: expected at most --moe-router-topk ", k, ", found ", g);
    if (g * (E / G) < k)
      return InvalidArgument("--moe-router-group-topk ", g, ": expected groups holding at least --moe-router-topk ", k,
                             " experts, found ", g * (E / G));
  } else if (m.moe_router_num_groups != kUnset && m.moe_router_num_groups < 1) {
    return InvalidArgument("--moe-router-num-groups: expected a positive integer, found ", m.moe_router_num_groups);
  }
  if (!unset(m.moe_expert_capacity_factor) && m.moe_expert_capacity_factor < 0.0)
    m.moe_expert_capacity_factor = kUnsetF;  // Megatron: a negative factor means None
  if (!unset(m.moe_expert_capacity_factor) && m.moe_expert_capacity_factor == 0.0)
    return InvalidArgument("--moe-expert-capacity-factor: expected a positive number (or negative: dropless), found 0");
  if (m.moe_pad_expert_input_to_capacity && unset(m.moe_expert_capacity_factor))
    return InvalidArgument("--moe-pad-expert-input-to-capacity: expected --moe-expert-capacity-factor too, found it unset");
  return Status::Ok();
}

// --moe-router-load-balancing-type sinkhorn: Megatron asserts a zero aux-loss coefficient; its
// sinkhorn routing has fixed scores (model/moe_router.h), so the router options it would ignore are
// refused here rather than ignored.
Status validate_sinkhorn_args(const MoeArgs& m) {
  constexpr const char* kWhat = "--moe-router-load-balancing-type sinkhorn";
  if (m.moe_aux_loss_coeff != 0.0)
    return InvalidArgument(kWhat, ": expected --moe-aux-loss-coeff 0 (sinkhorn routing has no load-balancing loss), "
                           "found ", m.moe_aux_loss_coeff);
  const char* ignored = m.moe_router_score_function != "softmax"   ? "--moe-router-score-function sigmoid"
                        : m.moe_router_pre_softmax                  ? "--moe-router-pre-softmax"
                        : !unset(m.moe_router_topk_scaling_factor)  ? "--moe-router-topk-scaling-factor"
                        : m.moe_router_group_topk != kUnset         ? "--moe-router-group-topk"
                        : m.moe_router_enable_expert_bias           ? "--moe-router-enable-expert-bias"
                                                                    : nullptr;
  if (ignored)
    return InvalidArgument(kWhat, " with ", ignored, ": expected neither (sinkhorn routing scores with sigmoid for "
                           "top-1, else softmax over all experts, unscaled, without groups or expert bias; Megatron "
                           "ignores ", ignored, " there)");
  return Status::Ok();
}

// --moe-router-load-balancing-type quantile_balancing: Megatron main's assertions (aux losses off,
// no group-limited routing, tokens·k divisible by E in a training micro-batch gathered over TP×CP)
// and k < E (its dual update takes the top-(k+1) of each token).
Status validate_quantile_balancing_args(const Arguments& a) {
  const MoeArgs& m = a.moe;
  constexpr const char* kWhat = "--moe-router-load-balancing-type quantile_balancing";
  if (m.moe_aux_loss_coeff != 0.0)
    return InvalidArgument(kWhat, ": expected --moe-aux-loss-coeff 0 (quantile balancing balances with its bias "
                           "qb_beta; Megatron asserts the aux losses off), found ", m.moe_aux_loss_coeff);
  if (m.moe_router_num_groups != kUnset || m.moe_router_group_topk != kUnset)
    return InvalidArgument(kWhat, " with ",
                           m.moe_router_num_groups != kUnset ? "--moe-router-num-groups" : "--moe-router-group-topk",
                           ": expected no group-limited routing (Megatron's quantile balancing does not support it)");
  const int64_t E = m.num_experts, k = m.moe_router_topk;
  if (k >= E)
    return InvalidArgument(kWhat, ": expected --moe-router-topk below --num-experts ", E,
                           " (the dual update takes each token's top-(k+1)), found ", k);
  const int64_t S = a.model.seq_length, mbs = a.training.micro_batch_size;
  if (S > 0 && mbs > 0 && (S * mbs * k) % E != 0)
    return InvalidArgument(kWhat, ": expected the routed assignments of a micro-batch (--seq-length ", S,
                           " x --micro-batch-size ", mbs, " x --moe-router-topk ", k, " = ", S * mbs * k,
                           ") divisible by --num-experts ", E, ", found remainder ", (S * mbs * k) % E);
  return Status::Ok();
}

// Megatron's checks of --recompute-modules that involve the MoE flags (TransformerConfig).
Status validate_moe_recompute_modules(const Arguments& a) {
  const ModelArgs& model = a.model;
  if (model.recompute_granularity != "selective") return Status::Ok();
  const auto has = [&](const char* module) {
    return std::find(model.recompute_modules.begin(), model.recompute_modules.end(), module) !=
           model.recompute_modules.end();
  };
  if (has("moe_act") && !a.moe.moe_grouped_gemm)
    return InvalidArgument("--recompute-modules moe_act: expected --moe-grouped-gemm (Megatron supports it only with "
                           "grouped GEMM), found it off");
  if (has("shared_experts") && a.moe.moe_shared_expert_intermediate_size != kUnset && a.moe.moe_shared_expert_overlap)
    return InvalidArgument("--recompute-modules shared_experts: cannot work with --moe-shared-expert-overlap, found both");
  return Status::Ok();
}

namespace {

// MindSpeed's MoETpExtendEpFeature.validate_args, then the mapping: experts whole (expert TP 1),
// spread over TP x EP ranks (expert_grid_ep_size).
Status validate_moe_tp_extend_ep(Arguments& a) {
  MoeArgs& m = a.moe;
  const ParallelArgs& par = a.parallel;
  const int64_t tp = par.tensor_model_parallel_size, ep = par.expert_model_parallel_size;
  if (m.num_experts % (tp * ep) != 0)
    return InvalidArgument("--moe-tp-extend-ep: expected --num-experts ", m.num_experts,
                           " divisible by --tensor-model-parallel-size ", tp, " x --expert-model-parallel-size ", ep,
                           " = ", tp * ep);
  if (!m.moe_permutation_async_comm || !m.moe_grouped_gemm)
    return InvalidArgument("--moe-tp-extend-ep needs --moe-permutation-async-comm and --moe-grouped-gemm (as MindSpeed), "
                           "found ", m.moe_permutation_async_comm ? "" : "no --moe-permutation-async-comm",
                           !m.moe_permutation_async_comm && !m.moe_grouped_gemm ? " and " : "",
                           m.moe_grouped_gemm ? "" : "no --moe-grouped-gemm");
  if (!unset(m.moe_expert_capacity_factor) && m.moe_expert_capacity_factor >= 0.0)
    return InvalidArgument("--moe-tp-extend-ep: expected no --moe-expert-capacity-factor (dropless, as MindSpeed), found ",
                           m.moe_expert_capacity_factor);
  if (m.moe_token_dispatcher_type != "alltoall")
    return InvalidArgument("--moe-tp-extend-ep: expected --moe-token-dispatcher-type alltoall (as MindSpeed), found ",
                           m.moe_token_dispatcher_type);
  if (m.expert_tensor_parallel_size != kUnset && m.expert_tensor_parallel_size != 1)
    return InvalidArgument("--moe-tp-extend-ep: expected --expert-tensor-parallel-size 1 or unset (the experts are not "
                           "split), found ", m.expert_tensor_parallel_size);
  const int64_t grid = tp * ep * par.pipeline_model_parallel_size;
  if (par.world_size % grid != 0)
    return InvalidArgument("--moe-tp-extend-ep: world size ", par.world_size,
                           " is not divisible by --tensor-model-parallel-size ", tp, " x --expert-model-parallel-size ",
                           ep, " x --pipeline-model-parallel-size ", par.pipeline_model_parallel_size, " = ", grid);
  m.expert_tensor_parallel_size = 1;
  return Status::Ok();
}

}  // namespace

int64_t expert_grid_ep_size(const Arguments& a) {
  return a.parallel.expert_model_parallel_size * (a.moe.moe_tp_extend_ep ? a.parallel.tensor_model_parallel_size : 1);
}

// Megatron's --moe-use-upcycling (train/moe_upcycling.h): the flags its upcycling needs, and its
// checks on the granularity, the FFN sizes, the number of experts and the activation.
static Status validate_moe_upcycling(const Arguments& a) {
  const MoeArgs& m = a.moe;
  if (a.checkpoint.save.empty()) return InvalidArgument("When using upcycling, the --save option must be specified.");
  if (a.checkpoint.load.empty())
    return InvalidArgument("--moe-use-upcycling needs --load (the dense checkpoint to upcycle), found none");
  if (m.moe_shared_expert_intermediate_size != kUnset)
    return Unimplemented("--moe-use-upcycling with --moe-shared-expert-intermediate-size: not supported yet (the "
                         "dense MLP is copied into the routed experts only, as in Megatron)");
  if (a.lora.enabled()) return Unimplemented("--moe-use-upcycling with --lora-target-modules: not supported yet");
  return make_upcycling_plan(a).status();
}

double MoeArgs::aux_loss_coeff(const std::string& type) const {
  if (moe_router_load_balancing_types.empty()) return moe_router_load_balancing_type == type ? moe_aux_loss_coeff : 0.0;
  for (size_t i = 0; i < moe_router_load_balancing_types.size() && i < moe_aux_loss_coeffs.size(); ++i)
    if (moe_router_load_balancing_types[i] == type) return moe_aux_loss_coeffs[i];
  return 0.0;
}

bool MoeArgs::uses_load_balancing_type(const std::string& type) const {
  const std::vector<std::string>& list = moe_router_load_balancing_types;
  return list.empty() ? moe_router_load_balancing_type == type : std::find(list.begin(), list.end(), type) != list.end();
}

namespace {

std::string joined(const std::vector<std::string>& values) {
  std::string s;
  for (const std::string& v : values) s += (s.empty() ? "" : " ") + v;
  return s;
}

// The list forms of --moe-router-load-balancing-type and --moe-aux-loss-coeff (Megatron's nargs='+'):
// a one-element list becomes the scalar (Megatron's validate_args), a longer one stays a list and
// must pair each type with a coefficient (Megatron's TransformerConfig assertion). A list holding
// sinkhorn (which Megatron then ignores: its routing compares the list with "sinkhorn") or one type
// twice (Megatron uses the first one's coefficient) is refused rather than silently changed.
Status normalize_load_balancing_lists(MoeArgs& m) {
  std::vector<std::string>& types = m.moe_router_load_balancing_types;
  std::vector<double>& coeffs = m.moe_aux_loss_coeffs;
  if (types.size() == 1) {
    m.moe_router_load_balancing_type = types.front();
    types.clear();
  }
  if (coeffs.size() == 1) {
    m.moe_aux_loss_coeff = coeffs.front();
    coeffs.clear();
  }
  if (types.empty()) {
    if (!coeffs.empty())
      return InvalidArgument("--moe-aux-loss-coeff: expected one value with --moe-router-load-balancing-type ",
                             m.moe_router_load_balancing_type, ", found ", coeffs.size());
    return Status::Ok();
  }
  if (coeffs.size() != types.size())
    return InvalidArgument("--moe-aux-loss-coeff: expected a list of the same length as --moe-router-load-balancing-type ",
                           joined(types), " (", types.size(), " values), found ", coeffs.empty() ? 1 : coeffs.size());
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != "aux_loss" && types[i] != "seq_aux_loss" && types[i] != "global_aux_loss" && types[i] != "none")
      return InvalidArgument("--moe-router-load-balancing-type ", joined(types),
                             ": expected a list of aux_loss, seq_aux_loss, global_aux_loss or none (Megatron routes a "
                             "list with ", types[i], " in it as plain top-k), found ", types[i]);
    for (size_t j = 0; j < i; ++j)
      if (types[j] == types[i] && types[i] != "none")
        return InvalidArgument("--moe-router-load-balancing-type ", joined(types), ": expected each type once (Megatron "
                               "would use the first one's coefficient), found ", types[i], " twice");
    if (!(coeffs[i] >= 0.0))
      return InvalidArgument("--moe-aux-loss-coeff: expected non-negative numbers, found ", coeffs[i]);
  }
  return Status::Ok();
}

}  // namespace

Status validate_moe_args(Arguments& a, const ArgParser& p) {
  MoeArgs& m = a.moe;
  GALE_RETURN_IF_ERROR(validate_moe_recompute_modules(a));
  if (m.num_experts == 0) m.num_experts = kUnset;  // Megatron: 0 means None
  const int64_t ep = a.parallel.expert_model_parallel_size;
  if (!m.enabled() && ep > 1)
    return InvalidArgument("--expert-model-parallel-size ", ep, " needs --num-experts (a MoE model), found no --num-experts");
  if (!m.enabled() && m.moe_use_upcycling)
    return InvalidArgument("--moe-use-upcycling needs --num-experts (the MoE model to upcycle into), found no "
                           "--num-experts");
  if (!m.enabled()) {
    if (m.num_experts != kUnset) return InvalidArgument("--num-experts: expected a positive integer, found ", m.num_experts);
    for (const char* flag : {"--moe-router-topk", "--moe-aux-loss-coeff", "--moe-z-loss-coeff", "--moe-ffn-hidden-size",
                             "--moe-layer-freq", "--moe-grouped-gemm", "--moe-router-pre-softmax",
                             "--moe-router-score-function", "--moe-router-topk-scaling-factor",
                             "--moe-router-enable-expert-bias", "--moe-router-num-groups", "--moe-router-group-topk",
                             "--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity",
                             "--moe-shared-expert-intermediate-size", "--n-shared-experts", "--moe-shared-expert-gate",
                             "--moe-shared-expert-overlap", "--moe-input-jitter-eps", "--moe-tp-extend-ep", "--fix-router",
                             "--moe-router-force-load-balancing"})
      if (p.was_set(flag)) return InvalidArgument(flag, " needs --num-experts (a MoE model), found no --num-experts");
    return Status::Ok();
  }
  GALE_RETURN_IF_ERROR(normalize_load_balancing_lists(m));
  const ParallelArgs& par = a.parallel;
  if (m.moe_router_topk < 1 || m.moe_router_topk > m.num_experts)
    return InvalidArgument("--moe-router-topk: expected 1 to --num-experts ", m.num_experts, ", found ", m.moe_router_topk);
  if (!(m.moe_aux_loss_coeff >= 0.0))
    return InvalidArgument("--moe-aux-loss-coeff: expected a non-negative number, found ", m.moe_aux_loss_coeff);
  if (!unset(m.moe_z_loss_coeff) && !(m.moe_z_loss_coeff >= 0.0))
    return InvalidArgument("--moe-z-loss-coeff: expected a non-negative number, found ", m.moe_z_loss_coeff);
  // (a list holds only aux_loss, seq_aux_loss, global_aux_loss and none: checked above)
  const std::string lb = m.moe_router_load_balancing_types.empty() ? m.moe_router_load_balancing_type : "aux_loss";
  if (!(m.moe_router_quantile_balancing_ema >= 0.0 && m.moe_router_quantile_balancing_ema <= 1.0))
    return InvalidArgument("--moe-router-quantile-balancing-ema: expected a number in [0, 1], found ",
                           m.moe_router_quantile_balancing_ema);
  if (lb == "sinkhorn") GALE_RETURN_IF_ERROR(validate_sinkhorn_args(m));
  if (lb == "quantile_balancing") GALE_RETURN_IF_ERROR(validate_quantile_balancing_args(a));
  GALE_RETURN_IF_ERROR(validate_moe_router_args(m));
  if (!unset(m.moe_input_jitter_eps) && !(m.moe_input_jitter_eps >= 0.0 && m.moe_input_jitter_eps < 1.0))
    return InvalidArgument("--moe-input-jitter-eps: expected a number in [0, 1), found ", m.moe_input_jitter_eps);
  const std::string& disp = m.moe_token_dispatcher_type;
  if (disp != "allgather" && disp != "alltoall")
    return Unimplemented("--moe-token-dispatcher-type ", disp, ": not supported yet (allgather or alltoall)");
  if (m.moe_pad_expert_input_to_capacity && disp == "allgather" && ep > 1)
    return Unimplemented("--moe-pad-expert-input-to-capacity with --moe-token-dispatcher-type allgather and "
                         "--expert-model-parallel-size ", ep, ": not supported yet (use alltoall)");
  if (ep > 1 && m.num_experts % ep != 0)
    return InvalidArgument("--num-experts ", m.num_experts, " must be divisible by --expert-model-parallel-size ", ep);
  if (m.moe_ffn_hidden_size == kUnset) m.moe_ffn_hidden_size = a.model.ffn_hidden_size;
  if (m.moe_ffn_hidden_size <= 0)
    return InvalidArgument("--moe-ffn-hidden-size: expected a positive integer, found ", m.moe_ffn_hidden_size);
  if (a.model.is_hybrid_model) {
    GALE_ASSIGN_OR_RETURN(m.layer_pattern, hybrid_moe_layer_pattern(a, p));
  } else {
    GALE_ASSIGN_OR_RETURN(m.layer_pattern, parse_moe_layer_freq(m.moe_layer_freq, a.model.num_layers));
  }
  if (m.moe_use_upcycling) GALE_RETURN_IF_ERROR(validate_moe_upcycling(a));
  const int64_t tp = par.tensor_model_parallel_size;
  // Megatron asserts sequence parallelism for MoE under TP (training/arguments.py).
  if (tp > 1 && !par.sequence_parallel)
    return InvalidArgument("--num-experts with --tensor-model-parallel-size ", tp,
                           ": expected --sequence-parallel (MoE under TP routes each rank's own tokens), found it off");
  if (m.moe_tp_extend_ep) GALE_RETURN_IF_ERROR(validate_moe_tp_extend_ep(a));
  if (m.fix_router && ep <= 1)  // MindSpeed's MoEFixRouterFeature.validate_args
    return InvalidArgument("--fix-router: expected --expert-model-parallel-size greater than 1 (as MindSpeed), found ", ep);
  if (m.expert_tensor_parallel_size == kUnset) m.expert_tensor_parallel_size = tp;
  const int64_t etp = m.expert_tensor_parallel_size;
  if (etp != tp && etp != 1)
    return Unimplemented("--expert-tensor-parallel-size ", etp,
                         " with --num-experts: not supported yet (expected 1 or --tensor-model-parallel-size ", tp, ")");
  if (m.moe_ffn_hidden_size % etp != 0)
    return InvalidArgument("--moe-ffn-hidden-size ", m.moe_ffn_hidden_size,
                           ": expected a multiple of --expert-tensor-parallel-size ", etp);
  GALE_RETURN_IF_ERROR(resolve_n_shared_experts(a, p));
  return validate_shared_expert_args(a, p);
}

}  // namespace gale
