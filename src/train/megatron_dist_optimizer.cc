// Megatron's optimizer state in a torch_dist checkpoint -> model-space global tensors, step and scheduler state.
#include "train/megatron_dist_optimizer.h"

#include <cstring>
#include <set>
#include <vector>

#include "ckpt/safetensors_dtype.h"
#include "train/megatron_bucket_optimizer.h"

namespace gale {

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

const char kOutWay[] = "pass --no-load-optim (or --finetune) to load the model weights and iteration only";

// The distributed optimizer's layouts that save its data-parallel buffers (megatron_bucket_optimizer.h).
bool bucket_layout(const std::string& layout) {
  return layout == "dp_reshardable" || layout == "dp_zero_gather_scatter";
}

// A Python scalar (or one-element tensor, as torch's Adam step and the loss scale are) as JSON; null otherwise.
nlohmann::json scalar_json(const PyValue& v) {
  switch (v.kind) {
    case PyValue::kBool: return v.b;
    case PyValue::kInt: return v.i;
    case PyValue::kFloat: return v.f;
    case PyValue::kString: return v.s;
    case PyValue::kTensor: {
      if (!v.data.defined() || v.data.numel() != 1) return nullptr;
      float x = 0;
      if (!convert_elements(st_dtype_of(v.data.dtype()), v.data.raw(), DType::kF32, &x, 1, "scalar").ok())
        return nullptr;
      return static_cast<double>(x);
    }
    default: return nullptr;
  }
}

// A dict of scalars (opt_param_scheduler, grad_scaler) as a JSON object.
nlohmann::json scalars_json(const PyValue& d) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : d.entries)
    if (k->kind == PyValue::kString) {
      nlohmann::json x = scalar_json(*v);
      if (!x.is_null()) j[k->s] = x;
    }
  return j;
}

// The optimizer steps taken: torch Adam's step, which Megatron saves as state['common_step'] (the
// non-distributed optimizers) or in every param group (the distributed optimizer); all must agree.
StatusOr<int64_t> step_of(const PyValue& inner, const std::string& where) {
  std::set<int64_t> steps;
  if (const PyValue* state = inner.get("state"); state && state->kind == PyValue::kDict)
    if (const PyValue* s = state->get("common_step")) {
      const nlohmann::json j = scalar_json(*s);
      if (!j.is_number())
        return DataLoss(where, ": optimizer.state.common_step: expected a number, found ", s->type_name());
      steps.insert(static_cast<int64_t>(j.get<double>()));
    }
  if (const PyValue* groups = inner.get("param_groups"); groups && groups->kind == PyValue::kList)
    for (const PyRef& g : groups->items)
      if (g->kind == PyValue::kDict)
        if (const PyValue* s = g->get("step")) {
          const nlohmann::json j = scalar_json(*s);
          if (j.is_number()) steps.insert(static_cast<int64_t>(j.get<double>()));
        }
  if (steps.size() > 1)
    return Unimplemented(where, ": the optimizer's param groups record different steps (", *steps.begin(), " and ",
                         *steps.rbegin(), "): not supported (Megatron shares one step); ", kOutWay);
  return steps.empty() ? int64_t{0} : *steps.begin();
}

// optimizer.state.<state>.<model key> tensors (fully_reshardable's "param" as "fp32_param") -> o->tensors, each
// as a global tensor of the model key's shape (the N-D flattened pieces reassembled).
Status read_model_space_states(const DcpCheckpoint& c, const std::string& dir, MegatronOptimizerState* o) {
  static const std::string kState = "optimizer.state.";
  for (const auto& [key, info] : c.tensors()) {
    if (!starts_with(key, kState)) continue;
    const size_t dot = key.find('.', kState.size());
    if (dot == std::string::npos)
      return DataLoss(dir, ": optimizer tensor '", key, "': expected optimizer.state.<state>.<key>");
    std::string state = key.substr(kState.size(), dot - kState.size());
    const std::string model_key = key.substr(dot + 1);
    if (state == "param") state = "fp32_param";  // fully_reshardable's name for the master copies
    auto m = c.tensors().find(model_key);
    if (m == c.tensors().end())
      return DataLoss(dir, ": optimizer tensor '", key, "' has no model tensor '", model_key, "' in the checkpoint");
    GALE_ASSIGN_OR_RETURN(Tensor t, c.read_tensor(key));
    if (t.shape() != m->second.shape) {
      GALE_ASSIGN_OR_RETURN(t, unflatten_model_space(t, m->second.shape, dir + ": optimizer tensor '" + key + "'"));
    }
    o->tensors[state][model_key] = std::move(t);
  }
  return Status::Ok();
}

