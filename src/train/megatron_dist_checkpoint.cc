// Megatron's sharded (torch_dist) and plain DCP (torch_dcp) checkpoints -> one global state dict.
#include "train/megatron_dist_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "ckpt/dcp_reader.h"
#include "ckpt/torch_file.h"
#include "train/megatron_dcp_optimizer.h"

namespace gale {

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Training state that is not the model: skipped (Gale loads Megatron's model weights only).
bool training_state(const std::string& key) {
  return starts_with(key, "optimizer") || starts_with(key, "rng_state") || starts_with(key, "rerun_state_machine") ||
         starts_with(key, "opt_param_scheduler") ||
         starts_with(key, "chained_");  // a ChainedOptimizer's bucket-space state (chained_<i>.optimizer.*)
}

int64_t int_attr(const PyValue* args, const char* name, int64_t fallback) {
  const PyValue* v = args ? args->attr(name) : nullptr;
  return v && v->kind == PyValue::kInt ? v->i : fallback;
}

// "decoder.layers.<rest>" whose first part is not a layer number: stacked along num_layers.
bool stacked_layer_key(const std::string& key, std::string* rest) {
  static const std::string kPrefix = "decoder.layers.";
  if (!starts_with(key, kPrefix)) return false;
  *rest = key.substr(kPrefix.size());
  return !rest->empty() && !std::isdigit(static_cast<unsigned char>((*rest)[0]));
}

// Global tensor `t` of sharded key `name` into `out` under its torch-format names: a stacked layer
// tensor as one slice per global layer, anything else as is.
Status add_global_tensor(const std::string& dir, const std::string& key, const std::string& name, Tensor t,
                         int64_t layers, bool dist, PyValue& out) {
  std::string rest;
  if (dist && stacked_layer_key(name, &rest)) {
    if (t.ndim() == 0 || t.shape()[0] != layers)
      return DataLoss(dir, ": tensor '", key, "' of shape ", t.shape_string(), ": expected the layers stacked along "
                           "its first dimension (args.num_layers = ", layers, ")");
    for (int64_t i = 0; i < layers; ++i)
      out.set(str_cat("decoder.layers.", i, ".", rest), PyValue::tensor(slice0(t, i)));
    return Status::Ok();
  }
  out.set(name, PyValue::tensor(std::move(t)));
  return Status::Ok();
}

}  // namespace

Tensor slice0(const Tensor& t, int64_t i) {
  Shape shape(t.shape().begin() + 1, t.shape().end());
  Tensor out = Tensor::empty(shape, t.dtype());
  const size_t bytes = static_cast<size_t>(out.numel() * dtype_size(t.dtype()));
  std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + i * bytes, bytes);
  return out;
}

StatusOr<PyRef> read_megatron_dist_args(const std::string& dir, CheckpointFormat format, std::string* where) {
  if (format == CheckpointFormat::kMegatronTorchDist) {
    *where = dir + "/common.pt";
    if (!std::filesystem::exists(*where))
      return NotFound(*where, ": missing; Megatron's torch_dist checkpoint keeps args and iteration there");
    GALE_ASSIGN_OR_RETURN(PyRef common, read_torch_file(*where));
    if (common->kind != PyValue::kDict)
      return DataLoss(*where, ": expected a dict (Megatron's common state), found ", common->type_name());
    for (const auto& [k, v] : common->entries)
      if (k->kind == PyValue::kString && k->s == "args") return v;
    return DataLoss(*where, ": expected Megatron's 'args' (an argparse.Namespace), found none");
  }
  *where = dir + "/.metadata";
  GALE_ASSIGN_OR_RETURN(DcpCheckpoint c, DcpCheckpoint::open(dir));
  if (!c.objects().count("args")) return DataLoss(*where, ": expected Megatron's 'args' object, found none");
  return c.read_object("args");
}

