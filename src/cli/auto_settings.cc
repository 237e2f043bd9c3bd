// `gale auto-settings`: `gale pretrain --auto-settings` (train/auto_settings.h).
#include <string>
#include <vector>

#include "cli/subcommands.h"
#include "train/pretrain.h"

namespace gale::cli {

int run_auto_settings(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  args[0] = "pretrain";
  bool help = false;
  for (const std::string& a : args) help = help || a == "--help" || a == "-h";
  if (!help) args.push_back("--auto-settings");
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  return pretrain_main(static_cast<int>(args.size()), ptrs.data());
}

}  // namespace gale::cli
