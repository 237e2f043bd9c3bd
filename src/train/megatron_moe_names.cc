// Megatron-Core's expert layouts (SequentialMLP, TEGroupedMLP, GroupedMLP, torch_dist) -> Gale's per-expert global names.
#include "train/megatron_moe_names.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "train/checkpoint_args.h"
#include "train/megatron_dist_checkpoint.h"

namespace gale {

namespace {

bool all_digits(const std::string& s) { return !s.empty() && std::all_of(s.begin(), s.end(), ::isdigit); }

// "decoder.layers.<i>.mlp.experts.<rest>": the prefix up to "experts." and rest; false otherwise.
bool experts_entry(const std::string& key, std::string* prefix, std::string* rest) {
  static const std::string kLayers = "decoder.layers.", kExperts = ".mlp.experts.";
  if (key.rfind(kLayers, 0) != 0) return false;
  const size_t dot = key.find('.', kLayers.size());
  if (dot == std::string::npos || !all_digits(key.substr(kLayers.size(), dot - kLayers.size()))) return false;
  if (key.compare(dot, kExperts.size(), kExperts) != 0) return false;
  *prefix = key.substr(0, dot + kExperts.size());
  *rest = key.substr(dot + kExperts.size());
  return true;
}

bool ends_with_extra_state(const std::string& s) {
  static const std::string kExtra = "_extra_state";
  return s.size() >= kExtra.size() && s.compare(s.size() - kExtra.size(), kExtra.size(), kExtra) == 0;
}

// A per-expert entry (what each expert-parallel rank's file holds of its own).
bool expert_entry(const std::string& key) { return key.find(".mlp.experts.local_experts.") != std::string::npos; }

std::string expert_key(const std::string& prefix, int64_t expert, const std::string& rest) {
  return str_cat(prefix, "local_experts.", expert, ".", rest);
}

// Expert `j`'s [rows, cols] piece of a grouped tensor whose memory is [n, cols, rows] (transposed back).
Tensor grouped_piece(const Tensor& t, int64_t n, int64_t j, int64_t cols) {
  const int64_t rows = t.numel() / n / cols, es = dtype_size(t.dtype());
  Tensor out = Tensor::empty({rows, cols}, t.dtype());
  const char* src = static_cast<const char*>(t.raw()) + j * rows * cols * es;
  char* dst = static_cast<char*>(out.raw());
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + (r * cols + c) * es, src + (c * rows + r) * es, es);
  return out;
}

}  // namespace

