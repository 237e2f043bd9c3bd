// The registry of subcommands, in the order `gale --help` lists them.
#include "cli/subcommands.h"

namespace gale::cli {

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> table = {
      {"pretrain", "train a GPT/LLaMA-style model (Megatron's pretrain_gpt.py flags)", run_pretrain},
      {"preprocess", "tokenize a jsonl corpus into .bin/.idx datasets (Megatron's preprocess_data.py)", run_preprocess},
      {"merge-datasets", "concatenate .bin/.idx datasets (Megatron's merge_datasets.py)", run_merge_datasets},
      {"data-samples", "print the training samples `gale pretrain` reads, as JSON lines", run_data_samples},
      {"generate", "generate text from a checkpoint (greedy, temperature, top-k, top-p)", run_generate},
      {"evaluate", "score a checkpoint on MMLU-style multiple choice or the perplexity of a corpus", run_evaluate},
      {"convert", "convert Hugging Face checkpoints (GPT-2, LLaMA, Qwen2, Mistral, Mixtral) to Gale checkpoints and back",
       run_convert},
      {"features", "list the acceleration features and which a command line turns on", run_features},
      {"auto-settings", "profile small runs, model memory and step time, and search the parallel layout for a cluster "
       "(`gale pretrain --auto-settings`)", run_auto_settings},
      {"layout", "print the rank layout and process groups for a world size and TP/PP/CP/EP sizes", run_layout},
  };
  return table;
}

}  // namespace gale::cli
