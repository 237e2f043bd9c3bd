// Megatron's optimizer state in legacy torch-format rank files (and their distrib_optim.pt) -> model-space tensors.
#include "train/megatron_torch_optimizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include "ckpt/safetensors_dtype.h"
#include "ckpt/torch_file.h"
#include "train/megatron_bucket_optimizer.h"
#include "train/megatron_moe_names.h"
#include "train/megatron_tp_split.h"

namespace gale {

namespace {

namespace fs = std::filesystem;

const char kOutWay[] = "pass --no-load-optim (or --finetune) to load the model weights and iteration only";
const char kEmbedding[] = "embedding.word_embeddings.weight";
const char kOutput[] = "output_layer.weight";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool flag_on(const PyValue* args, const char* name) {
  const PyValue* v = args ? args->attr(name) : nullptr;
  return v && v->kind == PyValue::kBool && v->b;
}

int64_t int_attr(const PyValue* args, const char* name, int64_t fallback) {
  const PyValue* v = args ? args->attr(name) : nullptr;
  return v && v->kind == PyValue::kInt ? v->i : fallback;
}

const PyValue* int_key(const PyValue& d, int64_t key) {
  for (const auto& [k, v] : d.entries)
    if (k->kind == PyValue::kInt && k->i == key) return v.get();
  return nullptr;
}

StatusOr<Tensor> to_f32(const Tensor& t, const std::string& what) {
  if (t.dtype() == DType::kF32) return t.clone();
  Tensor f = Tensor::empty(t.shape(), DType::kF32);
  GALE_RETURN_IF_ERROR(convert_elements(st_dtype_of(t.dtype()), t.raw(), DType::kF32, f.raw(), t.numel(), what));
  return f;
}

const char kLayers[] = "decoder.layers.";

// The layer number of "decoder.layers.<i>.<rest>" (-1 for other names); `rest` gets what follows it.
int64_t layer_of(const std::string& key, std::string* rest = nullptr) {
  const size_t n = sizeof(kLayers) - 1;
  if (key.rfind(kLayers, 0) != 0) return -1;
  const size_t dot = key.find('.', n);
  const std::string digits = key.substr(n, dot - n);
  if (digits.empty() || dot == std::string::npos || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  if (rest) *rest = key.substr(dot + 1);
  return std::stoll(digits);
}

// `key` with its layer number moved by `offset` (other names as they are).
std::string shifted(const std::string& key, int64_t offset) {
  std::string rest;
  const int64_t i = layer_of(key, &rest);
  return i < 0 ? key : str_cat(kLayers, i + offset, ".", rest);
}

// One model chunk of a rank file: 'model', or with virtual pipeline chunks 'model0', 'model1', ...
struct RankChunk {
  std::map<std::string, Tensor> model;  // parameters only (no _extra_state), the file's names
  std::vector<std::string> saved_order;  // their order in the saved state dict (the modules' registration order)
  int64_t layers = 0;                   // the chunk's layers (numbered from 0 in the file)
};

// One rank file: its model chunks (torch-format names, local shapes) and what it says about the run.
struct RankFile {
  std::string path;
  const PyValue* root = nullptr;
  const PyValue* args = nullptr;
  std::vector<RankChunk> chunks;
  std::map<std::string, Tensor> model;  // every chunk's parameters, at their global layer numbers (set by the caller)
};

StatusOr<RankFile> rank_file(const std::string& path, const PyValue& root) {
  RankFile r;
  r.path = path;
  r.root = &root;
  r.args = root.get("args");
  std::vector<const PyValue*> models;
  if (const PyValue* model = root.get("model")) {
    models.push_back(model);
  } else {
    while (const PyValue* chunk = root.get(str_cat("model", models.size()))) models.push_back(chunk);
  }
  if (models.empty())
    return DataLoss(path, ": expected Megatron's 'model' (or 'model0', ...) state dict, found none; ", kOutWay);
  for (size_t v = 0; v < models.size(); ++v) {
    if (models[v]->kind != PyValue::kDict)
      return DataLoss(path, ": model chunk ", v, ": expected a state dict, found ", models[v]->type_name(), "; ",
                      kOutWay);
    RankChunk c;
    for (const auto& [k, x] : models[v]->entries) {
      if (k->kind != PyValue::kString || ends_with(k->s, "_extra_state") || x->kind != PyValue::kTensor) continue;
      c.model[k->s] = x->data;
      c.saved_order.push_back(k->s);
      c.layers = std::max<int64_t>(c.layers, layer_of(k->s) + 1);
    }
    r.chunks.push_back(std::move(c));
  }
  return r;
}

// Megatron's rule for the parameters without weight decay (wd_mult 0): biases and 1-D tensors, with
// apply_wd_to_qk_layernorm the q/k layernorms excepted.
bool no_weight_decay(const std::string& key, const Shape& shape, bool wd_on_qk_norm) {
  if (wd_on_qk_norm && (key.find("q_layernorm.") != std::string::npos || key.find("k_layernorm.") != std::string::npos))
    return false;
  return ends_with(key, ".bias") || shape.size() == 1;
}

// A per-parameter state tensor of shape `shape` (`what` names it).
StatusOr<Tensor> state_tensor(const PyValue& v, const Shape& shape, const std::string& what) {
  if (v.kind != PyValue::kTensor) return DataLoss(what, ": expected a tensor, found ", v.type_name(), "; ", kOutWay);
  if (v.data.shape() != shape)
    return DataLoss(what, " has shape ", v.data.shape_string(), ": expected the parameter's ", shape_string(shape),
                    " (the parameter order Gale rebuilt is not the saving run's); ", kOutWay);
  return to_f32(v.data, what);
}

// The non-distributed optimizers' state of one rank: torch's {'state', 'param_groups'} (inside
// Float16OptimizerWithFloat16Params's 'optimizer', with its 'fp32_from_fp16_params').
// `experts`: the expert optimizer of Megatron's ChainedOptimizer (its param groups marked is_expert_parallel).
Status read_non_distributed(const RankFile& r, const PyValue& opt, const std::vector<MegatronBucketParam>& order,
                            MegatronRankState* out, std::set<int64_t>* steps, bool experts = false) {
  const std::string where = r.path + " (optimizer)";
  const PyValue* masters = opt.get("fp32_from_fp16_params");
  const PyValue* inner = masters ? opt.get("optimizer") : &opt;
  if (inner == nullptr || inner->kind != PyValue::kDict || !inner->get("param_groups") || !inner->get("state"))
    return DataLoss(where, ": expected torch's optimizer state dict {'state', 'param_groups'}", masters ? " under "
                    "'optimizer' (Float16OptimizerWithFloat16Params)" : "", "; ", kOutWay);
  const PyValue& groups = *inner->get("param_groups");
  const PyValue& state = *inner->get("state");
  if (groups.kind != PyValue::kList || state.kind != PyValue::kDict)
    return DataLoss(where, ": expected 'param_groups' a list and 'state' a dict, found ", groups.type_name(), " and ",
                    state.type_name(), "; ", kOutWay);
  // The rank's parameters by weight-decay class, in model order.
  const bool qk = flag_on(r.args, "apply_wd_to_qk_layernorm");
  std::vector<const MegatronBucketParam*> by_class[2];  // [0] decayed, [1] not
  for (const MegatronBucketParam& q : order) by_class[no_weight_decay(q.key, q.shape, qk) ? 1 : 0].push_back(&q);
  bool seen[2] = {false, false};
  std::map<int64_t, const MegatronBucketParam*> by_index;
  std::vector<std::vector<const MegatronBucketParam*>> group_params;
  for (size_t g = 0; g < groups.items.size(); ++g) {
    const PyValue& group = *groups.items[g];
    const PyValue* wd = group.kind == PyValue::kDict ? group.get("wd_mult") : nullptr;
    const PyValue* params = group.kind == PyValue::kDict ? group.get("params") : nullptr;
    if (wd == nullptr || (wd->kind != PyValue::kFloat && wd->kind != PyValue::kInt) || params == nullptr ||
        params->kind != PyValue::kList)
      return DataLoss(where, ": param group ", g, ": expected Megatron's 'wd_mult' and torch's 'params' list; ",
                      kOutWay);
    const double wd_mult = wd->kind == PyValue::kFloat ? wd->f : static_cast<double>(wd->i);
    const int c = wd_mult == 0 ? 1 : 0;
    if (experts) {  // the expert optimizer's groups are the expert parameters'
      const PyValue* v = group.get("is_expert_parallel");
      if (v == nullptr || v->kind != PyValue::kBool || !v->b)
        return DataLoss(where, ": param group ", g, " of the expert optimizer (the second of Megatron's "
                        "ChainedOptimizer) is not marked is_expert_parallel: expected the expert parameters' groups; ",
                        kOutWay);
    }
    for (const char* extra : {"lr_mult", "is_expert_parallel", "is_decoupled_lr"}) {
      if (experts && std::string(extra) == "is_expert_parallel") continue;
      const PyValue* v = group.get(extra);
      const bool other = v && ((v->kind == PyValue::kFloat && v->f != 1.0 && std::string(extra) == "lr_mult") ||
                               (v->kind == PyValue::kBool && v->b));
      if (other)
        return Unimplemented(where, ": param group ", g, " has ", extra, " set: Megatron's param groups other than "
                             "the two of weight decay on / off (--decoupled-lr, lr multipliers, expert parameters) "
                             "are not supported yet; ", kOutWay);
    }
    if (seen[c])
      return Unimplemented(where, ": two param groups with wd_mult ", wd_mult, ": Megatron's param groups other than "
                           "the two of weight decay on / off are not supported yet; ", kOutWay);
    seen[c] = true;
    if (params->items.size() != by_class[c].size())
      return DataLoss(where, ": param group ", g, " (wd_mult ", wd_mult, ") lists ", params->items.size(),
                      " parameters: expected the ", by_class[c].size(), " ", c ? "biases and 1-D" : "other",
                      " parameters of this rank's model; ", kOutWay);
    for (size_t j = 0; j < params->items.size(); ++j) {
      if (params->items[j]->kind != PyValue::kInt)
        return DataLoss(where, ": param group ", g, ": expected parameter indices, found a ",
                        params->items[j]->type_name(), "; ", kOutWay);
      by_index[params->items[j]->i] = by_class[c][j];
    }
    group_params.push_back(by_class[c]);
  }
  for (int c = 0; c < 2; ++c)
    if (!seen[c] && !by_class[c].empty())
      return DataLoss(where, ": no param group with wd_mult ", c ? "0" : "1", " for the rank's ", by_class[c].size(),
                      " ", c ? "biases and 1-D" : "other", " parameters; ", kOutWay);
  GALE_ASSIGN_OR_RETURN(const int64_t group_step, megatron_optimizer_step(*inner, where));
  if (group_step > 0) steps->insert(group_step);
  for (const auto& [k, s] : state.entries) {
    if (k->kind != PyValue::kInt || s->kind != PyValue::kDict)
      return DataLoss(where, ": 'state': expected {param index: {state: tensor}}, found a key ", k->type_name(), "; ",
                      kOutWay);
    auto p = by_index.find(k->i);
    if (p == by_index.end())
      return DataLoss(where, ": state of parameter index ", k->i, ", which no param group lists; ", kOutWay);
    const MegatronBucketParam& q = *p->second;
    for (const auto& [name, v] : s->entries) {
      if (name->kind != PyValue::kString) continue;
      if (name->s == "step") {  // torch's Adam keeps a step per parameter
        float x = 0;
        if (v->kind == PyValue::kTensor && v->data.numel() == 1 &&
            convert_elements(st_dtype_of(v->data.dtype()), v->data.raw(), DType::kF32, &x, 1, "step").ok())
          steps->insert(static_cast<int64_t>(x));
        else if (v->kind == PyValue::kInt) steps->insert(v->i);
        else if (v->kind == PyValue::kFloat) steps->insert(static_cast<int64_t>(v->f));
        continue;
      }
      GALE_ASSIGN_OR_RETURN(Tensor t, state_tensor(*v, q.shape, str_cat(where, ": '", name->s, "' of '", q.key, "'")));
      (*out)[name->s][{q.key, -1, -1}] = std::move(t);
    }
  }
  if (masters) {  // one list of fp32 master copies per param group, in the group's order
    if (masters->kind != PyValue::kList || masters->items.size() != group_params.size())
      return DataLoss(where, ": 'fp32_from_fp16_params': expected one list per param group (", group_params.size(),
                      "), found ", masters->kind == PyValue::kList ? str_cat(masters->items.size(), " lists")
                                                                    : masters->type_name(), "; ", kOutWay);
    for (size_t g = 0; g < group_params.size(); ++g) {
      const PyValue& list = *masters->items[g];
      if (list.kind != PyValue::kList || list.items.size() != group_params[g].size())
        return DataLoss(where, ": fp32_from_fp16_params[", g, "]: expected the group's ", group_params[g].size(),
                        " master copies, found ", list.kind == PyValue::kList ? std::to_string(list.items.size())
                                                                               : list.type_name(), "; ", kOutWay);
      for (size_t j = 0; j < list.items.size(); ++j) {
        const MegatronBucketParam& q = *group_params[g][j];
        GALE_ASSIGN_OR_RETURN(Tensor t, state_tensor(*list.items[j], q.shape,
                                                     str_cat(where, ": fp32_from_fp16_params[", g, "][", j, "] ('",
                                                             q.key, "')")));
        (*out)["fp32_param"][{q.key, -1, -1}] = std::move(t);
      }
    }
  }
  return Status::Ok();
}

// The distributed optimizer's distrib_optim.pt of one rank, cut by the buffer layout of the saved args.
// With virtual pipeline chunks `orders` holds each chunk's parameters: one buffer per chunk (keys 0, 1, ... of the file),
// bucketing disabled for the chunks after the first (training.get_model).
// With Megatron's ChainedOptimizer (MoE at EP > 1) the file holds its list [dense state or None, expert state or None]
// (ChainedOptimizer.save_parameter_state; each entry written by that optimizer's data-parallel rank 0): `chained` is the
// entry to read (-1: the file is one optimizer's dict).
Status read_distributed(const RankFile& r, const PyValue& opt, const std::vector<std::vector<MegatronBucketParam>>& orders,
                        MegatronRankState* out, std::set<int64_t>* steps, int64_t chained = -1) {
  const std::string where = r.path + " (optimizer)";
  const PyValue* inner = opt.get("optimizer");
  if (inner == nullptr || inner->kind != PyValue::kDict)
    return DataLoss(where, ": expected DistributedOptimizer.state_dict()'s {'optimizer': {'param_groups'}}; ", kOutWay);
  GALE_ASSIGN_OR_RETURN(const int64_t step, megatron_optimizer_step(*inner, where));
  if (step > 0) steps->insert(step);
  const std::string file = (fs::path(r.path).parent_path() / "distrib_optim.pt").string();
  if (!fs::exists(file))
    return NotFound(file, ": Megatron's args record use_distributed_optimizer, whose parameter state the legacy format "
                    "keeps in this file (save_parameter_state, written by data-parallel rank 0), but it is missing; ",
                    kOutWay);
  GALE_ASSIGN_OR_RETURN(PyRef state, read_torch_file(file));
  if (chained >= 0) {
    if (state->kind != PyValue::kList || state->items.size() != 2)
      return DataLoss(file, ": expected ChainedOptimizer.save_parameter_state's list [dense, expert] of "
                      "get_parameter_state_dp_zero dicts, found ", state->kind == PyValue::kList
                      ? str_cat("a list of ", state->items.size()) : state->type_name(), "; ", kOutWay);
    PyRef entry = state->items[static_cast<size_t>(chained)];
    if (entry->kind == PyValue::kNone)
      return DataLoss(file, ": holds no parameter state of the ", chained ? "expert" : "dense", " optimizer (None: "
                      "this rank was not its data-parallel rank 0), where Gale reads it from; ", kOutWay);
    state = entry;
  }
  if (state->kind != PyValue::kDict)
    return DataLoss(file, ": expected get_parameter_state_dp_zero's dict, found ", state->type_name(), "; ", kOutWay);
  const PyValue* coalesced = state->get("buckets_coalesced");
  if (coalesced == nullptr || coalesced->kind != PyValue::kBool || !coalesced->b)
    return Unimplemented(file, ": the distributed optimizer's older per-bucket parameter state (no "
                         "'buckets_coalesced': True): not supported yet (Megatron converts it with "
                         "--ckpt-convert-update-legacy-dist-opt-format); ", kOutWay);
  const int64_t buffers = static_cast<int64_t>(orders.size());
  if (int_key(*state, buffers) != nullptr)
    return Unimplemented(file, ": several gradient buffers (MoE expert parameters or several parameter dtypes): not "
                         "supported yet; ", kOutWay);
  for (int64_t v = 0; v < buffers; ++v) {
    int64_t num_parameters = 0;
    for (const MegatronBucketParam& q : orders[v]) num_parameters += q.numel;
    GALE_ASSIGN_OR_RETURN(int64_t bucket_size, megatron_saved_bucket_size(r.args, num_parameters, r.path));
    if (v > 0) bucket_size = 0;  // one bucket
    const MegatronBucketLayout layout = megatron_bucket_layout(orders[v], bucket_size);
    GALE_ASSIGN_OR_RETURN(MegatronRankState part,
                          megatron_split_dp_zero(state, layout, file, str_cat(file, ": Megatron's distributed optimizer "
                                                                                    "state", buffers > 1 ? str_cat(
                                                                                    ", model chunk ", v) : ""),
                                                 v, buffers));
    for (auto& [name, pieces] : part)
      for (auto& [at, t] : pieces) (*out)[name][at] = std::move(t);
  }
  return Status::Ok();
}

// The masters, rounded to the weights' dtype, must be the rank's saved weights (Megatron copies them into the model
// after each step): proof that the parameter order is the saving run's.
Status check_masters(const RankFile& r, const MegatronRankState& state) {
  auto masters = state.find("fp32_param");
  if (masters == state.end()) return Status::Ok();
  for (const auto& [at, m] : masters->second) {
    const Tensor& w = r.model.at(std::get<0>(at));
    if (w.dtype() == DType::kF32) continue;
    Tensor rounded = Tensor::empty(w.shape(), w.dtype());
    GALE_RETURN_IF_ERROR(convert_elements(st_dtype_of(DType::kF32), m.raw(), w.dtype(), rounded.raw(), m.numel(),
                                          std::get<0>(at)));
    const int64_t esize = dtype_size(w.dtype());
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < w.numel(); ++i)
      if (std::memcmp(static_cast<const char*>(rounded.raw()) + i * esize,
                      static_cast<const char*>(w.raw()) + i * esize, static_cast<size_t>(esize)) != 0) {
        if (first < 0) first = i;
        ++differ;
      }
    if (differ > 0)
      return DataLoss(r.path, ": the fp32 master copies Gale places at '", std::get<0>(at), "' are not its saved weights (",
                      differ, " of ", w.numel(), " elements differ, the first at flat index ", first,
                      "): the parameter order Gale rebuilt is not the saving run's; ", kOutWay);
  }
  return Status::Ok();
}

// Whether a torch-format name is a routed expert's (SequentialMLP's local_experts, GroupedMLP's weight1/2, TEGroupedMLP's
// linear_fc1/2.weight<j>): Megatron's expert parameters (the shared experts are dense).
bool expert_param(const std::string& key) { return key.find(".mlp.experts.") != std::string::npos; }

// The chunk's parameters in its saved state dict's order (torch's state_dict() and model.parameters() walk the modules in
// the same registration order), the router's buffers (expert_bias, qb_beta) left out; `which`: -1 every parameter, 0 the
// dense ones, 1 the experts'.
std::vector<MegatronBucketParam> saved_parameters(const RankChunk& chunk, int which) {
  std::vector<MegatronBucketParam> out;
  for (const std::string& key : chunk.saved_order) {
    if (ends_with(key, ".router.expert_bias") || ends_with(key, ".router.qb_beta")) continue;
    if (which >= 0 && expert_param(key) != (which == 1)) continue;
    const Tensor& w = chunk.model.at(key);
    out.push_back(MegatronBucketParam{key, -1, w.numel(), 0, 0, w.shape()});
  }
  return out;
}

// A MoE model's optimizer state of tensor rank `t`, pipeline rank `p` (expert TP = TP, one chunk, untied embeddings at
// PP > 1: checked by the caller; the TP pieces, experts' included, are merged by the caller as the weights; the stage's
// layers numbered from `layer_offset`),
// from each expert-parallel rank's file: at EP 1 one optimizer over every parameter (Megatron's expert parameters keep
// allreduce without expert parallelism, so get_megatron_optimizer builds no expert optimizer), at EP > 1 Megatron's
// ChainedOptimizer's list [dense, expert] in every file (the dense state read from expert rank 0's, each file's expert
// state over its own local experts). The experts are renumbered globally as the weights are (expert rank e's local
// expert j is expert e * E / EP + j). `scaler` gets the optimizer dict whose grad_scaler is the run's.
Status read_moe_rank(const MegatronExpertRankFiles& ex, int64_t t, int64_t p, int64_t num_experts, bool distributed,
                     int64_t layer_offset, MegatronRankState* out, std::set<int64_t>* steps, const PyValue** scaler) {
  int64_t ep = 0;
  for (const auto& [rank, path] : ex.files)
    if (std::get<0>(rank) == t && std::get<1>(rank) == p) ep = std::max(ep, std::get<2>(rank) + 1);
  if (ep == 0 || num_experts % ep != 0)
    return DataLoss("expert-parallel rank files of tensor rank ", t, ", pipeline rank ", p, ": found ", ep,
                    " for args.num_experts ", num_experts, "; ", kOutWay);
  const int64_t local_experts = num_experts / ep;
  for (int64_t e = 0; e < ep; ++e) {
    const std::string& path = ex.files.at({t, p, e});
    const PyValue& root = *ex.roots.at({t, p, e});
    GALE_ASSIGN_OR_RETURN(RankFile r, rank_file(path, root));
    const RankChunk& chunk = r.chunks[0];
    r.model = chunk.model;
    const PyValue* opt = root.get("optimizer");
    if (opt == nullptr || opt->kind == PyValue::kNone)
      return FailedPrecondition(path, ": Megatron's checkpoint holds no optimizer state (saved with --no-save-optim, "
                                "or not by a training run): ", kOutWay);
    MegatronRankState state;  // this file's pieces, its experts under their local numbers
    if (opt->kind == PyValue::kDict) {
      if (ep > 1)
        return DataLoss(path, ": 'optimizer' is one optimizer's state dict: expected Megatron's ChainedOptimizer list "
                        "[dense, expert] of a run with ", ep, " expert-parallel ranks (the expert parameters in an "
                        "optimizer of their own); ", kOutWay);
      std::vector<MegatronBucketParam> all = saved_parameters(chunk, -1);
      if (distributed) {
        GALE_RETURN_IF_ERROR(read_distributed(r, *opt, {all}, &state, steps));
      } else {
        GALE_RETURN_IF_ERROR(read_non_distributed(r, *opt, all, &state, steps));
      }
      *scaler = opt;
    } else if (opt->kind == PyValue::kList) {
      if (opt->items.size() != 2 || opt->items[0]->kind != PyValue::kDict || opt->items[1]->kind != PyValue::kDict)
        return DataLoss(path, ": 'optimizer': expected Megatron's ChainedOptimizer state, a list of the dense and the "
                        "expert optimizer's state dicts, found a list of ", opt->items.size(), "; ", kOutWay);
      const std::vector<MegatronBucketParam> dense = saved_parameters(chunk, 0), experts = saved_parameters(chunk, 1);
      if (e == 0) {  // the dense parameters' state: the same in every expert rank's file
        if (distributed) {
          GALE_RETURN_IF_ERROR(read_distributed(r, *opt->items[0], {dense}, &state, steps, 0));
        } else {
          GALE_RETURN_IF_ERROR(read_non_distributed(r, *opt->items[0], dense, &state, steps));
        }
        *scaler = opt->items[0].get();
      }
      if (distributed) {
        GALE_RETURN_IF_ERROR(read_distributed(r, *opt->items[1], {experts}, &state, steps, 1));
      } else {
        GALE_RETURN_IF_ERROR(read_non_distributed(r, *opt->items[1], experts, &state, steps, /*experts=*/true));
      }
    } else {
      return DataLoss(path, ": 'optimizer': expected Megatron's optimizer state dict or ChainedOptimizer's list, "
                      "found ", opt->type_name(), "; ", kOutWay);
    }
    GALE_RETURN_IF_ERROR(check_masters(r, state));
    for (auto& [name, pieces] : state) {  // local experts -> global, as the weights
      PyValue d;
      d.kind = PyValue::kDict;
      for (auto& [at, x] : pieces) d.entries.emplace_back(PyValue::str(std::get<0>(at)), PyValue::tensor(std::move(x)));
      GALE_RETURN_IF_ERROR(globalize_megatron_experts(d, e, local_experts, str_cat(path, " (optimizer state '", name,
                                                                                   "')")));
      for (auto& [k, v] : d.entries) (*out)[name][{shifted(k->s, layer_offset), -1, -1}] = v->data;
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<MegatronOptimizerState> read_megatron_torch_optimizer(
    const std::map<std::pair<int64_t, int64_t>, std::string>& files,
    const std::map<std::pair<int64_t, int64_t>, PyRef>& roots,
    const std::function<std::string(const std::string&, int64_t)>& gale_name, bool swiglu,
    const MegatronExpertRankFiles& experts) {
  int64_t tp = 1, pp = 1;
  for (const auto& [rank, path] : files) tp = std::max(tp, rank.first + 1), pp = std::max(pp, rank.second + 1);
  const std::string& first_path = files.at({0, 0});
  const PyValue* args = roots.at({0, 0})->get("args");
  const int64_t num_experts = int_attr(args, "num_experts", 0);
  const bool moe = num_experts > 0;
  if (moe && experts.files.empty())
    return Unimplemented(first_path, ": Megatron's optimizer state of a MoE model (args.num_experts ", num_experts,
                         ") in this format: not supported yet (Gale reads it from the legacy torch format's rank "
                         "files); ", kOutWay);
  if (moe && int_attr(args, "expert_tensor_parallel_size", tp) != tp)
    return Unimplemented(first_path, ": Megatron's optimizer state of a MoE model in the torch format saved at TP ", tp,
                         " with expert TP ", int_attr(args, "expert_tensor_parallel_size", tp), ": not supported yet "
                         "(Gale reads it with expert TP = TP); ", kOutWay);
  if (moe && pp > 1 && !flag_on(args, "untie_embeddings_and_output_weights"))
    return Unimplemented(first_path, ": Megatron's optimizer state of a MoE model with tied embeddings at PP ", pp,
                         " in the torch format: not supported yet; ", kOutWay);
  const bool mla = flag_on(args, "multi_latent_attention");
  const PyValue* impl = args ? args->attr("transformer_impl") : nullptr;
  if (impl == nullptr || impl->kind != PyValue::kString)
    return Unimplemented(first_path, ": Megatron's args record no transformer_impl, which sets the order of the "
                         "parameters in the optimizer; ", kOutWay);
  const bool distributed = flag_on(args, "use_distributed_optimizer");
  const bool tied = !flag_on(args, "untie_embeddings_and_output_weights");
  MegatronOptimizerState o;
  o.layout = distributed ? "dp_zero_gather_scatter" : "non-distributed";
  std::set<int64_t> steps;
  std::map<std::string, std::map<std::string, Tensor>> global;  // state -> Gale name -> merged tensor
  std::map<std::pair<int64_t, int64_t>, RankFile> ranks;
  for (const auto& [rank, path] : files) {
    GALE_ASSIGN_OR_RETURN(RankFile r, rank_file(path, *roots.at(rank)));
    ranks.emplace(rank, std::move(r));
  }
  // Virtual pipeline chunks: every rank holds as many; the global layers count chunk-major, then stage (chunk v of
  // pipeline rank p is virtual stage v * PP + p), each chunk numbering its layers from 0.
  const size_t chunks = ranks.at({0, 0}).chunks.size();
  if (moe && chunks > 1)
    return Unimplemented(first_path, ": Megatron's optimizer state of a MoE model with ", chunks, " virtual pipeline "
                         "chunks in the torch format: not supported yet; ", kOutWay);
  for (const auto& [rank, r] : ranks)
    if (r.chunks.size() != chunks)
      return DataLoss(r.path, ": holds ", r.chunks.size(), " model chunks: expected ", chunks, " as ", first_path,
                      "; ", kOutWay);
  std::map<std::pair<size_t, int64_t>, int64_t> chunk_offset;  // (chunk, pipeline rank) -> its first global layer
  for (size_t v = 0, at = 0; v < chunks; ++v)
    for (int64_t p = 0; p < pp; ++p) {
      chunk_offset[{v, p}] = static_cast<int64_t>(at);
      at += static_cast<size_t>(ranks.at({0, p}).chunks[v].layers);
    }
  for (int64_t p = 0; p < pp; ++p) {
    std::vector<MegatronRankState> stage;
    for (int64_t t = 0; t < tp; ++t) {
      const std::string& path = files.at({t, p});
      const PyValue& root = *roots.at({t, p});
      RankFile& r = ranks.at({t, p});
      const PyValue* opt = root.get("optimizer");
      if (opt == nullptr || opt->kind == PyValue::kNone)
        return FailedPrecondition(path, ": Megatron's checkpoint holds no optimizer state (saved with "
                                        "--no-save-optim, or not by a training run): ", kOutWay);
      if (opt->kind == PyValue::kList && !moe)
        return Unimplemented(path, ": the state of several optimizers (Megatron's ChainedOptimizer, e.g. with MoE "
                             "expert parameters or --optimizer lion): not supported yet in the torch format; ",
                             kOutWay);
      if (opt->kind != PyValue::kDict && !moe)
        return DataLoss(path, ": 'optimizer': expected Megatron's optimizer state dict, found ", opt->type_name());
      MegatronRankState local;
      const PyValue* scaler_of = opt;  // the optimizer dict with the run's grad_scaler
      if (moe) {
        GALE_RETURN_IF_ERROR(read_moe_rank(experts, t, p, num_experts, distributed, chunk_offset.at({0, p}), &local,
                                           &steps, &scaler_of));
      } else {
        // The rank's parameters: each chunk's in model.parameters() order, one chunk after the other (Megatron's
        // _get_param_groups walks the chunks in order), named with their global layer numbers.
        std::vector<MegatronBucketParam> order;
        std::vector<std::vector<MegatronBucketParam>> orders;  // per chunk (the distributed optimizer's buffers)
        for (size_t v = 0; v < chunks; ++v) {
          const RankChunk& chunk = r.chunks[v];
          std::map<std::string, Shape> shapes;
          for (const auto& [key, w] : chunk.model) shapes[key] = w.shape();
          MegatronModelRank rank;  // the chunk's own pieces and layers
          rank.first_stage = p == 0 && v == 0;
          rank.last_stage = p == pp - 1 && v + 1 == chunks;
          std::vector<MegatronBucketParam> part;
          if (mla) {  // model.parameters() lists the parameters as the saved state dict does (registration order)
            part = saved_parameters(chunk, -1);
          } else {
            GALE_ASSIGN_OR_RETURN(part, megatron_parameter_order(shapes, impl->s, chunk.layers, path, rank));
          }
          const int64_t offset = chunk_offset.at({v, p});
          for (MegatronBucketParam& q : part) {
            q.key = shifted(q.key, offset);
            // Tied at PP > 1: Megatron's shared_embedding, a bucket of its own in the distributed optimizer's buffer.
            if (tied && pp > 1) q.own_bucket = q.key == kEmbedding || q.key == kOutput;
            order.push_back(q);
          }
          orders.push_back(std::move(part));
          for (const auto& [key, w] : chunk.model) r.model[shifted(key, offset)] = w;
        }
        if (distributed) {
          GALE_RETURN_IF_ERROR(read_distributed(r, *opt, orders, &local, &steps));
        } else {
          GALE_RETURN_IF_ERROR(read_non_distributed(r, *opt, order, &local, &steps));
        }
        GALE_RETURN_IF_ERROR(check_masters(r, local));
      }
      if (const PyValue* g = scaler_of->get("grad_scaler"); g && g->kind == PyValue::kDict && o.grad_scaler.is_null()) {
        const nlohmann::json s = megatron_scalars_json(*g);
        o.grad_scaler = {{"scale", s.value("scale", 1.0)},
                         {"growth_tracker", s.value("growth_tracker", 0)},
                         {"hysteresis_tracker", s.value("hysteresis_tracker", 0)}};
      }
      stage.push_back(std::move(local));
    }
    // The stage's TP pieces merged, named with the global layer numbers.
    for (const auto& [state, pieces] : stage[0])
      for (const auto& [at, piece0] : pieces) {
        std::vector<Tensor> parts;
        for (int64_t t = 0; t < tp; ++t) {
          auto s = stage[t].find(state);
          if (s == stage[t].end() || !s->second.count(at))
            return DataLoss(files.at({t, p}), ": holds no '", state, "' state of '", std::get<0>(at),
                            "' (tensor-parallel rank 0 of its stage does); ", kOutWay);
          parts.push_back(s->second.at(at));
        }
        const std::string name = gale_name(std::get<0>(at), 0);  // global layer numbers already
        GALE_ASSIGN_OR_RETURN(Tensor whole, megatron_merge_tp(parts, megatron_split_of(name, swiglu), std::get<0>(at),
                                                              files.at({0, p})));
        if (tied && pp > 1 && name == kOutput) {  // the last stage's copy of the tied embedding: the same state
          const Tensor& e = global[state][kEmbedding];
          if (!e.defined() || e.numel() != whole.numel() ||
              std::memcmp(e.raw(), whole.raw(), static_cast<size_t>(whole.numel()) * sizeof(float)) != 0)
            return DataLoss(files.at({0, p}), ": the last pipeline stage's copy of the tied word embedding (its "
                            "output_layer.weight) holds another '", state, "' state than the first stage's "
                            "embedding: expected equal copies, as Megatron keeps them; ", kOutWay);
          continue;
        }
        global[state][name] = std::move(whole);
      }
  }
  if (steps.size() > 1)
    return Unimplemented(first_path, ": the optimizer's ranks, param groups or parameters record different steps (",
                         *steps.begin(), " and ", *steps.rbegin(), "): not supported (Megatron shares one step); ",
                         kOutWay);
  o.step = steps.empty() ? 0 : *steps.begin();
  const PyValue* sched = roots.at({0, 0})->get("opt_param_scheduler");
  if (sched == nullptr || sched->kind != PyValue::kDict)
    return DataLoss(first_path, ": expected Megatron's 'opt_param_scheduler' state dict next to the optimizer state "
                    "(Megatron's own load needs it too), found ", sched ? sched->type_name() : std::string("none"),
                    "; ", kOutWay);
  o.scheduler = megatron_scalars_json(*sched);
  const PyValue* type = args ? args->attr("optimizer") : nullptr;
  o.type = type && type->kind == PyValue::kString ? type->s
           : global.count("exp_avg_sq")             ? "adam"
           : global.count("momentum_buffer")        ? "sgd"
                                                    : "";
  if (o.type.empty())
    return DataLoss(first_path, ": Megatron's args record no 'optimizer' and the optimizer state has neither Adam's "
                    "exp_avg_sq nor SGD's momentum_buffer: ", kOutWay);
  o.tensors = std::move(global);
  return o;
}

}  // namespace gale