Status globalize_megatron_experts(PyValue& sd, int64_t ep_rank, int64_t local_experts, const std::string& where) {
  if (sd.kind != PyValue::kDict) return Status::Ok();
  const int64_t first = ep_rank * local_experts;
  std::vector<std::pair<PyRef, PyRef>> out;
  out.reserve(sd.entries.size());
  auto add = [&](const std::string& key, PyRef v) { out.emplace_back(PyValue::str(key), std::move(v)); };
  for (auto& [k, v] : sd.entries) {
    std::string prefix, rest;
    if (k->kind != PyValue::kString || !experts_entry(k->s, &prefix, &rest)) {
      out.emplace_back(k, v);
      continue;
    }
    const bool tensor = v->kind == PyValue::kTensor;
    const std::string& key = k->s;
    auto check_local = [&](int64_t j) -> Status {
      if (j < local_experts) return Status::Ok();
      return DataLoss(where, ": tensor '", key, "' is local expert ", j, ", expected fewer than the ", local_experts,
                      " experts of each expert-parallel rank (args num_experts / expert_model_parallel_size)");
    };
    if (rest.rfind("local_experts.", 0) == 0) {  // SequentialMLP: local_experts.<j>.<linear>
      const size_t dot = rest.find('.', 14);
      const std::string j = rest.substr(14, dot == std::string::npos ? std::string::npos : dot - 14);
      if (!all_digits(j) || dot == std::string::npos)
        return DataLoss(where, ": tensor '", key, "': expected mlp.experts.local_experts.<expert>.<name>");
      GALE_RETURN_IF_ERROR(check_local(std::stoll(j)));
      add(expert_key(prefix, first + std::stoll(j), rest.substr(dot + 1)), v);
      continue;
    }
    if (rest.rfind("experts.", 0) == 0) {  // torch_dist: [E, ...] of all experts
      if (ends_with_extra_state(rest)) continue;
      if (!tensor || v->data.ndim() < 1 || v->data.shape()[0] != local_experts)
        return DataLoss(where, ": tensor '", key, "' of shape ", tensor ? v->data.shape_string() : v->type_name(),
                        ": expected the ", local_experts, " experts stacked along its first dimension");
      for (int64_t e = 0; e < local_experts; ++e)
        add(expert_key(prefix, first + e, rest.substr(8)), PyValue::tensor(slice0(v->data, e)));
      continue;
    }
    if (rest == "weight1" || rest == "weight2") {  // GroupedMLP: [H, El * rows] / [El * Fe, H]
      if (!tensor || v->data.ndim() != 2)
        return DataLoss(where, ": tensor '", key, "': expected GroupedMLP's 2-D ", rest, ", found ",
                        tensor ? v->data.shape_string() : v->type_name());
      const Tensor& t = v->data;
      const bool fc1 = rest == "weight1";
      const int64_t split = fc1 ? t.shape()[1] : t.shape()[0];
      if (split % local_experts)
        return DataLoss(where, ": tensor '", key, "' of shape ", t.shape_string(), ": ", split,
                        " does not split into the ", local_experts, " local experts");
      for (int64_t j = 0; j < local_experts; ++j) {
        // weight1's memory is [El, H, rows]: expert j's fc1 [rows, H] is its [H, rows] block transposed;
        // weight2's is [El, Fe, H]: fc2 [H, Fe] is the [Fe, H] block transposed.
        const int64_t cols = fc1 ? t.shape()[0] : t.shape()[0] / local_experts;
        add(expert_key(prefix, first + j, fc1 ? "linear_fc1.weight" : "linear_fc2.weight"),
            PyValue::tensor(grouped_piece(t, local_experts, j, cols)));
      }
      continue;
    }
    // TEGroupedMLP: linear_fc1.weight<j>, linear_fc2.bias<j>, ... (_extra_state kept as is: skipped later)
    bool grouped = false;
    for (const char* linear : {"linear_fc1.", "linear_fc2."})
      for (const char* what : {"weight", "bias"}) {
        const std::string stem = std::string(linear) + what;
        if (grouped || rest.rfind(stem, 0) != 0 || !all_digits(rest.substr(stem.size()))) continue;
        const int64_t j = std::stoll(rest.substr(stem.size()));
        GALE_RETURN_IF_ERROR(check_local(j));
        add(expert_key(prefix, first + j, stem), v);
        grouped = true;
      }
    if (!grouped) out.emplace_back(k, v);  // anything else: left for the caller to refuse or skip
  }
  sd.entries = std::move(out);
  return Status::Ok();
}

bool megatron_moe_tensor(const std::string& rest) {
  static const std::set<std::string> kFixed = {
      "mlp.router.weight",           "mlp.router.bias",             "mlp.router.expert_bias",
      "mlp.router.qb_beta",
      "mlp.shared_experts.linear_fc1.weight",
      "mlp.shared_experts.linear_fc1.bias", "mlp.shared_experts.linear_fc2.weight", "mlp.shared_experts.linear_fc2.bias",
      "mlp.shared_experts.gate_weight"};
  if (kFixed.count(rest)) return true;
  static const std::string kExpert = "mlp.experts.local_experts.";
  if (rest.rfind(kExpert, 0) != 0) return false;
  const size_t dot = rest.find('.', kExpert.size());
  if (dot == std::string::npos || !all_digits(rest.substr(kExpert.size(), dot - kExpert.size()))) return false;
  const std::string tail = rest.substr(dot + 1);
  return tail == "linear_fc1.weight" || tail == "linear_fc1.bias" || tail == "linear_fc2.weight" ||
         tail == "linear_fc2.bias";
}

