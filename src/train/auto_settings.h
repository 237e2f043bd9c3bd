// `gale pretrain --auto-settings` (and `gale auto-settings`): MindSpeed's AutoSettingsFeature.
//
// Instead of training: (1) profile: small real runs of this model (`gale pretrain --prof-file`,
// under mpiexec when they use more than one rank) at 1 and 2 layers for TP = CP = 1 and, with
// --nproc-per-node 2 or more, TP = 2 and CP = 2, each pipeline and data-parallel size 1, the
// target's micro-batch size and sequence length, 2 micro-batches, 4 iterations;
// (2) fit the memory and step-time models to them (train/auto_settings_model.h); (3) search every
// layout of --auto-settings-ranks ranks on --target-nnodes nodes (train/auto_settings_search.h);
// (4) write --auto-settings-work-dir/auto_settings.json (docs/formats/auto-settings.md) and print
// the ranking and the best command line. docs/auto_settings.md describes it all.
//
// Profiling runs are started with $GALE_MPIEXEC (default: the mpiexec Gale was built with) and
// `-np N`; Open MPI options such as oversubscription come from the environment (OMPI_MCA_*).
#pragma once

#include <string>
#include <vector>

#include "train/arg_parser.h"
#include "train/arguments.h"

namespace gale {

class FeatureRegistry;

// The process exit code: 0 after writing the result, 2 for a command-line error, 1 when a
// profiling run fails (naming its log file) or no layout fits.
int auto_settings_main(const ArgParser& parser, Arguments& args, FeatureRegistry& registry, int argc, char** argv);

// The flags of --auto-settings and --auto-parallel themselves (dropped from the runs they start
// and from the printed command line).
const std::vector<std::string>& auto_flags();

// Command-line editing for the profiling runs and the printed best command line: `tokens` is
// argv after the subcommand. remove_flag drops every occurrence of `flag` ("--flag v1 v2" up to the
// next token starting with "--", and "--flag=v"); set_flag removes it and appends "flag value".
void remove_flag(std::vector<std::string>& tokens, const std::string& flag);
void set_flag(std::vector<std::string>& tokens, const std::string& flag, const std::string& value);
// The command line as a shell would need it (tokens with spaces or quotes single-quoted).
std::string shell_join(const std::vector<std::string>& tokens);


}  // namespace gale
