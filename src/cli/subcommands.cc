// The registry of subcommands, in the order `gale --help` lists them.
#include "cli/subcommands.h"

namespace gale::cli {

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> table = {
      {"pretrain", "train a GPT/LLaMA-style model (Megatron's pretrain_gpt.py flags)", run_pretrain},
      {"features", "list the acceleration features and which a command line turns on", run_features},
      {"layout", "print the rank layout and process groups for a world size and TP/PP/CP/EP sizes", run_layout},
  };
  return table;
}

}  // namespace gale::cli
