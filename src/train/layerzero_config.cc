// Reading MindSpeed's LayerZeRO YAML file (the flat subset it uses).
#include "train/layerzero_config.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

namespace gale {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

std::string unquote(std::string v) {
  v = trim(v);
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) v = v.substr(1, v.size() - 2);
  return v;
}

// A `#` that starts a comment: at the line's start or after a blank, outside quotes.
std::string strip_comment(const std::string& line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
      return line.substr(0, i);
    }
  }
  return line;
}

bool is_false(const std::string& v) { return v == "false" || v == "False" || v == "FALSE" || v.empty(); }

}  // namespace

StatusOr<LayerZeroConfig> parse_layerzero_config(const std::string& text, const std::string& path) {
  const std::string where = "--layerzero-config " + path + ": ";
  std::map<std::string, std::string> scalars;
  std::map<std::string, std::vector<std::string>> lists;
  std::string last_key;
  std::istringstream in(text);
  int line_no = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++line_no;
    const std::string line = strip_comment(raw);
    const std::string t = trim(line);
    if (t.empty()) continue;
    if (t[0] == '-') {
      if (last_key.empty() || !scalars[last_key].empty())
        return InvalidArgument(where, "line ", line_no, ": a list item '", t, "' outside a list key");
      lists[last_key].push_back(unquote(t.substr(1)));
      continue;
    }
    const size_t colon = t.find(':');
    if (colon == std::string::npos || line[0] == ' ' || line[0] == '\t')
      return InvalidArgument(where, "line ", line_no, ": expected 'key: value', found '", t, "'");
    last_key = trim(t.substr(0, colon));
    if (scalars.count(last_key)) return InvalidArgument(where, "key ", last_key, " given twice");
    scalars[last_key] = unquote(t.substr(colon + 1));
  }
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
  std::ifstream f(path);
  if (!f.good()) return NotFound("--layerzero-config ", path, ": cannot read the file");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_layerzero_config(ss.str(), path);
}

}  // namespace gale
