// `gale pretrain --auto-parallel`: MindSpeed's automatic parallelism (its legacy search) on Gale's
// auto-settings models. Instead of training: the profiling runs and the fitted memory and
// step-time models of --auto-settings (train/auto_settings.h), for the world of --nnodes ×
// --nproc-per-node ranks; the layouts that fit the memory limit; then Thompson sampling
// (train/auto_parallel_search.h): real runs of the sampled layouts on that world (4 iterations,
// the command line's model and batch, `mpiexec -np W`) until the draw picks a layout already run
// or --auto-parallel-max-trials runs; writes --auto-settings-work-dir/auto_parallel.json
// (docs/formats/auto-settings.md) and prints the fastest measured layout's command line.
#pragma once

#include "train/arg_parser.h"
#include "train/arguments.h"

namespace gale {

class FeatureRegistry;

// The process exit code: 0 after writing the result, 2 for a command-line error, 1 when a
// profiling run fails or no layout ran.
int auto_parallel_main(const ArgParser& parser, Arguments& args, FeatureRegistry& registry, int argc, char** argv);

}  // namespace gale
