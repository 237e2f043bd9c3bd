// Reading MindSpeed's FSDP2 YAML file and --use-torch-fsdp2's conflicts.
#include "train/fsdp2_config.h"

#include "train/arguments.h"
#include "train/flat_yaml.h"

namespace gale {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A module name of sub_modules_to_wrap / ignored_modules / recompute_modules: Gale's unit name or a
// MindSpeed class path naming one. "rotary" for RotaryEmbedding (no parameters), "" for no unit.
std::string unit_of_module(const std::string& name) {
  if (name == "embedding" || ends_with(name, "LanguageModelEmbedding")) return "embedding";
  if (name == "layers" || ends_with(name, "TransformerLayer")) return "layers";
  if (name == "head") return "head";
  if (ends_with(name, "RotaryEmbedding")) return "rotary";
  return "";
}

}  // namespace

StatusOr<Fsdp2Config> parse_fsdp2_config(const std::string& text, const std::string& path) {
  const std::string where = "--fsdp2-config-path " + path + ": ";
  GALE_ASSIGN_OR_RETURN(FlatYaml yaml, parse_flat_yaml(text, where));
  Fsdp2Config c;
  auto boolean = [&](const std::string& key, bool* out) -> Status {
    if (!parse_yaml_bool(yaml.scalars.at(key), out))
      return InvalidArgument(where, key, ": expected true or false, found '", yaml.scalars.at(key), "'");
    return Status::Ok();
  };
  auto modules = [&](const std::string& key) { return yaml.lists.count(key) ? yaml.lists.at(key) : std::vector<std::string>{}; };
  for (const std::string& key : yaml.keys) {
    const std::string& value = yaml.scalars.at(key);
    if (key == "sharding_size") {
      if (value != "auto" && (!parse_yaml_int(value, &c.sharding_size) || c.sharding_size < 1))
        return InvalidArgument(where, "sharding_size: expected an integer ≥ 1 (or auto), found '", value, "'");
      if (value == "auto") c.sharding_size = 0;
    } else if (key == "sub_modules_to_wrap") {
      if (!value.empty())
        return InvalidArgument(where, "sub_modules_to_wrap: expected a list of '- module' lines, found '", value, "'");
      c.wrap_embedding = c.wrap_layers = c.wrap_head = false;
      for (const std::string& m : modules(key)) {
        const std::string u = unit_of_module(m);
        if (u.empty())
          return InvalidArgument(where, "sub_modules_to_wrap: '", m, "' names no Gale unit (expected embedding or "
                                 "…LanguageModelEmbedding, layers or …TransformerLayer, head, …RotaryEmbedding)");
        if (u == "embedding") c.wrap_embedding = true;
        if (u == "layers") c.wrap_layers = true;
        if (u == "head") c.wrap_head = true;
      }
    } else if (key == "reshard_after_forward") {
      int64_t n = 0;
      if (parse_yaml_int(value, &n))
        return Unimplemented(where, "reshard_after_forward ", value, ": not supported yet (resharding to a smaller "
                             "group after the forward; expected true or false)");
      GALE_RETURN_IF_ERROR(boolean(key, &c.reshard_after_forward));
    } else if (key == "num_to_forward_prefetch") {
      if (!parse_yaml_int(value, &c.num_to_forward_prefetch) || c.num_to_forward_prefetch < 0)
        return InvalidArgument(where, "num_to_forward_prefetch: expected an integer ≥ 0, found '", value, "'");
    } else if (key == "param_dtype" || key == "reduce_dtype" || key == "output_dtype") {
      if (value == "fp16" || value == "float16")
        return Unimplemented(where, key, " ", value, ": not supported yet (fp16 needs loss scaling, which "
                             "Megatron refuses with FSDP2 too; expected bf16 or fp32)");
      std::string dtype;
      if (value == "bf16" || value == "bfloat16") dtype = "bf16";
      else if (value == "fp32" || value == "float32") dtype = "fp32";
      else if (!value.empty())
        return InvalidArgument(where, key, ": expected fp32, bf16 or fp16, found '", value, "'");
      if (key == "output_dtype" && dtype == "bf16")
        return Unimplemented(where, "output_dtype ", value, ": not supported yet (Gale's units pass f32 hidden "
                             "states to each other and --bf16 rounds only the GEMM inputs; expected fp32 or leave "
                             "it out)");
      (key == "param_dtype" ? c.param_dtype : key == "reduce_dtype" ? c.reduce_dtype : c.output_dtype) = dtype;
    } else if (key == "cast_forward_inputs" || key == "offload_to_cpu" || key == "pin_memory") {
      bool b = false;
      GALE_RETURN_IF_ERROR(boolean(key, &b));
      if (key != "cast_forward_inputs" || !b) c.accepted_without_effect.push_back(key);
    } else if (key == "ignored_modules" || key == "recompute_modules") {
      const std::vector<std::string> ms = modules(key);
      if (!value.empty()) return InvalidArgument(where, key, ": expected a list of '- module' lines, found '", value, "'");
      for (const std::string& m : ms)
        if (unit_of_module(m).empty())
          return InvalidArgument(where, key, ": '", m, "' names no Gale unit (expected embedding, layers or head)");
      if (!ms.empty() && key == "ignored_modules")
        return Unimplemented(where, "ignored_modules: not supported yet (FSDP2 leaves an ignored module unsharded and "
                             "its gradients unreduced, which suits frozen modules; Gale trains every parameter)");
      for (const std::string& m : ms) {
        const std::string u = unit_of_module(m);
        if (u == "layers") {
          c.recompute_layers = true;
        } else if (u != "rotary") {
          return Unimplemented(where, "recompute_modules: '", m, "': not supported yet (Gale recomputes transformer "
                               "layers only: layers or …TransformerLayer)");
        }
      }
    } else {
      return InvalidArgument(where, "unknown key ", key, " (expected sharding_size, sub_modules_to_wrap, "
                             "reshard_after_forward, param_dtype, reduce_dtype, output_dtype, cast_forward_inputs, "
                             "ignored_modules, offload_to_cpu, pin_memory, num_to_forward_prefetch, recompute_modules)");
    }
  }
  return c;
}