// Why a distributed optimizer's Lion state is refused: Megatron main cannot save Lion through its DistributedOptimizer
// (the dp_reshardable / model-space layouts): validate_args turns --use-distributed-optimizer with any --optimizer but
// adam and sgd into the layer-wise distributed optimizer (use_distributed_optimizer False,
// use_layer_wise_distributed_optimizer True), whose chained layout Gale does not read.
const char kLionDistributed[] =
    "not supported (Megatron main never saves Lion through its DistributedOptimizer: with --optimizer lion, "
    "--use-distributed-optimizer becomes the layer-wise distributed optimizer, whose state Gale does not read yet; "
    "Gale reads Lion's state of the non-distributed optimizer); ";

// Megatron main's --optimizer lion without the distributed optimizer: a ChainedOptimizer [Lion, AdamW]
// (emerging_optimizers' Lion for the 2-D parameters but the word embedding and output layer, AdamW for the
// rest), each an FP32Optimizer or Float16OptimizerWithFloat16Params. Megatron's checkpointing passes
// chained_optim_avoid_prefix, so both sub-optimizers' tensors keep the plain optimizer.state.<state>.<key>
// names (Lion's exp_avg; AdamW's exp_avg and exp_avg_sq; fp32_param under --bf16), and common.pt's
// 'optimizer' is {0: Lion's state, 1: AdamW's}: the steps are AdamW's common_step (Lion keeps none). The
// distributed and layer-wise distributed optimizers' chained layouts (param_state_sharding_type,
// chained_<i>. keys) are refused.
StatusOr<MegatronOptimizerState> read_lion_chain(const DcpCheckpoint& c, const PyValue& common,
                                                 const std::vector<const PyValue*>& chained, const std::string& dir,
                                                 MegatronOptimizerState o) {
  const std::string where = dir + "/common.pt";
  for (const auto& [key, info] : c.tensors())
    if (starts_with(key, "chained_") || starts_with(key, "optimizer.distributed."))
      return Unimplemented(dir, ": Megatron's --optimizer lion state saved with a distributed optimizer (tensor '",
                           key, "'): ", kLionDistributed, kOutWay);
  std::set<int64_t> steps;
  for (size_t i = 0; i < chained.size(); ++i) {
    const PyValue* sub = chained[i];
    if (sub->kind != PyValue::kDict)
      return DataLoss(where, ": optimizer[", i, "]: expected a sub-optimizer's state dict, found ", sub->type_name());
    if (sub->get("param_state_sharding_type"))
      return Unimplemented(dir, ": Megatron's --optimizer lion state saved with a distributed optimizer "
                                "(optimizer[", i, "] has a param_state_sharding_type): ", kLionDistributed, kOutWay);
    const PyValue* inner = sub->get("optimizer");  // Float16OptimizerWithFloat16Params nests torch's dict
    if (inner == nullptr || inner->kind != PyValue::kDict) inner = sub;
    GALE_ASSIGN_OR_RETURN(const int64_t step, step_of(*inner, str_cat(where, " (optimizer[", i, "])")));
    if (step > 0) steps.insert(step);
    if (const PyValue* g = sub->get("grad_scaler"); g && g->kind == PyValue::kDict && o.grad_scaler.is_null()) {
      const nlohmann::json s = scalars_json(*g);
      o.grad_scaler = {{"scale", s.value("scale", 1.0)},
                       {"growth_tracker", s.value("growth_tracker", 0)},
                       {"hysteresis_tracker", s.value("hysteresis_tracker", 0)}};
    }
  }
  if (steps.size() > 1)
    return Unimplemented(where, ": the chained optimizers record different steps (", *steps.begin(), " and ",
                         *steps.rbegin(), "): not supported (Megatron synchronises them); ", kOutWay);
  o.step = steps.empty() ? 0 : *steps.begin();
  const PyValue* sched = common.get("opt_param_scheduler");
  if (sched == nullptr || sched->kind != PyValue::kDict)
    return DataLoss(where, ": expected Megatron's 'opt_param_scheduler' state dict next to the optimizer state "
                    "(Megatron's own load needs it too), found ", sched ? sched->type_name() : std::string("none"),
                    "; ", kOutWay);
  o.scheduler = scalars_json(*sched);
  GALE_RETURN_IF_ERROR(read_model_space_states(c, dir, &o));
  if (!o.tensors.count("exp_avg"))
    return FailedPrecondition(dir, ": Megatron's --optimizer lion checkpoint holds no optimizer.state.exp_avg.* "
                                   "tensors: ", kOutWay);
  o.type = "lion";
  return o;
}

