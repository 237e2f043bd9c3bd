// The `gale` binary: dispatches `gale <subcommand> [flags...]` to the subcommand registry.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/subcommands.h"

int main(int argc, char** argv) {
  const auto& table = gale::cli::subcommands();
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::printf("usage: gale <subcommand> [flags...]\n\nsubcommands:\n");
    for (const auto& sc : table) std::printf("  %-16s %s\n", sc.name, sc.summary);
    std::printf("\n`gale <subcommand> --help` lists a subcommand's flags.\n");
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("gale %s\n", GALE_VERSION);
    return 0;
  }
  for (const auto& sc : table) {
    if (argv[1] == std::string(sc.name)) return sc.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "gale: unknown subcommand '%s' (run `gale --help` for the list)\n", argv[1]);
  return 2;
}
