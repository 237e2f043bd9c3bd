// `gale evaluate`: benchmarks of a checkpoint (see train/evaluate.h).
#include "cli/subcommands.h"
#include "train/evaluate.h"

namespace gale::cli {

int run_evaluate(int argc, char** argv) { return evaluate_main(argc, argv); }

}  // namespace gale::cli