// The torch-format type: args.optimizer, or (args without it) what the state names say: Adam's second moment, SGD's
// momentum; empty when neither.
std::string optimizer_type(const PyValue* type, const MegatronOptimizerState& o) {
  return type && type->kind == PyValue::kString ? type->s
         : o.tensors.count("exp_avg_sq")        ? "adam"
         : o.tensors.count("momentum_buffer")   ? "sgd"
                                                : "";
}

// Megatron's ChainedOptimizer (megatron/core/optimizer/__init__.py get_megatron_optimizer): the dense parameters'
// optimizer, then with MoE the expert parameters' one over the expert-data-parallel group (each a DistributedOptimizer,
// an FP32Optimizer or a Float16OptimizerWithFloat16Params). common.pt's 'optimizer' is {0: the dense one's non-sharded
// state, 1: the experts'}, each as that optimizer alone saves it. Megatron's checkpointing passes
// chained_optim_avoid_prefix, so in the model-space layouts (fully_sharded_model_space, fully_reshardable) and without
// the distributed optimizer the tensors keep the plain optimizer.state.<state>.<model key> names (each parameter
// belongs to one optimizer); the bucket-space layouts prefix each optimizer's buffers and objects with chained_<i>.
// (megatron_bucket_optimizer.h reads them for the MoE chain [dense, experts]).
// Steps are synchronised by Megatron (_synchronize_steps): they must agree.
StatusOr<MegatronOptimizerState> read_chain(const DcpCheckpoint& c, const PyValue& common,
                                            const std::vector<const PyValue*>& chained, const PyValue* args,
                                            const PyValue* type, const std::string& dir, MegatronOptimizerState o) {
  const std::string where = dir + "/common.pt";
  std::set<int64_t> steps;
  std::string layout;
  for (size_t i = 0; i < chained.size(); ++i) {
    const PyValue* sub = chained[i];
    const std::string at = str_cat(where, " (optimizer[", i, "])");
    if (sub->kind != PyValue::kDict)
      return DataLoss(at, ": expected a chained optimizer's state dict, found ", sub->type_name());
    std::string sub_layout = "non-distributed";
    if (const PyValue* t = sub->get("param_state_sharding_type")) {
      if (t->kind != PyValue::kString)
        return DataLoss(at, ": param_state_sharding_type: expected a string, found ", t->type_name());
      sub_layout = t->s;
    }
    if (i > 0 && sub_layout != layout)
      return DataLoss(where, ": the chained optimizers saved their state in different layouts ('", layout, "' and '",
                      sub_layout, "'): expected one (Megatron passes one sharding type to all); ", kOutWay);
    layout = sub_layout;
    const PyValue* experts = args ? args->attr("num_experts") : nullptr;
    if (bucket_layout(layout) && (chained.size() != 2 || !experts || experts->kind != PyValue::kInt || experts->i < 1))
      return Unimplemented(dir, ": the state of ", chained.size(), " chained optimizers in the distributed optimizer's '",
                           layout, "' layout (each optimizer's buffers under chained_<i>.optimizer.distributed.*) "
                           "without args.num_experts: not supported yet (Gale reads the bucket-space layouts of "
                           "Megatron's MoE chain [dense, experts] only); ", kOutWay);
    if (layout != "non-distributed" && layout != "fully_sharded_model_space" && layout != "fully_reshardable" &&
        !bucket_layout(layout))
      return Unimplemented(dir, ": Megatron's distributed optimizer state in the '", layout,
                           "' layout: not supported yet (Gale reads fully_sharded_model_space, fully_reshardable, "
                           "dp_reshardable and dp_zero_gather_scatter); ", kOutWay);
    const PyValue* inner = sub->get("optimizer");  // the float16 and distributed optimizers nest torch's dict
    const PyValue* scaler = sub->get("grad_scaler");
    PyRef bucket_inner, bucket_scaler;  // the bucket layouts save both as objects of the first data-parallel group
    if (bucket_layout(layout)) {
      const std::string group = str_cat("chained_", i, ".optimizer.distributed.dp_group_idx_0."), shard = "/shard_0_1";
      if (!c.objects().count(group + "optimizer" + shard))
        return DataLoss(dir, ": Megatron's '", layout, "' optimizer layout of a chained optimizer: expected the object '",
                        group, "optimizer", shard, "' (the param groups and step), found none; ", kOutWay);
      auto unwrap = [](const PyRef& v) { return v->kind == PyValue::kList && v->items.size() == 1 ? v->items[0] : v; };
      GALE_ASSIGN_OR_RETURN(bucket_inner, c.read_object(group + "optimizer" + shard));
      bucket_inner = unwrap(bucket_inner);
      inner = bucket_inner.get();
      if (c.objects().count(group + "grad_scaler" + shard)) {
        GALE_ASSIGN_OR_RETURN(bucket_scaler, c.read_object(group + "grad_scaler" + shard));
        bucket_scaler = unwrap(bucket_scaler);
        scaler = bucket_scaler.get();
      }
    }
    if (inner == nullptr || inner->kind != PyValue::kDict) inner = sub;
    GALE_ASSIGN_OR_RETURN(const int64_t step, step_of(*inner, at));
    steps.insert(step);
    if (const PyValue* g = scaler; g && g->kind == PyValue::kDict && o.grad_scaler.is_null()) {
      const nlohmann::json s = scalars_json(*g);
      o.grad_scaler = {{"scale", s.value("scale", 1.0)},
                       {"growth_tracker", s.value("growth_tracker", 0)},
                       {"hysteresis_tracker", s.value("hysteresis_tracker", 0)}};
    }
  }
  if (steps.size() > 1)
    return Unimplemented(where, ": the chained optimizers record different steps (", *steps.begin(), " and ",
                         *steps.rbegin(), "): not supported (Megatron synchronises them); ", kOutWay);
  o.step = steps.empty() ? 0 : *steps.begin();
  o.layout = layout;
  for (const auto& [key, info] : c.tensors())
    if (bucket_layout(layout) ? starts_with(key, "optimizer.")
                              : starts_with(key, "chained_") ||
                                    (starts_with(key, "optimizer.") && !starts_with(key, "optimizer.state.")))
      return Unimplemented(dir, ": optimizer tensor '", key, "' of a chained optimizer in the '", layout, "' layout: "
                           "expected ", bucket_layout(layout) ? "chained_<i>.optimizer.distributed.*" :
                           "optimizer.state.<state>.<model key> (Megatron's chained_optim_avoid_prefix)",
                           ", not supported otherwise; ", kOutWay);
  const PyValue* sched = common.get("opt_param_scheduler");
  if (sched == nullptr || sched->kind != PyValue::kDict)
    return DataLoss(where, ": expected Megatron's 'opt_param_scheduler' state dict next to the optimizer state "
                    "(Megatron's own load needs it too), found ", sched ? sched->type_name() : std::string("none"),
                    "; ", kOutWay);
  o.scheduler = scalars_json(*sched);
  if (bucket_layout(layout)) GALE_RETURN_IF_ERROR(read_megatron_bucket_state(c, args, dir, &o));
  else GALE_RETURN_IF_ERROR(read_model_space_states(c, dir, &o));
  o.type = optimizer_type(type, o);
  if (o.type.empty())
    return DataLoss(dir, ": Megatron's args record no 'optimizer' and the optimizer state has neither Adam's "
                         "exp_avg_sq nor SGD's momentum_buffer: ", kOutWay);
  if (o.tensors.empty() && o.type != "sgd")
    return FailedPrecondition(dir, ": Megatron's checkpoint holds no optimizer.state.* tensors (only the non-sharded "
                                   "optimizer state): ", kOutWay);
  return o;
}

}  // namespace