StatusOr<Fsdp2Config> read_fsdp2_config(const std::string& path) {
  GALE_ASSIGN_OR_RETURN(std::string text, read_text_file(path, "--fsdp2-config-path " + path + ": "));
  return parse_fsdp2_config(text, path);
}

StatusOr<Fsdp2Precision> fsdp2_precision(const Fsdp2Config& config, const Arguments& a) {
  const std::string where = "--fsdp2-config-path " + a.parallel.fsdp2_config_path + ": ";
  Fsdp2Precision p;
  const bool bf16 = a.training.bf16;
  if (config.param_dtype == "bf16" && !bf16)
    return InvalidArgument(where, "param_dtype bf16 computes in bf16: expected --bf16 (Gale's bf16 arithmetic, whose "
                           "GEMMs read the bf16 copy FSDP2 gathers), found fp32 training");
  if (config.param_dtype == "fp32" && bf16)
    return InvalidArgument(where, "param_dtype fp32 with --bf16: the model is bf16 (Megatron's Float16Module) and "
                           "its GEMMs read bf16 weights: expected param_dtype bf16 or leave it out");
  p.param_bf16 = bf16;
  // PyTorch: reduce_dtype unset reduces in param_dtype (Megatron's --bf16: the gradients of bf16 parameters).
  p.reduce_bf16 = config.reduce_dtype.empty() ? p.param_bf16 : config.reduce_dtype == "bf16";
  return p;
}

StatusOr<Fsdp2Precision> resolve_fsdp2_precision(const Arguments& a) {
  Fsdp2Config config;
  if (!a.parallel.fsdp2_config_path.empty()) {
    GALE_ASSIGN_OR_RETURN(config, read_fsdp2_config(a.parallel.fsdp2_config_path));
  }
  return fsdp2_precision(config, a);
}

Status check_torch_fsdp2_conflicts(const Arguments& a) {
  const ParallelArgs& par = a.parallel;
  if (!par.use_torch_fsdp2) return Status::Ok();
  if (par.layerzero)
    return InvalidArgument("--use-torch-fsdp2 and --layerzero both shard the model: expected one of them");
  if (par.use_custom_fsdp)
    return InvalidArgument("--use-torch-fsdp2 and --use-custom-fsdp (Megatron-FSDP) both wrap the model: expected "
                           "one of them");
  if (par.use_distributed_optimizer)
    return InvalidArgument("--use-torch-fsdp2 is not supported with --use-distributed-optimizer (as Megatron: FSDP2 "
                           "shards the optimizer state itself)");
  if (par.pipeline_model_parallel_size > 1)
    return InvalidArgument("--use-torch-fsdp2 is not supported with pipeline parallelism (as Megatron; found "
                           "--pipeline-model-parallel-size ", par.pipeline_model_parallel_size, ")");
  if (par.expert_model_parallel_size > 1)
    return InvalidArgument("--use-torch-fsdp2 is not supported with expert parallelism (as Megatron; found "
                           "--expert-model-parallel-size ", par.expert_model_parallel_size, ")");
  if (a.training.fp16) return InvalidArgument("--use-torch-fsdp2 is not supported with --fp16 (as Megatron)");
  if (!a.model.untie_embeddings_and_output_weights)
    return InvalidArgument("--use-torch-fsdp2 requires --untie-embeddings-and-output-weights (as Megatron and "
                           "MindSpeed: a tied embedding would be two units' parameter)");
  return Status::Ok();
}

}  // namespace gale
