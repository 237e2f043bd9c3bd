// MindSpeed's auto-settings flags (AutoSettingsFeature; features/feature_auto_settings.cc,
// train/auto_settings.h) and --prof-file.
#include <cmath>

#include "train/arguments.h"

namespace gale {

void add_auto_settings_args(ArgParser& p, AutoSettingsArgs& a) {
  p.group("auto settings");
  p.add_flag("--auto-settings", &a.auto_settings,
             "MindSpeed's auto settings: instead of training, run small profiling runs of this model on the local "
             "ranks (--nproc-per-node), fit a memory and a step-time model to them, search the TP/CP/PP/DP layouts of "
             "--auto-settings-ranks ranks on --target-nnodes nodes that fit the memory limit, write the ranking to "
             "--auto-settings-work-dir and print the best command line (docs/auto_settings.md)");
  p.add_choice("--auto-settings-type", &a.auto_settings_type, {"white", "black", "mixed"},
               "--auto-settings: search scheme (Gale: white, the models fitted to the profiling runs; black and mixed: "
               "not supported yet)");
  p.add("--auto-settings-work-dir", &a.auto_settings_work_dir,
        "--auto-settings / --auto-parallel: the directory for the profiles, the runs' logs and auto_settings.json / "
        "auto_parallel.json (default: the current directory)");
  p.add("--auto-settings-ranks", &a.auto_settings_ranks, "--auto-settings: the world size to search layouts for");
  p.add_choice("--auto-settings-log-level", &a.auto_settings_log_level, {"warning", "info", "debug"},
               "--auto-settings / --auto-parallel: what it prints (debug: every candidate layout)");
  p.add("--target-nnodes", &a.target_nnodes,
        "--auto-settings: the nodes of the target cluster (--auto-settings-ranks / --target-nnodes ranks per node; "
        "groups that span nodes pay the inter-node bandwidth)");
  p.add("--nproc-per-node", &a.nproc_per_node,
        "--auto-settings / --auto-parallel: the ranks per node (the profiling runs use up to this many; default 2)");
  p.add("--auto-settings-memory-limit-gib", &a.auto_settings_memory_limit_gib,
        "Gale: --auto-settings / --auto-parallel: the memory a rank may use, GiB (default: this host's memory / "
        "--nproc-per-node)");
  p.add("--auto-settings-inter-node-bandwidth-ratio", &a.auto_settings_inter_node_bandwidth_ratio,
        "Gale: --auto-settings: inter-node bandwidth as a fraction of the intra-node bandwidth the profiling runs "
        "measure (default 0.25)");
  p.add_flag("--auto-parallel", &a.auto_parallel,
             "MindSpeed's automatic parallelism: instead of training, profile and fit as --auto-settings, then run the "
             "layouts of --nnodes × --nproc-per-node ranks that fit the memory, chosen by Thompson sampling over the "
             "predicted step times, and print the fastest measured one (docs/auto_settings.md)");
  p.add("--nnodes", &a.nnodes, "--auto-parallel: the nodes of the world it runs the layouts on (default 1)");
  p.add("--auto-parallel-max-trials", &a.auto_parallel_max_trials,
        "Gale: --auto-parallel: real runs of candidate layouts at most (default 8)");
  p.add("--prof-file", &a.prof_file,
        "write this run's profile (step time, forward-backward and optimizer time, exact peak and persistent bytes, "
        "communication bytes per group; JSON, docs/formats/auto-settings.md) to this file at the end of training");
}

Status validate_auto_settings_args(const Arguments& args, const ArgParser& p) {
  const AutoSettingsArgs& a = args.auto_settings;
  if (a.auto_settings && a.auto_parallel) return InvalidArgument("--auto-parallel: conflicts with --auto-settings");
  if (!a.auto_settings) {
    for (const char* flag : {"--auto-settings-type", "--auto-settings-ranks", "--target-nnodes",
                             "--auto-settings-inter-node-bandwidth-ratio"})
      if (p.was_set(flag)) return InvalidArgument(flag, ": only with --auto-settings");
  }
  if (!a.auto_parallel) {
    for (const char* flag : {"--nnodes", "--auto-parallel-max-trials"})
      if (p.was_set(flag)) return InvalidArgument(flag, ": only with --auto-parallel");
  }
  if (!a.auto_settings && !a.auto_parallel) {
    for (const char* flag : {"--auto-settings-work-dir", "--auto-settings-log-level", "--nproc-per-node",
                             "--auto-settings-memory-limit-gib"})
      if (p.was_set(flag)) return InvalidArgument(flag, ": only with --auto-settings or --auto-parallel");
    return Status::Ok();
  }
  const char* self = a.auto_settings ? "--auto-settings" : "--auto-parallel";
  if (a.nproc_per_node < 1)
    return InvalidArgument("--nproc-per-node: expected a positive number of local ranks, found ", a.nproc_per_node);
  if (!(a.auto_settings_memory_limit_gib >= 0.0) || !std::isfinite(a.auto_settings_memory_limit_gib))
    return InvalidArgument("--auto-settings-memory-limit-gib: expected a non-negative size, found ",
                           a.auto_settings_memory_limit_gib);
  if (!a.prof_file.empty())
    return InvalidArgument("--prof-file: conflicts with ", self, " (it sets each run's file itself)");
  if (a.auto_parallel) {
    if (a.nnodes < 1) return InvalidArgument("--nnodes: expected a positive number of nodes, found ", a.nnodes);
    if (a.auto_parallel_max_trials < 1)
      return InvalidArgument("--auto-parallel-max-trials: expected a positive number of runs, found ",
                             a.auto_parallel_max_trials);
    return Status::Ok();
  }
  if (a.auto_settings_type != "white")
    return Unimplemented("--auto-settings-type ", a.auto_settings_type,
                         ": not supported yet (Gale's auto settings search is white: the memory and step-time models "
                         "fitted to the profiling runs)");
  if (a.auto_settings_ranks < 1)
    return InvalidArgument("--auto-settings-ranks: expected a positive number of ranks, found ", a.auto_settings_ranks);
  if (a.target_nnodes < 1)
    return InvalidArgument("--target-nnodes: expected a positive number of nodes, found ", a.target_nnodes);
  if (a.auto_settings_ranks % a.target_nnodes != 0)
    return InvalidArgument("--target-nnodes: expected a divisor of --auto-settings-ranks ", a.auto_settings_ranks,
                           " (ranks per node), found ", a.target_nnodes);
  const double r = a.auto_settings_inter_node_bandwidth_ratio;
  if (!(r > 0.0 && r <= 1.0))
    return InvalidArgument("--auto-settings-inter-node-bandwidth-ratio: expected a fraction in (0, 1], found ", r);
  return Status::Ok();
}

}  // namespace gale
