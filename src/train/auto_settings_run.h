// What --auto-settings and --auto-parallel share (train/auto_settings.h, train/auto_parallel.h):
// the start-up checks, the profiling runs, the target and search space from the command line,
// starting real runs under mpiexec, and the JSON of models and candidates.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/arg_parser.h"
#include "train/arguments.h"
#include "train/auto_settings_model.h"
#include "train/auto_settings_profile.h"
#include "train/auto_settings_search.h"

namespace gale {

class FeatureRegistry;

struct AutoRun {
  std::string flag;                // "--auto-settings" or "--auto-parallel", for messages
  std::string work_dir, exe, mpiexec;
  int64_t threads = 1;             // --num-threads of every run started
  int64_t local_ranks = 1;         // --nproc-per-node
  double memory_limit = 0;         // bytes per rank
  bool verbose = true;
  std::vector<std::string> base;   // argv after the subcommand, without the auto flags
  nlohmann::ordered_json profiles = nlohmann::ordered_json::array();  // what run_profiling ran
};

// Start-up: one process, the command line valid for `world` ranks (features resolved), the
// combinations the models do not cover refused, the work directory created. Returns 0, or the
// exit code after printing the one-line error.
int prepare_auto_run(const char* flag, int64_t world, const ArgParser& parser, Arguments& args, FeatureRegistry& registry,
                     int argc, char** argv, AutoRun* run);

// The profiling runs (train/auto_settings.h), their profiles in run order; an error names the
// failing run's log file.
StatusOr<std::vector<RunProfile>> run_profiling(const Arguments& args, AutoRun& run);

// `tokens` (argv after the subcommand) with the layout flags of `l`.
std::vector<std::string> with_layout(std::vector<std::string> tokens, const AutoLayout& l);
// `gale pretrain` with `tokens` under `mpiexec -np np` (alone when np is 1), output to `log`;
// the exit status (-1: not started or killed).
int run_pretrain_logged(const AutoRun& run, int64_t np, const std::vector<std::string>& tokens, const std::string& log);

AutoTarget make_auto_target(const Arguments& args, int64_t ranks, int64_t nnodes, double inter_node_ratio);
AutoSearchSpace make_auto_space(const Arguments& args, int64_t world, double memory_limit);

nlohmann::ordered_json models_json(const AutoModels& m);
nlohmann::ordered_json candidate_json(const AutoCandidate& c);
// What auto_settings.json and auto_parallel.json begin with: magic, version, `type` (left out when
// empty), `target`, the profiles run, the fitted models, every candidate (the fitting ones ranked
// first, then those over the memory limit) and the layouts excluded.
nlohmann::ordered_json search_result_json(const std::string& magic, int version, const std::string& type,
                                          nlohmann::ordered_json target, const AutoRun& run, const AutoModels& m,
                                          const AutoSearchResult& found);
// Writes `result` (indented JSON) to work_dir/name (*path); false, with "gale pretrain: error:
// --auto-settings-work-dir: cannot write PATH" on stderr, when it cannot.
bool write_result_json(const std::string& work_dir, const std::string& name, const nlohmann::ordered_json& result,
                       std::string* path);
std::string layout_name(const AutoLayout& l);
std::string gib(double bytes);
std::string auto_fixed(double v, int digits);  // "%.*f"

}  // namespace gale
