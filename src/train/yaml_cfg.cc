// Megatron's --yaml-cfg files turned into the command line they stand for (yaml-cpp).
#include "train/yaml_cfg.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>

#include "train/flat_yaml.h"

namespace gale {

namespace {

// What a YAML node is, for "found ..." in errors.
std::string describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "null";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return str_cat(n.Tag() == "!" ? "the quoted string '" : "'", n.Scalar(), "'");
}

// A YAML key and where it is, and the messages that name it.
struct Key {
  std::string name;     // the argument (`num_layers`)
  std::string path;     // as written (`language_model.num_layers`)
  YAML::Node value;
};

struct Converter {
  std::string file;
  std::map<std::string, ArgParser::FlagInfo> gale_flags;  // gale pretrain's flags by name
  YamlCfgArgs out;

  std::string where(const Key& k) const { return str_cat("--yaml-cfg ", file, ": key ", k.path, ": "); }

  // The scalar's text with ${NAME} replaced in an unquoted value (Megatron's implicit !pathex
  // resolver applies to plain scalars only).
  StatusOr<std::string> text(const Key& k, const YAML::Node& n) const {
    std::string v = n.Scalar();
    if (n.Tag() == "!") return v;  // quoted
    for (size_t at = v.find("${"); at != std::string::npos; at = v.find("${", at)) {
      const size_t end = v.find('}', at);
      if (end == std::string::npos) break;
      const std::string name = v.substr(at + 2, end - at - 2);
      const char* env = std::getenv(name.c_str());
      if (env == nullptr)
        return InvalidArgument(where(k), "environment variable ", name, " in '", n.Scalar(), "' is not set");
      v.replace(at, end - at + 1, env);
      at += std::string(env).size();
    }
    return v;
  }

  // A scalar of `type`, as the text the flag takes.
  StatusOr<std::string> scalar(const Key& k, const YAML::Node& n, MegatronDest::Type type) const {
    if (!n.IsScalar())
      return InvalidArgument(where(k), "expected ", type_name(type), ", found ", describe(n));
    StatusOr<std::string> v = text(k, n);
    if (!v.ok()) return v.status();
    int64_t i = 0;
    bool b = false;
    switch (type) {
      case MegatronDest::kInt:
        if (!parse_yaml_int(v.value(), &i))
          return InvalidArgument(where(k), "expected an integer, found ", describe(n));
        break;
      case MegatronDest::kFloat:
        if (!is_number(v.value())) return InvalidArgument(where(k), "expected a number, found ", describe(n));
        break;
      case MegatronDest::kBool:
        if (!parse_yaml_bool(v.value(), &b)) return InvalidArgument(where(k), "expected true or false, found ", describe(n));
        break;
      case MegatronDest::kString:
        break;
    }
    return v;
  }

  static const char* type_name(MegatronDest::Type t) {
    switch (t) {
      case MegatronDest::kInt: return "an integer";
      case MegatronDest::kFloat: return "a number";
      case MegatronDest::kBool: return "true or false";
      case MegatronDest::kString: break;
    }
    return "a single value";
  }

  static bool is_number(const std::string& v) {
    if (v.empty()) return false;
    char* end = nullptr;
    std::strtod(v.c_str(), &end);
    return end == v.c_str() + v.size();
  }

  // The same text, or the same number ("1.e-5" and "1e-05").
  static bool same(const std::string& a, const std::string& b) {
    if (a == b) return true;
    return is_number(a) && is_number(b) && std::strtod(a.c_str(), nullptr) == std::strtod(b.c_str(), nullptr);
  }

  // A store_true / store_false key: true, false or null (nullopt).
  StatusOr<std::optional<bool>> boolean(const Key& k) const {
    if (k.value.IsNull()) return std::optional<bool>();
    bool b = false;
    if (!k.value.IsScalar() || k.value.Tag() == "!" || !parse_yaml_bool(k.value.Scalar(), &b))
      return InvalidArgument(where(k), "expected true or false, found ", describe(k.value));
    return std::optional<bool>(b);
  }

