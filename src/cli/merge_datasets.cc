// `gale merge-datasets`: Megatron's tools/merge_datasets.py.
#include <cstdio>

#include "cli/subcommands.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "train/arg_parser.h"

namespace gale::cli {

int run_merge_datasets(int argc, char** argv) {
  ArgParser p("gale merge-datasets",
              "Concatenate every PREFIX.bin/.idx in a directory (sorted by prefix) into one dataset");
  std::string input, output_prefix;
  p.group("input data");
  p.add("--input", &input, "directory holding the .bin/.idx pairs to merge");
  p.group("output data");
  p.add("--output-prefix", &output_prefix, "output prefix (writes PREFIX.bin and PREFIX.idx)");
  p.group("miscellaneous");
  p.add_unsupported("--multimodal", "multimodal indexed datasets");
  Status s = p.parse(argc, argv);
  if (s.ok() && p.help_requested()) {
    std::printf("%s", p.help_text().c_str());
    return 0;
  }
  if (s.ok() && input.empty()) s = InvalidArgument("--input is required");
  if (s.ok() && output_prefix.empty()) s = InvalidArgument("--output-prefix is required");
  if (!s.ok()) {
    std::fprintf(stderr, "gale merge-datasets: %s\n", s.message().c_str());
    return 2;
  }
  auto merged = merge_datasets(input, output_prefix);
  if (!merged.ok()) {
    std::fprintf(stderr, "gale merge-datasets: %s\n", merged.status().message().c_str());
    return 1;
  }
  auto out = IndexedDataset::open(output_prefix);
  if (!out.ok()) {
    std::fprintf(stderr, "gale merge-datasets: %s\n", out.status().message().c_str());
    return 1;
  }
  std::printf("merged %zu datasets into %s: %lld documents, %lld sequences, %lld tokens (%s)\n", merged->size(),
              output_prefix.c_str(), static_cast<long long>((*out)->num_documents()),
              static_cast<long long>((*out)->num_sequences()), static_cast<long long>((*out)->total_tokens()),
              token_dtype_name((*out)->dtype()));
  return 0;
}

}  // namespace gale::cli