StatusOr<MegatronDistState> read_megatron_dist_state(const std::string& dir, CheckpointFormat format,
                                                     bool with_optimizer) {
  const bool dist = format == CheckpointFormat::kMegatronTorchDist;
  if (!dist && format != CheckpointFormat::kMegatronTorchDcp)
    return Internal(dir, ": read_megatron_dist_state of a ", checkpoint_format_name(format), " checkpoint");
  MegatronDistState s;
  s.root = PyValue::dict();
  GALE_ASSIGN_OR_RETURN(PyRef args, read_megatron_dist_args(dir, format, &s.where));
  s.root->set("args", args);
  GALE_ASSIGN_OR_RETURN(DcpCheckpoint c, DcpCheckpoint::open(dir));
  PyRef common;
  if (dist) {  // the non-sharded entries
    GALE_ASSIGN_OR_RETURN(common, read_torch_file(s.where));
    for (const char* key : {"checkpoint_version", "iteration", "num_floating_point_operations_so_far"})
      for (const auto& [k, v] : common->entries)
        if (k->kind == PyValue::kString && k->s == key) s.root->set(key, v);
  } else {
    for (const char* key : {"checkpoint_version", "iteration", "num_floating_point_operations_so_far"})
      if (c.objects().count(key)) {
        GALE_ASSIGN_OR_RETURN(PyRef v, c.read_object(key));
        s.root->set(key, v);
      }
    const int64_t tp = int_attr(args.get(), "tensor_model_parallel_size", 1),
                  pp = int_attr(args.get(), "pipeline_model_parallel_size", 1),
                  ep = int_attr(args.get(), "expert_model_parallel_size", 1);
    if (tp != 1 || pp != 1 || ep != 1)
      return Unimplemented(s.where, ": a torch_dcp checkpoint saved at tensor-parallel size ", tp,
                           " x pipeline-parallel size ", pp, ep != 1 ? str_cat(" x expert-parallel size ", ep) : "",
                           ": not supported (its state dict holds each rank's local shards under one key, of which the "
                           "checkpoint keeps one); expected 1 x 1, or save it as torch_dist");
  }
  const int64_t layers = int_attr(args.get(), "num_layers", -1);
  PyRef model = PyValue::dict();
  for (const auto& [key, info] : c.tensors()) {
    if (key.find("_extra_state") != std::string::npos) continue;
    if (training_state(key)) continue;
    std::string name = key;
    if (!dist) {
      if (!starts_with(key, "model."))
        return Unimplemented(dir, ": tensor '", key, "' of the torch_dcp checkpoint is not under 'model.' (virtual "
                                  "pipeline chunks 'model0.', ... and other entries are not supported yet)");
      name = key.substr(6);
    }
    GALE_ASSIGN_OR_RETURN(Tensor t, c.read_tensor(key));
    GALE_RETURN_IF_ERROR(add_global_tensor(dir, key, name, std::move(t), layers, dist, *model));
  }
  s.root->set("model", model);
  if (!with_optimizer) return s;
  if (!dist) {  // the plain optimizer.state_dict() under DCP's dotted keys: read as a torch-format rank file's
    GALE_RETURN_IF_ERROR(add_megatron_dcp_optimizer(c, dir, *s.root));
    return s;
  }
  GALE_ASSIGN_OR_RETURN(MegatronOptimizerState o, read_megatron_dist_optimizer(c, *common, args.get(), dir));
  for (auto& [state, by_key] : o.tensors) {  // Megatron's sharded keys -> torch-format names
    PyValue named;
    named.kind = PyValue::kDict;
    for (auto& [key, t] : by_key)
      GALE_RETURN_IF_ERROR(add_global_tensor(dir, "optimizer.state." + state + "." + key, key, std::move(t), layers,
                                             dist, named));
    by_key.clear();
    for (const auto& [k, v] : named.entries) by_key[k->s] = v->data;
  }
  s.optimizer = std::move(o);
  return s;
}

}  // namespace gale
