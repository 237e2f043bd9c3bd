// The table of `gale` subcommands; each lives in its own cli/<name>.cc.
#pragma once

#include <vector>

namespace gale::cli {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);  // argv[0] is the subcommand name
};

const std::vector<Subcommand>& subcommands();

// Each subcommand file defines one of these.
int run_pretrain(int argc, char** argv);
int run_generate(int argc, char** argv);
int run_evaluate(int argc, char** argv);
int run_convert(int argc, char** argv);
int run_preprocess(int argc, char** argv);
int run_merge_datasets(int argc, char** argv);
int run_data_samples(int argc, char** argv);
int run_features(int argc, char** argv);
int run_layout(int argc, char** argv);
int run_auto_settings(int argc, char** argv);

}  // namespace gale::cli
