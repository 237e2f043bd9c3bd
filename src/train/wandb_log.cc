// gale pretrain's Weights & Biases content: config items from the command line, the scalar mirror.
#include "train/wandb_log.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <set>

#include "train/yaml_cfg.h"

namespace gale {
namespace {

// "--name" (not a negative number such as "--5"; values like "-1" never start with two dashes).
bool is_flag(const std::string& s) {
  return s.size() > 2 && s[0] == '-' && s[1] == '-' && !std::isdigit(static_cast<unsigned char>(s[2])) && s[2] != '.';
}

// A token as a JSON value of `type`: numbers stay numbers when they read as one.
std::string json_value(const std::string& v, MegatronDest::Type type) {
  if (type == MegatronDest::kInt) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (!v.empty() && *end == '\0' && errno == 0) return std::to_string(x);
  } else if (type == MegatronDest::kFloat) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (!v.empty() && *end == '\0') return wandb_json_number(x);
  } else if (type == MegatronDest::kBool) {
    if (v == "true" || v == "True" || v == "1") return "true";
    if (v == "false" || v == "False" || v == "0") return "false";
  }
  return wandb_json_string(v);
}

// Megatron's default as printed by Python: None, True/False, numbers, lists, strings.
std::string json_default(const MegatronDest& d) {
  const std::string v = d.default_value;
  if (v == "None") return "null";
  if (v == "True") return "true";
  if (v == "False") return "false";
  if (v.size() >= 2 && v.front() == '[' && v.back() == ']') {
    std::string inner = v.substr(1, v.size() - 2), out = "[";
    size_t start = 0;
    while (start < inner.size()) {
      size_t comma = inner.find(',', start);
      if (comma == std::string::npos) comma = inner.size();
      std::string item = inner.substr(start, comma - start);
      while (!item.empty() && item.front() == ' ') item.erase(0, 1);
      if (out.size() > 1) out += ", ";
      out += json_value(item, d.type == MegatronDest::kString ? MegatronDest::kString : d.type);
      start = comma + 1;
    }
    return out + "]";
  }
  if (d.type == MegatronDest::kString && d.kind != MegatronDest::kValue) return wandb_json_string(v);
  return json_value(v, d.type);
}

std::string dest_of_flag(const std::string& flag) {
  std::string d = flag.substr(2);
  for (char& c : d)
    if (c == '-') c = '_';
  return d;
}

}  // namespace

WandbItems wandb_config_items(const std::vector<std::string>& argv) {
  // flag -> the values that followed its last occurrence
  std::map<std::string, std::vector<std::string>> given;
  std::vector<std::string> order;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (!is_flag(argv[i])) continue;
    std::string flag = argv[i];
    std::vector<std::string> values;
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) {
      values.push_back(flag.substr(eq + 1));
      flag.resize(eq);
    } else {
      while (i + 1 < argv.size() && !is_flag(argv[i + 1])) values.push_back(argv[++i]);
    }
    if (!given.count(flag)) order.push_back(flag);
    given[flag] = values;
  }
  WandbItems items;
  std::set<std::string> megatron_flags, seen_dests;
  for (const MegatronDest& d : megatron_dests()) {
    megatron_flags.insert(d.flag);
    if (!seen_dests.insert(d.dest).second) continue;  // several flags of one dest: the first wins
    auto it = given.find(d.flag);
    std::string value;
    if (it == given.end()) {
      value = json_default(d);
    } else if (d.kind == MegatronDest::kTrue) {
      value = "true";
    } else if (d.kind == MegatronDest::kFalse) {
      value = "false";
    } else if (d.kind == MegatronDest::kList && it->second.size() == 1 &&
               (std::string(d.dest) == "moe_router_load_balancing_type" || std::string(d.dest) == "moe_aux_loss_coeff")) {
      value = json_value(it->second.back(), d.type);  // Megatron's validate_args: a one-element list is a scalar
    } else if (d.kind == MegatronDest::kList) {
      value = "[";
      for (const std::string& v : it->second) value += (value.size() > 1 ? ", " : "") + json_value(v, d.type);
      value += "]";
    } else {
      value = it->second.empty() ? "null" : json_value(it->second.back(), d.type);
    }
    items.emplace_back(d.dest, value);
  }
  for (const std::string& flag : order) {  // Gale's and MindSpeed's own flags
    if (megatron_flags.count(flag)) continue;
    const std::string dest = dest_of_flag(flag);
    if (!seen_dests.insert(dest).second) continue;
    const std::vector<std::string>& v = given[flag];
    std::string value;
    if (v.empty()) {
      value = "true";
    } else if (v.size() == 1) {
      value = json_value(v[0], MegatronDest::kFloat);
    } else {
      value = "[";
      for (const std::string& x : v) value += (value.size() > 1 ? ", " : "") + json_value(x, MegatronDest::kFloat);
      value += "]";
    }
    items.emplace_back(dest, value);
  }
  return items;
}

std::string wandb_key_of_tensorboard_tag(std::string_view tag) {
  auto ends_with = [&](std::string_view s) { return tag.size() >= s.size() && tag.substr(tag.size() - s.size()) == s; };
  if (ends_with(" vs samples") || ends_with(" validation ppl")) return "";
  if (tag == "decoupled-learning-rate" || tag.substr(0, 4) == "mem-") return "";
  if (ends_with("-time") && tag != "iteration-time") return "";
  return std::string(tag);
}

void WandbScalarMirror::operator()(std::string_view tag, double value, int64_t step) {
  if (tag == "lm loss") lm_loss_iteration_ = step;
  if (tag == "lm loss vs samples" && lm_loss_iteration_ >= 0) {
    writer_->log("samples vs steps", static_cast<double>(step), lm_loss_iteration_);
    return;
  }
  const std::string key = wandb_key_of_tensorboard_tag(tag);
  if (!key.empty()) writer_->log(key, value, step);
}

}  // namespace gale
