// Reading MindSpeed's LayerZeRO YAML file (train/flat_yaml.h: the flat subset it uses).
#include "train/layerzero_config.h"

#include "train/flat_yaml.h"

#include <algorithm>
#include <iterator>
#include <map>

namespace gale {

namespace {

bool is_false(const std::string& v) {
  bool b = false;
  return v.empty() || (parse_yaml_bool(v, &b) && !b);
}

}  // namespace

StatusOr<LayerZeroConfig> parse_layerzero_config(const std::string& text, const std::string& path) {
  const std::string where = "--layerzero-config " + path + ": ";
  GALE_ASSIGN_OR_RETURN(FlatYaml yaml, parse_flat_yaml(text, where));
  const std::map<std::string, std::string>& scalars = yaml.scalars;
  std::map<std::string, std::vector<std::string>>& lists = yaml.lists;
  LayerZeroConfig c;
  static const char* kNoEffect[] = {"transformer_layers", "forward_prefetch", "backward_prefetch",
                                    "limit_all_gathers",  "autocast_input",   "autocast_output"};
  for (const auto& [key, value] : scalars) {
    if (key == "zero3_size") {
      try {
        size_t used = 0;
        c.zero3_size = std::stoll(value, &used);
        if (used != value.size()) c.zero3_size = 0;
      } catch (...) {
        c.zero3_size = 0;
      }
      if (c.zero3_size < 1) return InvalidArgument(where, "zero3_size: expected an integer ≥ 1, found '", value, "'");
    } else if (key == "param_dtype" || key == "reduce_dtype") {
      if (value != "fp32")
        return Unimplemented(where, key, " ", value, ": not supported yet (Gale's LayerZeRO runs in fp32; set ", key,
                             ": fp32)");
    } else if (key == "ignored_modules") {
      if (!value.empty() || !lists[key].empty())
        return Unimplemented(where, "ignored_modules: not supported yet (every parameter is managed by LayerZeRO)");
    } else if (key == "offload_grads") {
      if (!is_false(value))
        return Unimplemented(where, "offload_grads ", value, ": not supported yet (gradients stay in memory)");
    } else if (key == "ckpt_load_path") {
      return Unimplemented(where, "ckpt_load_path: not supported yet (Gale's LayerZeRO checkpoints are in the common "
                           "format: resume with --load)");
    } else if (std::find(std::begin(kNoEffect), std::end(kNoEffect), key) != std::end(kNoEffect)) {
      c.accepted_without_effect.push_back(key);
    } else {
      return InvalidArgument(where, "unknown key ", key, " (expected zero3_size, param_dtype, reduce_dtype, "
                             "transformer_layers, ignored_modules, offload_grads, ckpt_load_path, forward_prefetch, "
                             "backward_prefetch, limit_all_gathers, autocast_input, autocast_output)");
    }
  }
  if (c.zero3_size == 0) return InvalidArgument(where, "zero3_size is missing: expected an integer ≥ 1");
  for (const char* key : {"param_dtype", "reduce_dtype"})
    if (!scalars.count(key))
      return Unimplemented(where, key, " fp16 (MindSpeed's default when absent): not supported yet (Gale's LayerZeRO "
                           "runs in fp32; set ", key, ": fp32)");
  return c;
}

StatusOr<LayerZeroConfig> read_layerzero_config(const std::string& path) {
  GALE_ASSIGN_OR_RETURN(std::string text, read_text_file(path, "--layerzero-config " + path + ": "));
  return parse_layerzero_config(text, path);
}

}  // namespace gale