Status check_megatron_experts(const std::map<std::string, Tensor>& tensors, const MoeArgs& moe, int64_t num_layers,
                              const std::string& where) {
  std::map<int64_t, std::set<int64_t>> found;  // layer -> experts with an fc1 weight
  static const std::string kLayers = "decoder.layers.", kExpert = ".mlp.experts.local_experts.";
  for (const auto& [name, t] : tensors) {
    const size_t at = name.find(kExpert);
    if (name.rfind(kLayers, 0) != 0 || at == std::string::npos) continue;
    const int64_t layer = std::stoll(name.substr(kLayers.size(), at - kLayers.size()));
    const size_t dot = name.find('.', at + kExpert.size());
    const int64_t e = std::stoll(name.substr(at + kExpert.size(), dot - at - kExpert.size()));
    if (!moe.enabled() || e >= moe.num_experts)
      return DataLoss(where, ": tensor '", name, "' is expert ", e, " but args num_experts = ",
                      moe.enabled() ? moe.num_experts : 0);
    if (layer >= num_layers || moe.layer_pattern.at(static_cast<size_t>(layer)) == 0)
      return DataLoss(where, ": tensor '", name, "': layer ", layer, " is not a MoE layer (args moe_layer_freq ",
                      moe.moe_layer_freq, ")");
    if (name.compare(dot + 1, std::string::npos, "linear_fc1.weight") == 0) found[layer].insert(e);
  }
  if (!moe.enabled()) return Status::Ok();
  for (int64_t i = 0; i < num_layers; ++i) {
    if (moe.layer_pattern.at(static_cast<size_t>(i)) == 0) continue;
    if (!tensors.count(str_cat(kLayers, i, ".mlp.router.weight")))
      return DataLoss(where, ": MoE layer ", i, " has no mlp.router.weight");
    for (int64_t e = 0; e < moe.num_experts; ++e)
      for (const char* w : {"linear_fc1.weight", "linear_fc2.weight"})
        if (!tensors.count(str_cat(kLayers, i, kExpert, e, ".", w)))
          return DataLoss(where, ": MoE layer ", i, " has no ", w, " of expert ", e, " (args num_experts = ",
                          moe.num_experts, "; found experts ", found[i].size(), ")");
  }
  return Status::Ok();
}

Status check_megatron_moe_run(const MoeArgs& saved, const MoeArgs& run, const std::string& dir) {
  auto differ = [&](const char* flag, const std::string& theirs, const std::string& ours) {
    return FailedPrecondition(dir, ": Megatron's checkpoint was saved with ", flag, " ", theirs, ", this run has ", ours);
  };
  auto size = [](int64_t v) { return v == kUnset || v <= 0 ? std::string("None") : std::to_string(v); };
  if (saved.enabled() != run.enabled() || (saved.enabled() && saved.num_experts != run.num_experts))
    return differ("--num-experts", size(saved.num_experts), size(run.num_experts));
  if (!saved.enabled()) return Status::Ok();
  if (saved.moe_ffn_hidden_size != run.moe_ffn_hidden_size)
    return differ("--moe-ffn-hidden-size", size(saved.moe_ffn_hidden_size), size(run.moe_ffn_hidden_size));
  if (saved.layer_pattern != run.layer_pattern)
    return differ("--moe-layer-freq", saved.moe_layer_freq, run.moe_layer_freq);
  if (saved.moe_shared_expert_intermediate_size != run.moe_shared_expert_intermediate_size)
    return differ("--moe-shared-expert-intermediate-size", size(saved.moe_shared_expert_intermediate_size),
                  size(run.moe_shared_expert_intermediate_size));
  if (saved.moe_router_enable_expert_bias != run.moe_router_enable_expert_bias)
    return differ("--moe-router-enable-expert-bias", saved.moe_router_enable_expert_bias ? "on" : "off",
                  run.moe_router_enable_expert_bias ? "on" : "off");
  // quantile_balancing's persistent buffer mlp.router.qb_beta is in the checkpoint exactly when it was on.
  const bool saved_qb = saved.uses_load_balancing_type("quantile_balancing"),
             run_qb = run.uses_load_balancing_type("quantile_balancing");
  if (saved_qb != run_qb)
    return differ("--moe-router-load-balancing-type",
                  saved_qb ? "quantile_balancing (its mlp.router.qb_beta buffers)" : "other than quantile_balancing",
                  run_qb ? "quantile_balancing" : "another type");
  return Status::Ok();
}