  // The flag's values: one scalar, or a list (a YAML list, or one string split at blanks).
  StatusOr<std::vector<std::string>> values(const Key& k, bool list, MegatronDest::Type type) const {
    std::vector<std::string> vs;
    if (!list) {
      StatusOr<std::string> v = scalar(k, k.value, type);
      if (!v.ok()) return v.status();
      vs.push_back(v.value());
      return vs;
    }
    if (k.value.IsSequence()) {
      for (const YAML::Node& item : k.value) {
        StatusOr<std::string> v = scalar(k, item, type);
        if (!v.ok()) return v.status();
        vs.push_back(v.value());
      }
      return vs;
    }
    if (!k.value.IsScalar()) return InvalidArgument(where(k), "expected a list, found ", describe(k.value));
    StatusOr<std::string> v = text(k, k.value);
    if (!v.ok()) return v.status();
    std::istringstream words(v.value());
    for (std::string w; words >> w;) vs.push_back(w);
    return vs;
  }

  // Whether the value is Megatron's default for `d` (a refused flag's key is accepted there).
  bool is_default(const Key& k, const MegatronDest& d) const {
    const std::string def = d.default_value;
    if (k.value.IsNull()) return true;
    if (d.kind == MegatronDest::kTrue || d.kind == MegatronDest::kFalse || d.type == MegatronDest::kBool) {
      bool b = false;
      return k.value.IsScalar() && parse_yaml_bool(k.value.Scalar(), &b) && (b ? "True" : "False") == def;
    }
    if (k.value.IsSequence()) return same_list(k.value, def);
    return k.value.IsScalar() && same(k.value.Scalar(), def);
  }

  // Whether a YAML list holds the values of a default written as "[a, b]", "[a b]" or "a b".
  static bool same_list(const YAML::Node& list, const std::string& def) {
    std::string joined;
    for (const YAML::Node& item : list) {
      if (!item.IsScalar()) return false;
      joined += (joined.empty() ? "" : " ") + item.Scalar();
    }
    std::string plain = def.size() >= 2 && def.front() == '[' ? def.substr(1, def.size() - 2) : def;
    for (char& c : plain)
      if (c == ',') c = ' ';
    std::istringstream a(joined), b(plain);
    for (std::string x, y;;) {
      const bool ha = static_cast<bool>(a >> x), hb = static_cast<bool>(b >> y);
      if (ha != hb) return false;
      if (!ha) return true;
      if (!same(x, y)) return false;
    }
  }

  void emit(const std::string& flag, const std::vector<std::string>& vs = {}) {
    out.argv.push_back(flag);
    out.argv.insert(out.argv.end(), vs.begin(), vs.end());
  }

  // A key that is one of Megatron's destinations.
  Status megatron_key(const Key& k, const MegatronDest& d) {
    auto g = gale_flags.find(d.flag);
    if (g == gale_flags.end())
      return Internal(where(k), d.flag, " is a flag of Megatron's parser that gale pretrain does not know");
    if (g->second.kind == ArgParser::Kind::kRefused && is_default(k, d)) return Status::Ok();  // at Megatron's default
    // A value that is Megatron's default and Gale's is not passed on: to Megatron it is the same as
    // no value, and Gale's checks of flags given together (--moe-router-topk needs --num-experts)
    // must not see it.
    if ((d.kind == MegatronDest::kValue || d.kind == MegatronDest::kList) && k.value.IsScalar() && is_default(k, d) &&
        same(k.value.Scalar(), g->second.default_value))
      return Status::Ok();
    if (d.kind == MegatronDest::kList && k.value.IsSequence() && is_default(k, d) &&
        same_list(k.value, g->second.default_value))
      return Status::Ok();
    if (d.kind == MegatronDest::kTrue || d.kind == MegatronDest::kFalse) {
      StatusOr<std::optional<bool>> b = boolean(k);
      if (!b.ok()) return b.status();
      if (b.value().has_value() && *b.value() == (d.kind == MegatronDest::kTrue)) emit(d.flag);
      return Status::Ok();
    }
    if (k.value.IsNull()) return Status::Ok();
    StatusOr<std::vector<std::string>> vs = values(k, d.kind == MegatronDest::kList, d.type);
    if (!vs.ok()) return vs.status();
    emit(d.flag, vs.value());
    return Status::Ok();
  }

  // TransformerConfig's window_size (a (left, right) pair: a list of two integers, or the flag's
  // text) and window_attn_skip_freq (an int, a list of 0/1, or the flag's list expression) as
  // --window-size and --window-attn-skip-freq.
  Status window_key(const Key& k) {
    if (k.value.IsNull()) return Status::Ok();
    const bool size = k.name == "window_size";
    if (k.value.IsSequence()) {
      std::string joined;
      for (const YAML::Node& item : k.value) {
        StatusOr<std::string> v = scalar(k, item, MegatronDest::kInt);
        if (!v.ok()) return v.status();
        joined += (joined.empty() ? "" : ",") + v.value();
      }
      emit(size ? "--window-size" : "--window-attn-skip-freq", {size ? joined : "[" + joined + "]"});
      return Status::Ok();
    }
    StatusOr<std::string> v = scalar(k, k.value, MegatronDest::kString);
    if (!v.ok()) return v.status();
    emit(size ? "--window-size" : "--window-attn-skip-freq", {v.value()});
    return Status::Ok();
  }

