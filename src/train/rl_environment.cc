// GRPO's built-in rule-based environments: the config, the JSONL prompts and the rewards (train/rl_environment.h).
#include "train/rl_environment.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/jsonl_reader.h"

namespace gale {

namespace {

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

double RlEnvironment::reward(int64_t index, const std::string& completion) const {
  const std::string got = trim(completion), want = trim(prompts.at(static_cast<size_t>(index)).answer);
  if (kind == "exact_match") return got == want ? 1.0 : 0.0;
  return got.find(want) != std::string::npos ? 1.0 : 0.0;  // contains
}

StatusOr<RlEnvironment> load_rl_environment(const std::string& config_path) {
  const std::string where = "--langrl-env-config " + config_path;
  YAML::Node root;
  try {
    root = YAML::LoadFile(config_path);
  } catch (const YAML::BadFile&) {
    return NotFound(where, ": cannot open the file");
  } catch (const YAML::Exception& e) {
    return InvalidArgument(where, ": expected YAML or JSON, found a syntax error: ", e.what());
  }
  if (!root.IsMap()) return InvalidArgument(where, ": expected a mapping of environment, data, ... at the top");
  RlEnvironment env;
  std::string prompt_key = "prompt", answer_key = "answer", data;
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      if (key == "environment") env.kind = kv.second.as<std::string>();
      else if (key == "data") data = kv.second.as<std::string>();
      else if (key == "prompt_key") prompt_key = kv.second.as<std::string>();
      else if (key == "answer_key") answer_key = kv.second.as<std::string>();
      else if (key == "max_new_tokens") env.max_new_tokens = kv.second.as<int64_t>();
      else if (key == "max_k") env.max_k = kv.second.as<int64_t>();
      else
        return InvalidArgument(where, ": unknown key '", key,
                               "' (expected environment, data, prompt_key, answer_key, max_new_tokens, max_k)");
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgument(where, ": a value of the wrong type: ", e.what());
  }
  if (env.kind != "exact_match" && env.kind != "contains")
    return InvalidArgument(where, ": environment: expected exact_match or contains, found '", env.kind, "'");
  if (data.empty()) return InvalidArgument(where, ": data: expected the JSONL file of prompts, found none");
  if (env.max_new_tokens < 0)
    return InvalidArgument(where, ": max_new_tokens: expected a non-negative number, found ", env.max_new_tokens);
  if (env.max_k < 1) return InvalidArgument(where, ": max_k: expected a positive number, found ", env.max_k);
  std::filesystem::path p(data);
  if (p.is_relative()) p = std::filesystem::path(config_path).parent_path() / p;
  env.data_path = p.string();
  GALE_ASSIGN_OR_RETURN(std::unique_ptr<JsonlReader> reader, JsonlReader::open(env.data_path));
  std::string line;
  while (true) {
    GALE_ASSIGN_OR_RETURN(const bool more, reader->next_line(&line));
    if (!more) break;
    if (trim(line).empty()) continue;
    const std::string at = str_cat(env.data_path, " line ", reader->line_number());
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return InvalidArgument(at, ": expected a JSON object");
    if (!j.contains(prompt_key) || !j[prompt_key].is_string())
      return InvalidArgument(at, ": expected a string field '", prompt_key, "' (the prompt)");
    if (!j.contains(answer_key) || !(j[answer_key].is_string() || j[answer_key].is_number()))
      return InvalidArgument(at, ": expected a string or number field '", answer_key, "' (the answer)");
    RlPrompt r;
    r.prompt = j[prompt_key].get<std::string>();
    r.answer = j[answer_key].is_string() ? j[answer_key].get<std::string>() : j[answer_key].dump();
    env.prompts.push_back(std::move(r));
  }
  if (env.prompts.empty()) return InvalidArgument(env.data_path, ": expected at least one prompt, found none");
  return env;
}

}  // namespace gale