nlohmann::json megatron_moe_args_json(nlohmann::json args, const PyValue* ns) {
  auto it = args.find("num_experts");
  if (it == args.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) return args;
  // moe_layer_freq: Megatron's int k or list [1, 0, ...] -> Gale's spelling ("1", "[1,0,...]").
  const PyValue* freq = ns ? ns->attr("moe_layer_freq") : nullptr;
  if (freq && freq->kind == PyValue::kInt) {
    args["moe_layer_freq"] = std::to_string(freq->i);
  } else if (freq && freq->kind == PyValue::kList) {
    std::string s = "[";
    for (size_t i = 0; i < freq->items.size(); ++i)
      s += (i ? "," : "") + std::to_string(freq->items[i]->kind == PyValue::kInt ? freq->items[i]->i : -1);
    args["moe_layer_freq"] = s + "]";
  } else if (!args.contains("moe_layer_freq")) {
    args["moe_layer_freq"] = "1";  // Megatron's default
  }
  if (args.contains("moe_shared_expert_intermediate_size") && !args.contains("moe_shared_expert_gate"))
    args["moe_shared_expert_gate"] = false;  // Megatron's shared experts have no gate flag
  if (!args.contains("moe_ffn_hidden_size") && args.contains("ffn_hidden_size"))
    args["moe_ffn_hidden_size"] = args["ffn_hidden_size"];  // Megatron's default (None)
  if (!args.contains("moe_router_pre_softmax")) args["moe_router_pre_softmax"] = false;
  return args;
}

StatusOr<MoeArgs> megatron_moe_args(const nlohmann::json& args, const std::string& where, int64_t num_layers) {
  GALE_ASSIGN_OR_RETURN(MoeArgs moe, moe_args_from_json(args, where, num_layers));
  if (!moe.enabled()) return moe;
  moe.moe_grouped_gemm = args.value("moe_grouped_gemm", false);
  return moe;
}

Status globalize_dist_experts(MegatronDistState& state, const std::string& where) {
  const PyValue* args = state.root->get("args");
  const PyValue* n = args ? args->attr("num_experts") : nullptr;
  if (n == nullptr || n->kind != PyValue::kInt || n->i <= 0) return Status::Ok();
  for (auto& [k, v] : state.root->entries)
    if (k->kind == PyValue::kString && k->s == "model") GALE_RETURN_IF_ERROR(globalize_megatron_experts(*v, 0, n->i, where));
  if (!state.optimizer) return Status::Ok();
  for (auto& [name, by_key] : state.optimizer->tensors) {  // the optimizer's tensors are named as the model's
    PyValue d;
    d.kind = PyValue::kDict;
    for (auto& [key, t] : by_key) d.entries.emplace_back(PyValue::str(key), PyValue::tensor(std::move(t)));
    GALE_RETURN_IF_ERROR(globalize_megatron_experts(d, 0, n->i, str_cat(where, " (optimizer state '", name, "')")));
    by_key.clear();
    for (auto& [key, t] : d.entries) by_key[key->s] = t->data;
  }
  return Status::Ok();
}