nlohmann::json megatron_scalars_json(const PyValue& d) { return scalars_json(d); }

StatusOr<int64_t> megatron_optimizer_step(const PyValue& inner, const std::string& where) {
  return step_of(inner, where);
}

StatusOr<Tensor> unflatten_model_space(const Tensor& flat, const Shape& global, const std::string& what) {
  const size_t n = global.size();
  const Shape& fs = flat.shape();
  auto refuse = [&]() {
    return DataLoss(what, ": shape ", flat.shape_string(), ": expected the model tensor's ", shape_string(global),
                    " or its N-D flattened form [", n, " fragment counts dividing it, local numel]");
  };
  if (fs.size() != n + 1) return refuse();
  Shape local(n);
  int64_t numel = 1;
  for (size_t d = 0; d < n; ++d) {
    if (fs[d] <= 0 || global[d] % fs[d] != 0) return refuse();
    local[d] = global[d] / fs[d];
    numel *= local[d];
  }
  if (fs[n] != numel) return refuse();
  const int64_t esize = dtype_size(flat.dtype());
  Tensor out = Tensor::empty(global, flat.dtype());
  if (n == 0 || numel == 0) return out;
  // Strides (elements) of the global tensor; each local block is copied row by row (its last dim).
  std::vector<int64_t> stride(n, 1);
  for (size_t d = n - 1; d > 0; --d) stride[d - 1] = stride[d] * global[d];
  const int64_t blocks = flat.numel() / numel, row = local[n - 1], rows = numel / row;
  const char* src = static_cast<const char*>(flat.raw());
  char* dst = static_cast<char*>(out.raw());
  std::vector<int64_t> f(n), r(n);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t k = b, d = static_cast<int64_t>(n) - 1; d >= 0; --d) f[d] = k % fs[d], k /= fs[d];  // fragment index
    for (int64_t q = 0; q < rows; ++q) {
      int64_t at = 0;
      r[n - 1] = 0;
      for (int64_t k = q, d = static_cast<int64_t>(n) - 2; d >= 0; --d) r[d] = k % local[d], k /= local[d];
      for (size_t d = 0; d < n; ++d) at += (f[d] * local[d] + r[d]) * stride[d];
      std::memcpy(dst + at * esize, src + (b * numel + q * row) * esize, static_cast<size_t>(row * esize));
    }
  }
  return out;
}

