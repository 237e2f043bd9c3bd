// Reading MindSpeed's dist_config into the dist-train rank map, with MindSpeed's rules and Gale's.
#include "train/dist_train_config.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace gale {

namespace {

using nlohmann::json;

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

std::string kind(const json& v) { return v.type_name(); }

struct Entry {
  std::string name;
  int64_t model_index = 0, world_size = 0, tp = 1, pp = 1, cp = 1, num_layers = 0;
  bool forward_only = false, main_dp = false;
};

}  // namespace

StatusOr<DistTrainLayout> parse_dist_train_config(const std::string& text, const std::string& path,
                                                  int64_t world_size, int64_t num_layers) {
  const std::string where = "--mm-model " + path;
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return InvalidArgument(where, ": expected a JSON file, found text that is not valid JSON");
  if (!doc.is_object() || !doc.contains("dist_config") || !doc["dist_config"].is_object())
    return InvalidArgument(where, ": expected an object with a \"dist_config\" object (MindSpeed-MM's model.json), found ",
                           doc.is_object() ? (doc.contains("dist_config") ? "\"dist_config\" of type " +
                                                                                kind(doc["dist_config"])
                                                                          : std::string("no \"dist_config\""))
                                           : "a JSON " + kind(doc));
  const json& dc = doc["dist_config"];
  for (const auto& [key, value] : dc.items())
    if (key != "model_name" && key != "use_multiparam_send_recv" && key != "model_config")
      return InvalidArgument(where, ": dist_config.", key,
                             ": unknown key (expected model_name, use_multiparam_send_recv, model_config)");
  if (!dc.contains("model_name") || !dc["model_name"].is_string())
    return InvalidArgument(where, ": dist_config.model_name: expected a string, found ",
                           dc.contains("model_name") ? kind(dc["model_name"]) : std::string("none"));
  if (dc.contains("use_multiparam_send_recv")) {
    if (!dc["use_multiparam_send_recv"].is_boolean())
      return InvalidArgument(where, ": dist_config.use_multiparam_send_recv: expected a boolean, found ",
                             kind(dc["use_multiparam_send_recv"]));
    if (dc["use_multiparam_send_recv"].get<bool>())
      return Unimplemented(where, ": dist_config.use_multiparam_send_recv true: not supported yet (the sub-worlds ",
                           "exchange the hidden states alone)");
  }
  if (!dc.contains("model_config") || !dc["model_config"].is_array())
    return InvalidArgument(where, ": dist_config.model_config: expected a list of sub-world objects, found ",
                           dc.contains("model_config") ? kind(dc["model_config"]) : std::string("none"));
  const json& mc = dc["model_config"];
  if (mc.size() < 2)
    return InvalidArgument(where, ": dist_config.model_config: expected at least 2 sub-worlds, found ", mc.size());

  std::vector<Entry> entries;
  std::set<std::string> names;
  int main_dp = 0;
  for (size_t i = 0; i < mc.size(); ++i) {
    const json& e = mc[i];
    const std::string field = str_cat(where, ": dist_config.model_config[", i, "]");
    if (!e.is_object()) return InvalidArgument(field, ": expected an object, found ", kind(e));
    Entry x;
    for (const auto& [key, value] : e.items()) {
      static const std::set<std::string> known = {"name", "model_index", "world_size", "tensor_model_parallel_size",
                                                  "pipeline_model_parallel_size", "context_parallel_size",
                                                  "forward_only", "main_dp", "num_layers"};
      if (!key.empty() && key[0] == '_')
        return InvalidArgument(field, ".", key, ": a key may not start with '_' (as MindSpeed's)");
      if (!known.count(key))
        return InvalidArgument(field, ".", key, ": unknown key (expected name, model_index, world_size, ",
                               "tensor_model_parallel_size, pipeline_model_parallel_size, context_parallel_size, ",
                               "forward_only, main_dp, num_layers)");
    }
    if (!e.contains("name") || !e["name"].is_string() || !is_identifier(e["name"].get<std::string>()))
      return InvalidArgument(field, ".name: expected an identifier string, found ",
                             !e.contains("name") ? std::string("none")
                             : e["name"].is_string() ? "\"" + e["name"].get<std::string>() + "\""
                                                     : kind(e["name"]));
    x.name = e["name"].get<std::string>();
    if (!names.insert(x.name).second) return InvalidArgument(field, ".name: \"", x.name, "\" is used twice");
    const std::string named = str_cat(field, " (\"", x.name, "\")");
    auto integer = [&](const char* key, bool required, int64_t minimum, int64_t* out) -> Status {
      if (!e.contains(key)) {
        if (required) return InvalidArgument(named, ".", key, ": expected an integer >= ", minimum, ", found none");
        return Status::Ok();
      }
      if (!e[key].is_number_integer() || e[key].get<int64_t>() < minimum)
        return InvalidArgument(named, ".", key, ": expected an integer >= ", minimum, ", found ", e[key].dump());
      *out = e[key].get<int64_t>();
      return Status::Ok();
    };
    auto boolean = [&](const char* key, bool* out) -> Status {
      if (!e.contains(key)) return Status::Ok();
      if (!e[key].is_boolean()) return InvalidArgument(named, ".", key, ": expected a boolean, found ", e[key].dump());
      *out = e[key].get<bool>();
      return Status::Ok();
    };
    GALE_RETURN_IF_ERROR(integer("model_index", true, 0, &x.model_index));
    GALE_RETURN_IF_ERROR(integer("world_size", true, 1, &x.world_size));
    GALE_RETURN_IF_ERROR(integer("tensor_model_parallel_size", false, 1, &x.tp));
    GALE_RETURN_IF_ERROR(integer("pipeline_model_parallel_size", false, 1, &x.pp));
    GALE_RETURN_IF_ERROR(integer("context_parallel_size", false, 1, &x.cp));
    GALE_RETURN_IF_ERROR(integer("num_layers", true, 1, &x.num_layers));
    GALE_RETURN_IF_ERROR(boolean("forward_only", &x.forward_only));
    GALE_RETURN_IF_ERROR(boolean("main_dp", &x.main_dp));
    main_dp += x.main_dp ? 1 : 0;
    if (x.world_size % (x.tp * x.pp * x.cp) != 0)
      return InvalidArgument(named, ".world_size: expected a multiple of tensor_model_parallel_size ", x.tp,
                             " x pipeline_model_parallel_size ", x.pp, " x context_parallel_size ", x.cp, " = ",
                             x.tp * x.pp * x.cp, ", found ", x.world_size);
    if (x.num_layers % x.pp != 0)
      return InvalidArgument(named, ".num_layers: expected a multiple of pipeline_model_parallel_size ", x.pp,
                             " (its layers split evenly over its stages), found ", x.num_layers);
    if (!entries.empty() && x.cp != entries.front().cp)
      return Unimplemented(named, ".context_parallel_size ", x.cp, ": sub-worlds of different context-parallel sizes (\"",
                           entries.front().name, "\" has ", entries.front().cp, "): not supported yet");
    entries.push_back(x);
  }
  if (main_dp > 1) return InvalidArgument(where, ": dist_config.model_config: expected at most one main_dp true, found ", main_dp);
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.model_index < b.model_index; });
  for (size_t i = 0; i < entries.size(); ++i)
    if (entries[i].model_index != static_cast<int64_t>(i))
      return InvalidArgument(where, ": dist_config.model_config: expected model_index 0 to ", entries.size() - 1,
                             " once each, found ", entries[i].model_index, " for \"", entries[i].name, "\"",
                             " where ", i, " belongs");
  int64_t ranks = 0, layers = 0;
  for (const Entry& x : entries) ranks += x.world_size, layers += x.num_layers;
  if (ranks != world_size)
    return InvalidArgument(where, ": dist_config.model_config: the sub-worlds' world_size must sum to the job's ",
                           world_size, " ranks, found ", ranks);
  if (layers != num_layers)
    return InvalidArgument(where, ": dist_config.model_config: the sub-worlds' num_layers must sum to --num-layers ",
                           num_layers, ", found ", layers);
  DistTrainLayout out;
  int first_rank = 0, first_stage = 0;
  for (const Entry& x : entries) {
    DistTrainSubWorld s;
    s.name = x.name;
    s.first_rank = first_rank;
    s.world_size = static_cast<int>(x.world_size);
    s.tp = static_cast<int>(x.tp);
    s.pp = static_cast<int>(x.pp);
    s.cp = static_cast<int>(x.cp);
    s.dp = static_cast<int>(x.world_size / (x.tp * x.pp * x.cp));
    s.first_stage = first_stage;
    s.num_layers = x.num_layers;
    s.forward_only = x.forward_only;
    first_rank += s.world_size;
    first_stage += s.pp;
    out.subworlds.push_back(s);
  }
  // Forward-only (frozen) sub-worlds lead the chain: a trainable one before them would need their
  // input gradients, and the last one computes the loss.
  if (out.subworlds.back().forward_only)
    return InvalidArgument(where, ": dist_config.model_config (\"", out.subworlds.back().name, "\").forward_only: ",
                           "expected false for the last sub-world (it computes the loss), found true");
  for (size_t i = 1; i < out.subworlds.size(); ++i)
    if (out.subworlds[i].forward_only && !out.subworlds[i - 1].forward_only)
      return Unimplemented(where, ": dist_config.model_config (\"", out.subworlds[i].name, "\").forward_only true after ",
                           "the trainable \"", out.subworlds[i - 1].name, "\": not supported yet (only the leading ",
                           "sub-worlds may be forward-only)");
  // Data parallelism: MindSpeed's main_dp sub-world sets the job's DP; the others' DP sizes are
  // multiples of it (their inner data parallelism splits its micro-batches).
  const int main = out.dp();
  for (size_t i = 0; i < out.subworlds.size(); ++i) {
    const DistTrainSubWorld& s = out.subworlds[i];
    if (s.dp != main && s.cp > 1)
      return Unimplemented(where, ": sub-worlds of different data-parallel sizes with context_parallel_size ", s.cp,
                           ": not supported yet");
    if (s.dp % main != 0)
      return Unimplemented(where, ": sub-worlds whose data-parallel sizes (world_size / (tensor x pipeline size)) ",
                           "are not multiples of the smallest, ", main, " (\"", s.name, "\" has ", s.dp,
                           "): not supported yet");
    if (entries[i].main_dp && s.dp != main)
      return InvalidArgument(where, ": dist_config.model_config (\"", s.name, "\").main_dp: expected the sub-world ",
                             "of the smallest data-parallel size ", main, " (the job's), found one of ", s.dp);
  }
  return out;
}