Status merge_expert_rank_files(const std::map<std::tuple<int64_t, int64_t, int64_t>, std::string>& files,
                               const std::map<std::tuple<int64_t, int64_t, int64_t>, PyRef>& roots,
                               const nlohmann::json& args, std::map<std::pair<int64_t, int64_t>, std::string>* merged_files,
                               std::map<std::pair<int64_t, int64_t>, PyRef>* merged_roots) {
  auto num = [&](const char* key, int64_t fallback) {
    auto it = args.find(key);
    return it != args.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
  };
  const int64_t num_experts = num("num_experts", 0), tp = num("tensor_model_parallel_size", 1),
                etp = num("expert_tensor_parallel_size", tp);
  if (num_experts > 0 && etp != tp && tp > 1)
    return Unimplemented(files.begin()->second, " (args): expert_tensor_parallel_size ", etp,
                         " with tensor_model_parallel_size ", tp, " in the torch format: not supported yet (expected "
                         "the experts split as the dense layers, expert_tensor_parallel_size = "
                         "tensor_model_parallel_size; save it with --ckpt-format torch_dist)");
  int64_t ep = 1;
  for (const auto& [rank, path] : files) ep = std::max(ep, std::get<2>(rank) + 1);
  if (num_experts > 0 && num_experts % ep)
    return DataLoss(files.begin()->second, ": args num_experts = ", num_experts, " does not split over the ", ep,
                    " expert-parallel ranks' files");
  if (num_experts <= 0 && ep > 1)
    return DataLoss(files.begin()->second, ": expert-parallel rank files (mp_rank_TT[_PPP]_EEE) of a model whose args "
                                           "have no num_experts");
  const int64_t local = num_experts > 0 ? num_experts / ep : 0;
  for (const auto& [rank, path] : files) {
    const auto [t, p, e] = rank;
    for (int64_t x = 0; x < ep; ++x)
      if (!files.count({t, p, x}))
        return NotFound(path, ": the file of expert-parallel rank ", x, " of tensor-parallel rank ", t,
                        ", pipeline rank ", p, " is missing for a checkpoint of ", ep, " expert-parallel ranks");
  }
  for (const auto& [rank, path] : files) {
    const auto [t, p, e] = rank;
    const PyValue& root = *roots.at(rank);
    if (e == 0) {  // expert rank 0's state, its chunks copied so that the others' experts join them
      PyRef copy = std::make_shared<PyValue>(root);
      for (auto& [k, v] : copy->entries)
        if (k->kind == PyValue::kString && k->s.rfind("model", 0) == 0 && v->kind == PyValue::kDict)
          v = std::make_shared<PyValue>(*v);
      (*merged_roots)[{t, p}] = copy;
      (*merged_files)[{t, p}] = path;
    }
  }
  for (const auto& [rank, path] : files) {
    const auto [t, p, e] = rank;
    PyValue& merged = *merged_roots->at({t, p});
    for (auto& [k, chunk] : merged.entries) {
      if (k->kind != PyValue::kString || k->s.rfind("model", 0) != 0 || chunk->kind != PyValue::kDict) continue;
      const PyValue* mine = roots.at(rank)->get(k->s);
      if (mine == nullptr || mine->kind != PyValue::kDict)
        return DataLoss(path, ": expected the state dict '", k->s, "' (as expert-parallel rank 0 has), found ",
                        mine ? mine->type_name() : std::string("none"));
      PyValue experts = *mine;
      GALE_RETURN_IF_ERROR(globalize_megatron_experts(experts, e, local, path));
      if (e == 0) {
        chunk->entries = std::move(experts.entries);
        continue;
      }
      for (auto& [name, v] : experts.entries)  // expert rank e contributes its experts only
        if (name->kind == PyValue::kString && expert_entry(name->s)) chunk->set(name->s, v);
    }
  }
  return Status::Ok();
}

Status check_megatron_moe_target(const MoeArgs& moe, int64_t tp, int64_t ep) {
  if (ep <= 0) return InvalidArgument("--target-expert-parallel-size: expected a positive integer, found ", ep);
  if (!moe.enabled()) {
    if (ep > 1)
      return InvalidArgument("--target-expert-parallel-size ", ep, ": the model has no experts (expected 1)");
    return Status::Ok();
  }
  if (moe.num_experts % ep)
    return InvalidArgument("--target-expert-parallel-size ", ep, ": expected it to divide the ", moe.num_experts,
                           " experts");
  if (moe.moe_ffn_hidden_size % tp ||
      (moe.moe_shared_expert_intermediate_size != kUnset && moe.moe_shared_expert_intermediate_size % tp))
    return InvalidArgument("--target-tensor-parallel-size ", tp, ": expected it to divide moe_ffn_hidden_size (",
                           moe.moe_ffn_hidden_size, ") and the shared expert's size (",
                           moe.moe_shared_expert_intermediate_size == kUnset ? 0
                                                                             : moe.moe_shared_expert_intermediate_size,
                           "): the experts are written split as the dense MLP (expert_tensor_parallel_size = TP)");
  if (moe.moe_shared_expert_gate)
    return Unimplemented("a shared expert gate (--moe-shared-expert-gate, Qwen2-MoE's shared_expert_gate): writing it "
                         "to Megatron's format is not supported (Megatron-Core's shared experts have no gate weight)");
  if (!unset(moe.moe_input_jitter_eps))
    return Unimplemented("--moe-input-jitter-eps: writing it to Megatron's format is not supported yet");
  return Status::Ok();
}

bool megatron_local_expert(const std::string& name, int64_t local_experts, int64_t* ep_rank, std::string* local) {
  static const std::string kExpert = ".mlp.experts.local_experts.";
  const size_t at = name.find(kExpert);
  if (at == std::string::npos || local_experts <= 0) return false;
  const size_t from = at + kExpert.size(), dot = name.find('.', from);
  if (dot == std::string::npos || !all_digits(name.substr(from, dot - from))) return false;
  const int64_t g = std::stoll(name.substr(from, dot - from));
  *ep_rank = g / local_experts;
  *local = str_cat(name.substr(0, from), g % local_experts, name.substr(dot));
  return true;
}

