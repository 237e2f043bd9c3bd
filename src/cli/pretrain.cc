// `gale pretrain`: Megatron's pretrain_gpt.py (see train/pretrain.h).
#include "cli/subcommands.h"
#include "train/pretrain.h"

namespace gale::cli {

int run_pretrain(int argc, char** argv) { return pretrain_main(argc, argv); }

}  // namespace gale::cli
