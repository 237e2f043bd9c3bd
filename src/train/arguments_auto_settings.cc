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
        "--auto-settings: the directory for the profiles, their logs and auto_settings.json (default: the current "
        "directory)");
  p.add("--auto-settings-ranks", &a.auto_settings_ranks, "--auto-settings: the world size to search layouts for");
  p.add_choice("--auto-settings-log-level", &a.auto_settings_log_level, {"warning", "info", "debug"},
               "--auto-settings: what it prints (debug: every candidate layout)");
  p.add("--target-nnodes", &a.target_nnodes,
        "--auto-settings: the nodes of the target cluster (--auto-settings-ranks / --target-nnodes ranks per node; "
        "groups that span nodes pay the inter-node bandwidth)");
  p.add("--nproc-per-node", &a.nproc_per_node,
        "--auto-settings: the local ranks the profiling runs may use (mpiexec -np up to this; default 2)");
  p.add("--auto-settings-memory-limit-gib", &a.auto_settings_memory_limit_gib,
        "Gale: --auto-settings: the memory a rank of the target may use, GiB (default: this host's memory / "
        "--nproc-per-node)");
  p.add("--auto-settings-inter-node-bandwidth-ratio", &a.auto_settings_inter_node_bandwidth_ratio,
        "Gale: --auto-settings: inter-node bandwidth as a fraction of the intra-node bandwidth the profiling runs "
        "measure (default 0.25)");
  p.add("--prof-file", &a.prof_file,
        "write this run's profile (step time, forward-backward and optimizer time, exact peak and persistent bytes, "
        "communication bytes per group; JSON, docs/formats/auto-settings.md) to this file at the end of training");
}

Status validate_auto_settings_args(const Arguments& args, const ArgParser& p) {
  const AutoSettingsArgs& a = args.auto_settings;
  if (!a.auto_settings) {
    for (const char* flag :
         {"--auto-settings-type", "--auto-settings-work-dir", "--auto-settings-ranks", "--auto-settings-log-level",
          "--target-nnodes", "--nproc-per-node", "--auto-settings-memory-limit-gib",
          "--auto-settings-inter-node-bandwidth-ratio"})
      if (p.was_set(flag)) return InvalidArgument(flag, ": only with --auto-settings");
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
  if (a.nproc_per_node < 1)
    return InvalidArgument("--nproc-per-node: expected a positive number of local ranks, found ", a.nproc_per_node);
  if (!(a.auto_settings_memory_limit_gib >= 0.0) || !std::isfinite(a.auto_settings_memory_limit_gib))
    return InvalidArgument("--auto-settings-memory-limit-gib: expected a non-negative size, found ",
                           a.auto_settings_memory_limit_gib);
  const double r = a.auto_settings_inter_node_bandwidth_ratio;
  if (!(r > 0.0 && r <= 1.0))
    return InvalidArgument("--auto-settings-inter-node-bandwidth-ratio: expected a fraction in (0, 1], found ", r);
  if (!a.prof_file.empty())
    return InvalidArgument("--prof-file: conflicts with --auto-settings (it sets each profiling run's file itself)");
  return Status::Ok();
}

}  // namespace gale