std::vector<std::string> megatron_extra_state_linears(const MoeArgs& moe, bool moe_layer, int64_t local_experts) {
  std::vector<std::string> out = {"self_attention.linear_qkv", "self_attention.linear_proj"};
  if (!moe_layer) {
    out.insert(out.end(), {"mlp.linear_fc1", "mlp.linear_fc2"});
    return out;
  }
  for (int64_t j = 0; j < local_experts; ++j)
    for (const char* linear : {"linear_fc1", "linear_fc2"}) out.push_back(str_cat("mlp.experts.local_experts.", j, ".", linear));
  if (moe.moe_shared_expert_intermediate_size != kUnset)
    out.insert(out.end(), {"mlp.shared_experts.linear_fc1", "mlp.shared_experts.linear_fc2"});
  return out;
}

void add_megatron_moe_args(const MoeArgs& moe, int64_t tp, int64_t ep, PyValue& ns) {
  ns.set("expert_model_parallel_size", PyValue::integer(ep));
  ns.set("expert_tensor_parallel_size", PyValue::integer(tp));
  if (!moe.enabled()) {
    ns.set("num_experts", PyValue::none());
    return;
  }
  ns.set("num_experts", PyValue::integer(moe.num_experts));
  ns.set("moe_router_topk", PyValue::integer(moe.moe_router_topk));
  ns.set("moe_ffn_hidden_size", PyValue::integer(moe.moe_ffn_hidden_size));
  if (all_digits(moe.moe_layer_freq)) {
    ns.set("moe_layer_freq", PyValue::integer(std::stoll(moe.moe_layer_freq)));
  } else {  // Megatron's parsed form of a pattern: one 0/1 per layer
    PyRef list = PyValue::list();
    for (int v : moe.layer_pattern) list->items.push_back(PyValue::integer(v));
    ns.set("moe_layer_freq", list);
  }
  ns.set("moe_router_pre_softmax", PyValue::boolean(moe.moe_router_pre_softmax));
  ns.set("moe_router_score_function", PyValue::str(moe.moe_router_score_function));
  ns.set("moe_router_enable_expert_bias", PyValue::boolean(moe.moe_router_enable_expert_bias));
  ns.set("moe_router_topk_scaling_factor", unset(moe.moe_router_topk_scaling_factor)
                                               ? PyValue::none()
                                               : PyValue::real(moe.moe_router_topk_scaling_factor));
  const bool groups = moe.moe_router_group_topk != kUnset;
  ns.set("moe_router_num_groups", groups ? PyValue::integer(moe.moe_router_num_groups) : PyValue::none());
  ns.set("moe_router_group_topk", groups ? PyValue::integer(moe.moe_router_group_topk) : PyValue::none());
  ns.set("moe_shared_expert_intermediate_size", moe.moe_shared_expert_intermediate_size == kUnset
                                                    ? PyValue::none()
                                                    : PyValue::integer(moe.moe_shared_expert_intermediate_size));
  ns.set("moe_grouped_gemm", PyValue::boolean(false));
  ns.set("moe_input_jitter_eps", PyValue::none());
  // Megatron's args hold one load-balancing type and coefficient as a str and a float, several as lists.
  if (moe.moe_router_load_balancing_types.empty()) {
    ns.set("moe_router_load_balancing_type", PyValue::str(moe.moe_router_load_balancing_type));
    ns.set("moe_aux_loss_coeff", PyValue::real(moe.moe_aux_loss_coeff));
  } else {
    PyRef types = PyValue::list(), coeffs = PyValue::list();
    for (const std::string& t : moe.moe_router_load_balancing_types) types->items.push_back(PyValue::str(t));
    for (double c : moe.moe_aux_loss_coeffs) coeffs->items.push_back(PyValue::real(c));
    ns.set("moe_router_load_balancing_type", types);
    ns.set("moe_aux_loss_coeff", coeffs);
  }
  if (moe.uses_load_balancing_type("quantile_balancing"))  // Megatron main's TransformerConfig field
    ns.set("moe_router_quantile_balancing_ema", PyValue::real(moe.moe_router_quantile_balancing_ema));
}

}  // namespace gale