  // A key of one of Gale's own (or MindSpeed's) flags.
  Status gale_key(const Key& k, const ArgParser::FlagInfo& g) {
    if (k.value.IsNull()) return Status::Ok();
    bool b = false;
    const bool is_bool = k.value.IsScalar() && k.value.Tag() != "!" && parse_yaml_bool(k.value.Scalar(), &b);
    if (g.kind == ArgParser::Kind::kSwitch || (g.kind == ArgParser::Kind::kRefused && is_bool)) {
      if (!is_bool) return InvalidArgument(where(k), "expected true or false, found ", describe(k.value));
      if (b) emit(g.flag);
      return Status::Ok();
    }
    StatusOr<std::vector<std::string>> vs = values(k, g.kind != ArgParser::Kind::kValue, MegatronDest::kString);
    if (!vs.ok()) return vs.status();
    emit(g.flag, vs.value());
    return Status::Ok();
  }
};

// TransformerConfig / ModelParallelConfig fields of Megatron's YAML files that are no argparse
// destination.
enum class FieldRule {
  kAlias,     // the argument `arg` (a Megatron destination) under another name
  kDerived,   // Megatron derives or hard-wires it (validate_yaml, core_transformer_config_from_yaml): ignored
  kNoEffect,  // a CUDA kernel or communication switch: true or false, no effect in Gale
  kNullOnly,  // a Python object Megatron sets itself: null only
  kOnly,      // accepted when null or `arg`; anything else is not supported yet (`why`)
};
struct ConfigField {
  const char* key;
  FieldRule rule;
  const char* arg;
  const char* why;
};

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> fields = {
      {"layernorm_epsilon", FieldRule::kAlias, "norm_epsilon", ""},
      {"layernorm_zero_centered_gamma", FieldRule::kAlias, "apply_layernorm_1p", ""},
      {"num_moe_experts", FieldRule::kAlias, "num_experts", ""},
      {"params_dtype", FieldRule::kDerived, "", "from fp16 / bf16"},
      {"pipeline_dtype", FieldRule::kDerived, "", "from fp16 / bf16"},
      {"virtual_pipeline_model_parallel_size", FieldRule::kDerived, "", "from num_layers_per_virtual_pipeline_stage"},
      {"variable_seq_lengths", FieldRule::kDerived, "", "Megatron sets it false"},
      {"batch_p2p_comm", FieldRule::kDerived, "", "not overlap_p2p_comm"},
      {"deallocate_pipeline_outputs", FieldRule::kDerived, "", "Megatron sets it true"},
      {"bias_activation_fusion", FieldRule::kNoEffect, "", ""},
      {"persist_layer_norm", FieldRule::kNoEffect, "", ""},
      {"memory_efficient_layer_norm", FieldRule::kNoEffect, "", ""},
      {"tp_comm_atomic_ag", FieldRule::kNoEffect, "", ""},
      {"tp_comm_atomic_rs", FieldRule::kNoEffect, "", ""},
      {"batch_p2p_sync", FieldRule::kNoEffect, "", ""},
      {"cpu_offloading_weights", FieldRule::kNoEffect, "", ""},
      {"cpu_offloading_activations", FieldRule::kNoEffect, "", ""},
      {"timers", FieldRule::kNullOnly, "", ""},
      {"finalize_model_grads_func", FieldRule::kNullOnly, "", ""},
      {"grad_scale_func", FieldRule::kNullOnly, "", ""},
      {"no_sync_func", FieldRule::kNullOnly, "", ""},
      {"grad_sync_func", FieldRule::kNullOnly, "", ""},
      {"param_sync_func", FieldRule::kNullOnly, "", ""},
      {"_cpu_offloading_context", FieldRule::kNullOnly, "", ""},
      {"autocast_dtype", FieldRule::kNullOnly, "", ""},
      {"output_layer_init_method", FieldRule::kNullOnly, "", ""},
      {"num_microbatches_with_partial_activation_checkpoints", FieldRule::kOnly, "",
       "partial activation checkpointing of some micro-batches"},
      {"cpu_offloading", FieldRule::kOnly, "false", "Megatron's activation and weight CPU offloading"},
      {"cpu_offloading_num_layers", FieldRule::kOnly, "0", "Megatron's activation and weight CPU offloading"},
      {"enable_autocast", FieldRule::kOnly, "false", "autocast"},
      {"moe_token_dropping", FieldRule::kOnly, "false",
       "this switch; token dropping is --moe-expert-capacity-factor"},
      {"standalone_embedding_stage", FieldRule::kOnly, "false", "a pipeline stage holding only the embedding"},
  };
  return fields;
}

}  // namespace

