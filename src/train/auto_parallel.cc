// `gale pretrain --auto-parallel` (see the header).
#include "train/auto_parallel.h"

#include <cstdio>
#include <fstream>
#include <map>

#include "core/log.h"
#include "train/auto_parallel_search.h"
#include "train/auto_settings.h"
#include "train/auto_settings_run.h"

namespace gale {

namespace {

constexpr const char* kResultMagic = "gale-auto-parallel";
constexpr int kResultVersion = 1;
constexpr int kTrialIters = 4;
constexpr uint64_t kSeed = 1234;

std::string stem_of(const AutoRun& run, const AutoLayout& l) {
  return str_cat(run.work_dir, "/trial_tp", l.tp, "_cp", l.cp, "_pp", l.pp, "_dp", l.dp);
}

}  // namespace

int auto_parallel_main(const ArgParser& parser, Arguments& args, FeatureRegistry& registry, int argc, char** argv) {
  const AutoSettingsArgs& as = args.auto_settings;
  const int64_t world = as.nnodes * as.nproc_per_node;
  AutoRun run;
  if (int rc = prepare_auto_run("--auto-parallel", world, parser, args, registry, argc, argv, &run)) return rc;
  StatusOr<std::vector<RunProfile>> profiles = run_profiling(args, run);
  if (!profiles.ok()) {
    std::fprintf(stderr, "gale pretrain: error: %s\n", profiles.status().message().c_str());
    return 1;
  }
  // Inter-node traffic at the default ratio: the trials measure the real one.
  const AutoTarget target = make_auto_target(args, world, as.nnodes, 0.25);
  StatusOr<AutoModels> fitted = fit_auto_models(profiles.value(), target);
  if (!fitted.ok()) {
    std::fprintf(stderr, "gale pretrain: error: %s\n", fitted.status().message().c_str());
    return 1;
  }
  const AutoModels& m = fitted.value();
  const AutoSearchResult found = search_layouts(m, make_auto_space(args, world, run.memory_limit));
  if (run.verbose)
    print_rank0(str_cat("auto parallel: ", found.ranked.size(), " layouts of ", world, " ranks fit ", gib(run.memory_limit),
                        " per rank; running up to ", as.auto_parallel_max_trials, " of them"));

  std::vector<std::string> base = run.base;
  for (const char* f : {"--save", "--load", "--save-interval", "--tensorboard-dir", "--exit-interval",
                        "--exit-duration-in-mins", "--train-samples", "--rampup-batch-size", "--eval-interval",
                        "--prof-file", "--wandb-project", "--log-progress"})
    remove_flag(base, f);
  std::map<std::string, int64_t> measured_peak;
  auto runner = [&](const AutoLayout& l) -> StatusOr<double> {
    const std::string stem = stem_of(run, l);
    std::vector<std::string> tokens = with_layout(base, l);
    set_flag(tokens, "--train-iters", std::to_string(kTrialIters));
    set_flag(tokens, "--eval-iters", "0");
    set_flag(tokens, "--log-interval", std::to_string(kTrialIters + 1));
    set_flag(tokens, "--timing-log-level", "1");
    set_flag(tokens, "--num-threads", std::to_string(run.threads));
    set_flag(tokens, "--prof-file", stem + ".json");
    const int rc = run_pretrain_logged(run, world, tokens, stem + ".log");
    if (rc != 0) return InvalidArgument("exit ", rc, "; its output is in ", stem, ".log");
    GALE_ASSIGN_OR_RETURN(RunProfile p, read_profile(stem + ".json"));
    measured_peak[stem] = p.max_peak_bytes();
    if (run.verbose)
      print_rank0(str_cat("  ran ", layout_name(l), ": step ", auto_fixed(p.step_seconds, 4), " s, peak ",
                          gib(static_cast<double>(p.max_peak_bytes()))));
    return p.step_seconds;
  };
  const AutoParallelResult result =
      thompson_search(found.ranked, static_cast<int>(as.auto_parallel_max_trials), kSeed, runner);

  nlohmann::ordered_json j = search_result_json(
      kResultMagic, kResultVersion, "",
      {{"ranks", world}, {"nnodes", as.nnodes}, {"ranks_per_node", as.nproc_per_node}}, run, m, found);
  nlohmann::ordered_json trials = nlohmann::ordered_json::array();
  for (const AutoParallelTrial& t : result.trials) {
    const std::string stem = stem_of(run, t.layout);
    nlohmann::ordered_json o = {{"tp", t.layout.tp}, {"cp", t.layout.cp}, {"pp", t.layout.pp}, {"dp", t.layout.dp},
                                {"predicted_seconds", t.predicted_seconds}, {"measured_seconds", t.measured_seconds},
                                {"log", stem + ".log"}};
    o["peak_bytes"] = measured_peak.count(stem) ? measured_peak[stem] : -1;
    if (!t.error.empty()) o["error"] = t.error;
    trials.push_back(o);
  }
  j["trials"] = trials;
  j["converged"] = result.converged;
  std::vector<std::string> best_cmd;
  if (result.best >= 0) {
    const AutoLayout& b = result.trials[static_cast<size_t>(result.best)].layout;
    const std::vector<std::string> tokens = with_layout(run.base, b);
    best_cmd = {"mpiexec", "-np", std::to_string(world), "gale", "pretrain"};
    best_cmd.insert(best_cmd.end(), tokens.begin(), tokens.end());
    j["best"] = {{"tp", b.tp}, {"cp", b.cp}, {"pp", b.pp}, {"dp", b.dp},
                 {"measured_seconds", result.trials[static_cast<size_t>(result.best)].measured_seconds},
                 {"command", shell_join(best_cmd)}};
  } else {
    j["best"] = nullptr;
  }
  std::string path;
  if (!write_result_json(run.work_dir, "auto_parallel.json", j, &path)) return 1;
  print_rank0(str_cat("auto parallel: ", result.trials.size(), " runs (", result.converged ? "converged" : "stopped at the limit",
                      "); result written to ", path));
  if (best_cmd.empty()) {
    std::fprintf(stderr, "gale pretrain: error: --auto-parallel: no layout of %lld ranks ran (%zu fit the memory limit)\n",
                 static_cast<long long>(world), found.ranked.size());
    return 1;
  }
  print_rank0(str_cat("auto parallel: fastest measured layout ",
                      layout_name(result.trials[static_cast<size_t>(result.best)].layout), ":"));
  print_rank0(shell_join(best_cmd));
  return 0;
}

}  // namespace gale