StatusOr<MegatronOptimizerState> read_megatron_dist_optimizer(const DcpCheckpoint& c, const PyValue& common,
                                                              const PyValue* args, const std::string& dir) {
  const std::string where = dir + "/common.pt";
  MegatronOptimizerState o;
  const PyValue* opt = common.get("optimizer");
  bool sharded = false;
  for (const auto& [key, info] : c.tensors()) sharded = sharded || starts_with(key, "optimizer.");
  for (const auto& [key, info] : c.objects()) sharded = sharded || starts_with(key, "optimizer.");
  if (opt == nullptr && !sharded)
    return FailedPrecondition(dir, ": Megatron's checkpoint holds no optimizer state (saved with --no-save-optim, or "
                                   "not by a training run): ", kOutWay);
  if (opt == nullptr || opt->kind != PyValue::kDict)
    return DataLoss(where, ": expected Megatron's 'optimizer' dict (the non-sharded optimizer state), found ",
                    opt ? opt->type_name() : std::string("none"));
  const PyValue* type = args ? args->attr("optimizer") : nullptr;
  const bool lion = type && type->kind == PyValue::kString && type->s == "lion";
  std::vector<const PyValue*> chained;  // ChainedOptimizer: {0: ..., 1: ...}
  for (const auto& [k, v] : opt->entries)
    if (k->kind == PyValue::kInt) chained.push_back(v.get());
  o.layout = "non-distributed";
  if (!chained.empty() && lion) return read_lion_chain(c, common, chained, dir, std::move(o));
  if (!chained.empty()) return read_chain(c, common, chained, args, type, dir, std::move(o));
  if (const PyValue* t = opt->get("param_state_sharding_type")) {
    if (t->kind != PyValue::kString)
      return DataLoss(where, ": optimizer.param_state_sharding_type: expected a string, found ", t->type_name());
    o.layout = t->s;
    if (o.layout != "fully_sharded_model_space" && o.layout != "fully_reshardable" && !bucket_layout(o.layout))
      return Unimplemented(dir, ": Megatron's distributed optimizer state in the '", o.layout,
                           "' layout: not supported yet (Gale reads fully_sharded_model_space, fully_reshardable, "
                           "dp_reshardable and dp_zero_gather_scatter); ", kOutWay);
  }
  const bool buckets = bucket_layout(o.layout);
  for (const auto& [key, info] : c.tensors())
    if (starts_with(key, "optimizer.") && !starts_with(key, buckets ? "optimizer.distributed." : "optimizer.state."))
      return DataLoss(dir, ": optimizer tensor '", key, "' in Megatron's '", o.layout, "' optimizer layout: expected ",
                      buckets ? "optimizer.distributed.*" : "optimizer.state.*", "; ", kOutWay);
  const PyValue* inner = opt->get("optimizer");  // the float16 and distributed optimizers nest torch's dict
  const PyValue* scaler = opt->get("grad_scaler");
  PyRef bucket_inner, bucket_scaler;  // the bucket layouts save both as objects of the data-parallel group
  if (buckets) {
    // A ShardedObject of global shape (1,) is stored as "<key>/shard_0_1", its data in a one-element list.
    static const std::string kGroup = "optimizer.distributed.dp_group_idx_0.", kShard = "/shard_0_1";
    if (!c.objects().count(kGroup + "optimizer" + kShard))
      return DataLoss(dir, ": Megatron's '", o.layout, "' optimizer layout: expected the object '", kGroup,
                      "optimizer", kShard, "' (the param groups and step), found none; ", kOutWay);
    auto unwrap = [](const PyRef& v) { return v->kind == PyValue::kList && v->items.size() == 1 ? v->items[0] : v; };
    GALE_ASSIGN_OR_RETURN(bucket_inner, c.read_object(kGroup + "optimizer" + kShard));
    bucket_inner = unwrap(bucket_inner);
    if (bucket_inner->kind != PyValue::kDict)
      return DataLoss(dir, ": object '", kGroup, "optimizer", kShard, "': expected [{'param_groups': ...}], found a ",
                      bucket_inner->type_name(), "; ", kOutWay);
    inner = bucket_inner.get();
    if (c.objects().count(kGroup + "grad_scaler" + kShard)) {
      GALE_ASSIGN_OR_RETURN(bucket_scaler, c.read_object(kGroup + "grad_scaler" + kShard));
      bucket_scaler = unwrap(bucket_scaler);
      scaler = bucket_scaler.get();
    }
  }
  if (inner == nullptr || inner->kind != PyValue::kDict) inner = opt;
  GALE_ASSIGN_OR_RETURN(o.step, step_of(*inner, where));
  if (const PyValue* g = scaler; g && g->kind == PyValue::kDict) {
    const nlohmann::json s = scalars_json(*g);
    o.grad_scaler = {{"scale", s.value("scale", 1.0)},
                     {"growth_tracker", s.value("growth_tracker", 0)},
                     {"hysteresis_tracker", s.value("hysteresis_tracker", 0)}};
  }
  const PyValue* sched = common.get("opt_param_scheduler");
  if (sched == nullptr || sched->kind != PyValue::kDict)
    return DataLoss(where, ": expected Megatron's 'opt_param_scheduler' state dict next to the optimizer state "
                    "(Megatron's own load needs it too), found ", sched ? sched->type_name() : std::string("none"),
                    "; ", kOutWay);
  o.scheduler = scalars_json(*sched);
  if (buckets) GALE_RETURN_IF_ERROR(read_megatron_bucket_state(c, args, dir, &o));
  GALE_RETURN_IF_ERROR(read_model_space_states(c, dir, &o));
  o.type = optimizer_type(type, o);
  if (o.type.empty())
    return DataLoss(dir, ": Megatron's args record no 'optimizer' and the optimizer state has neither Adam's "
                         "exp_avg_sq nor SGD's momentum_buffer: ", kOutWay);
  if (o.tensors.empty() && o.type != "sgd")  // SGD without momentum has no tensor state
    return FailedPrecondition(dir, ": Megatron's checkpoint holds no optimizer.state.* tensors (only the non-sharded "
                                   "optimizer state): ", kOutWay);
  return o;
}

}  // namespace gale