std::string find_yaml_cfg(int argc, char** argv) {
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--yaml-cfg" && i + 1 < argc) path = argv[++i];
    else if (a.rfind("--yaml-cfg=", 0) == 0) path = a.substr(11);
  }
  return path;
}

StatusOr<YamlCfgArgs> yaml_cfg_to_args(const std::string& path, const ArgParser& parser) {
  const std::string where = str_cat("--yaml-cfg ", path, ": ");
  StatusOr<std::string> content = read_text_file(path, where);
  if (!content.ok()) return content.status();
  YAML::Node root;
  try {
    root = YAML::Load(content.value());
  } catch (const YAML::Exception& e) {
    return InvalidArgument(where, "not valid YAML: line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ",
                           e.msg);
  }
  if (!root.IsMap()) return InvalidArgument(where, "expected a mapping of argument names to values, found ", describe(root));

  Converter c;
  c.file = path;
  for (const ArgParser::FlagInfo& f : parser.flags()) c.gale_flags[f.flag] = f;
  c.emit("--yaml-cfg", {path});

  // Megatron merges language_model and model_parallel into the top level (a name in both is an error).
  std::vector<Key> keys;
  std::map<std::string, std::string> seen;  // name -> path
  auto add = [&](const std::string& section, const YAML::Node& name, const YAML::Node& value) -> Status {
    const std::string n = name.Scalar();
    const std::string p = section.empty() ? n : section + "." + n;
    auto [it, fresh] = seen.emplace(n, p);
    if (!fresh) return InvalidArgument(where, "key ", p, ": given twice (also as ", it->second, ")");
    keys.push_back({n, p, value});
    return Status::Ok();
  };
  for (const auto& kv : root) {
    const std::string n = kv.first.Scalar();
    if (n == "language_model" || n == "model_parallel") {
      if (!kv.second.IsMap() && !kv.second.IsNull())
        return InvalidArgument(where, "key ", n, ": expected a mapping of argument names to values, found ",
                               describe(kv.second));
      for (const auto& inner : kv.second) GALE_RETURN_IF_ERROR(add(n, inner.first, inner.second));
    } else {
      GALE_RETURN_IF_ERROR(add("", kv.first, kv.second));
    }
  }

  std::map<std::string, const MegatronDest*> dests;
  for (const MegatronDest& d : megatron_dests()) dests.emplace(d.dest, &d);
  std::map<std::string, const ConfigField*> fields;
  for (const ConfigField& f : config_fields()) fields.emplace(f.key, &f);

  // activation_func decides the MLP's activation (core_transformer_config_from_yaml); the top-level
  // swiglu / squared_relu switches must agree with it.
  const Key* activation = nullptr;
  std::map<std::string, const Key*> switches;  // swiglu, squared_relu, gated_linear_unit
  for (const Key& k : keys) {
    if (k.name == "yaml_cfg") continue;  // Megatron sets it to the file's path
    if (k.name == "activation_func") {
      activation = &k;
      continue;
    }
    if (k.name == "init_method") {  // core_transformer_config_from_yaml: null or xavier_uniform
      if (k.value.IsNull()) continue;
      StatusOr<std::string> v = c.scalar(k, k.value, MegatronDest::kString);
      if (!v.ok()) return v.status();
      if (v.value() != "xavier_uniform")
        return InvalidArgument(c.where(k), "expected null or xavier_uniform (Megatron's choices), found ",
                               describe(k.value));
      c.emit("--init-method-xavier-uniform");
      continue;
    }
    if (k.name == "window_size" || k.name == "window_attn_skip_freq") {
      GALE_RETURN_IF_ERROR(c.window_key(k));
      continue;
    }
    if (k.name == "swiglu" || k.name == "squared_relu" || k.name == "gated_linear_unit") {
      switches[k.name] = &k;
      continue;
    }
    if (auto f = fields.find(k.name); f != fields.end()) {
      const ConfigField& field = *f->second;
      switch (field.rule) {
        case FieldRule::kAlias:
          GALE_RETURN_IF_ERROR(c.megatron_key(k, *dests.at(field.arg)));
          break;
        case FieldRule::kDerived:
          if (!k.value.IsNull())
            c.out.notes.push_back(str_cat(k.path, ": ignored, as in Megatron, which derives it (", field.why, ")"));
          break;
        case FieldRule::kNoEffect: {
          StatusOr<std::optional<bool>> b = c.boolean(k);
          if (!b.ok()) return b.status();
          break;
        }
        case FieldRule::kNullOnly:
          if (!k.value.IsNull())
            return InvalidArgument(c.where(k), "expected null (Megatron sets this Python object itself), found ",
                                   describe(k.value));
          break;
        case FieldRule::kOnly: {
          if (k.value.IsNull()) break;
          bool b = false, want = false;
          const std::string v = k.value.IsScalar() ? k.value.Scalar() : "";
          const bool same = v == field.arg || (parse_yaml_bool(v, &b) && parse_yaml_bool(field.arg, &want) && b == want);
          if (!same || !k.value.IsScalar())
            return Unimplemented(c.where(k), "not supported yet (", field.why, "): expected ",
                                 *field.arg ? field.arg : "null", ", found ", describe(k.value));
          break;
        }
      }
      continue;
    }
    if (auto d = dests.find(k.name); d != dests.end()) {
      GALE_RETURN_IF_ERROR(c.megatron_key(k, *d->second));
      continue;
    }
    std::string flag = "--" + k.name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (auto g = c.gale_flags.find(flag); g != c.gale_flags.end()) {
      GALE_RETURN_IF_ERROR(c.gale_key(k, g->second));
      continue;
    }
    return InvalidArgument(c.where(k),
                           "unknown key: expected an argument of Megatron's parser (its destination, e.g. "
                           "num_layers for --num-layers), a flag of gale pretrain (spelled with underscores) or a "
                           "TransformerConfig field Gale reads (activation_func, layernorm_epsilon, ...)");
  }

  auto switch_value = [&](const char* name) -> StatusOr<std::optional<bool>> {
    auto it = switches.find(name);
    if (it == switches.end()) return std::optional<bool>();
    return c.boolean(*it->second);
  };
  StatusOr<std::optional<bool>> swiglu = switch_value("swiglu"), squared = switch_value("squared_relu"),
                                glu = switch_value("gated_linear_unit");
  for (const auto* s : {&swiglu, &squared, &glu})
    if (!s->ok()) return s->status();
  std::string act;  // "" when activation_func is absent: the switches decide
  if (activation != nullptr && !activation->value.IsNull()) {
    StatusOr<std::string> v = c.scalar(*activation, activation->value, MegatronDest::kString);
    if (!v.ok()) return v.status();
    act = v.value();
    if (act != "swiglu" && act != "squaredrelu" && act != "gelu")
      return InvalidArgument(c.where(*activation), "expected swiglu, squaredrelu or gelu (Megatron's choices), found ",
                             describe(activation->value));
    auto contradicts = [&](const char* name, const StatusOr<std::optional<bool>>& s, bool expected) -> Status {
      if (s.value().has_value() && *s.value() != expected)
        return InvalidArgument(c.where(*switches.at(name)), *s.value() ? "true" : "false",
                               " contradicts ", activation->path, ": ", act);
      return Status::Ok();
    };
    GALE_RETURN_IF_ERROR(contradicts("swiglu", swiglu, act == "swiglu"));
    GALE_RETURN_IF_ERROR(contradicts("squared_relu", squared, act == "squaredrelu"));
  } else {
    act = swiglu.value().value_or(false) ? "swiglu" : squared.value().value_or(false) ? "squaredrelu" : "gelu";
  }
  if (act == "swiglu") c.emit("--swiglu");
  if (act == "squaredrelu") c.emit("--squared-relu");
  // Megatron's YAML path sets gated_linear_unit for swiglu whatever the file says.
  if (glu.value().value_or(false) && act != "swiglu")
    return Unimplemented(c.where(*switches.at("gated_linear_unit")), "not supported yet (a gated ", act,
                         " MLP; Gale gates only SwiGLU): expected false with activation_func ", act, ", found true");
  return c.out;
}

void apply_yaml_cfg_world_caps(int64_t world_size, int64_t* tensor_parallel, int64_t* pipeline_parallel) {
  *tensor_parallel = std::min(*tensor_parallel, world_size);
  *pipeline_parallel = std::min(*pipeline_parallel, std::max<int64_t>(1, world_size / *tensor_parallel));
}

}  // namespace gale