StatusOr<DistTrainLayout> load_dist_train_config(const std::string& path, int64_t world_size, int64_t num_layers) {
  std::ifstream in(path);
  if (!in) return InvalidArgument("--mm-model ", path, ": cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  return parse_dist_train_config(text.str(), path, world_size, num_layers);
}

int64_t dist_train_vocab_tp(const DistTrainLayout& layout) {
  int64_t tp = 1;
  for (const DistTrainSubWorld& s : layout.subworlds) tp = std::lcm(tp, int64_t{s.tp});
  return tp;
}

std::string render_dist_train_layout(const DistTrainLayout& layout) {
  std::string out = str_cat("dist-train: ", layout.subworlds.size(), " sub-worlds, ", layout.num_stages(),
                            " pipeline stages, main data-parallel size ", layout.dp());
  int64_t first_layer = 0;
  for (const DistTrainSubWorld& s : layout.subworlds) {
    out += str_cat("\n  ", s.name, ": ranks ", s.first_rank, "-", s.first_rank + s.world_size - 1, ", TP ", s.tp,
                   s.cp > 1 ? str_cat(" CP ", s.cp) : std::string(), " PP ", s.pp, " DP ", s.dp, ", pipeline stages ", s.first_stage, "-", s.first_stage + s.pp - 1,
                   ", layers ", first_layer, "-", first_layer + s.num_layers - 1);
    first_layer += s.num_layers;
  }
  return out;
}

}  // namespace gale
