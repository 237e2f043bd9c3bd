// `gale pretrain --auto-settings`: profile, fit, search, report (see the header).
#include "train/auto_settings.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/status.h"
#include "train/auto_settings_run.h"

namespace gale {

namespace {

constexpr const char* kResultMagic = "gale-auto-settings";
constexpr int kResultVersion = 1;

bool starts_with_dashes(const std::string& t) { return t.size() > 2 && t[0] == '-' && t[1] == '-'; }

}  // namespace

const std::vector<std::string>& auto_flags() {
  static const std::vector<std::string> flags = {
      "--auto-settings", "--auto-settings-type", "--auto-settings-work-dir", "--auto-settings-ranks",
      "--auto-settings-log-level", "--target-nnodes", "--nproc-per-node", "--auto-settings-memory-limit-gib",
      "--auto-settings-inter-node-bandwidth-ratio", "--auto-parallel", "--nnodes", "--auto-parallel-max-trials"};
  return flags;
}

void remove_flag(std::vector<std::string>& tokens, const std::string& flag) {
  std::vector<std::string> out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].rfind(flag + "=", 0) == 0) continue;
    if (tokens[i] != flag) {
      out.push_back(tokens[i]);
      continue;
    }
    while (i + 1 < tokens.size() && !starts_with_dashes(tokens[i + 1])) ++i;
  }
  tokens = std::move(out);
}

void set_flag(std::vector<std::string>& tokens, const std::string& flag, const std::string& value) {
  remove_flag(tokens, flag);
  tokens.push_back(flag);
  tokens.push_back(value);
}

std::string shell_join(const std::vector<std::string>& tokens) {
  std::string out;
  for (const std::string& t : tokens) {
    if (!out.empty()) out += ' ';
    const bool plain = !t.empty() && t.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                                         "-_./=:,+@%") == std::string::npos;
    if (plain) {
      out += t;
      continue;
    }
    out += '\'';
    for (char c : t) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

int auto_settings_main(const ArgParser& parser, Arguments& args, FeatureRegistry& registry, int argc, char** argv) {
  const AutoSettingsArgs& as = args.auto_settings;
  AutoRun run;
  if (int rc = prepare_auto_run("--auto-settings", as.auto_settings_ranks, parser, args, registry, argc, argv, &run))
    return rc;
  // (1) profiling runs
  StatusOr<std::vector<RunProfile>> profiles = run_profiling(args, run);
  if (!profiles.ok()) {
    std::fprintf(stderr, "gale pretrain: error: %s\n", profiles.status().message().c_str());
    return 1;
  }
  // (2) models
  const AutoTarget target =
      make_auto_target(args, as.auto_settings_ranks, as.target_nnodes, as.auto_settings_inter_node_bandwidth_ratio);
  StatusOr<AutoModels> fitted = fit_auto_models(profiles.value(), target);
  if (!fitted.ok()) {
    std::fprintf(stderr, "gale pretrain: error: %s\n", fitted.status().message().c_str());
    return 1;
  }
  const AutoModels& m = fitted.value();
  // (3) search
  const AutoSearchResult found = search_layouts(m, make_auto_space(args, as.auto_settings_ranks, run.memory_limit));
  // (4) result
  std::vector<std::string> best_cmd;
  if (!found.ranked.empty()) {
    const std::vector<std::string> tokens = with_layout(run.base, found.ranked.front().layout);
    best_cmd = {"mpiexec", "-np", std::to_string(as.auto_settings_ranks), "gale", "pretrain"};
    best_cmd.insert(best_cmd.end(), tokens.begin(), tokens.end());
  }
  nlohmann::ordered_json j = search_result_json(
      kResultMagic, kResultVersion, as.auto_settings_type,
      {{"ranks", as.auto_settings_ranks}, {"nnodes", as.target_nnodes}, {"ranks_per_node", target.ranks_per_node}}, run,
      m, found);
  if (!best_cmd.empty()) {
    const AutoLayout& b = found.ranked.front().layout;
    j["best"] = {{"tp", b.tp}, {"cp", b.cp}, {"pp", b.pp}, {"dp", b.dp}, {"command", shell_join(best_cmd)}};
  } else {
    j["best"] = nullptr;
  }
  std::string result_path;
  if (!write_result_json(run.work_dir, "auto_settings.json", j, &result_path)) return 1;
  if (run.verbose) {
    print_rank0(str_cat("auto settings: ", found.ranked.size(), " layouts of ", as.auto_settings_ranks, " ranks (",
                        as.target_nnodes, " nodes) fit ", gib(run.memory_limit), " per rank; ", found.over_memory.size(),
                        " do not; ", found.excluded.size(), " cannot run this model"));
    const bool debug = as.auto_settings_log_level == "debug";
    const size_t shown = debug ? found.ranked.size() : std::min<size_t>(3, found.ranked.size());
    for (size_t i = 0; i < shown; ++i) {
      const AutoCandidate& c = found.ranked[i];
      print_rank0(str_cat("  #", i + 1, " ", layout_name(c.layout), ": step ", auto_fixed(c.prediction.step_seconds, 4),
                          " s, peak ", gib(c.prediction.peak_bytes)));
    }
    if (debug)
      for (const AutoCandidate& c : found.over_memory)
        print_rank0(str_cat("  over memory: ", layout_name(c.layout), ": peak ", gib(c.prediction.peak_bytes)));
  }
  print_rank0(str_cat("auto settings: result written to ", result_path));
  if (best_cmd.empty()) {
    std::fprintf(stderr, "gale pretrain: error: --auto-settings: no layout of %lld ranks fits %s per rank (the smallest "
                 "predicted peak is %s)\n", static_cast<long long>(as.auto_settings_ranks), gib(run.memory_limit).c_str(),
                 found.over_memory.empty() ? "none" : gib(found.over_memory.front().prediction.peak_bytes).c_str());
    return 1;
  }
  print_rank0(str_cat("auto settings: best layout ", layout_name(found.ranked.front().layout), ":"));
  print_rank0(shell_join(best_cmd));
  return 0;
}

}  // namespace gale
