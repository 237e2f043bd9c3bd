// `gale generate`: text from a checkpoint (see train/generate.h).
#include "cli/subcommands.h"
#include "train/generate.h"

namespace gale::cli {

int run_generate(int argc, char** argv) { return generate_main(argc, argv); }

}  // namespace gale::cli
