// `gale features`: which acceleration features a command line turns on, and why others are off.
#include <cstdio>
#include <cstring>

#include "cli/subcommands.h"
#include "features/registry.h"
#include "train/arg_parser.h"
#include "train/arguments.h"

namespace gale::cli {

int run_features(int argc, char** argv) {
  ArgParser parser("gale features",
                   "List every feature with its module, level and flag, and whether it is active for the given "
                   "--optimization-level and flags (any `gale pretrain` flag is accepted).");
  Arguments args;
  add_all_pretrain_args(parser, args);
  auto registry = make_feature_registry();
  registry->register_args(parser);
  bool markdown = false;
  parser.group("output");
  parser.add_flag("--markdown", &markdown, "print docs/features.md instead of the table");
  Status st = parser.parse(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "gale features: error: %s\n", st.message().c_str());
    return 2;
  }
  if (parser.help_requested()) {
    std::printf("%s", parser.help_text().c_str());
    return 0;
  }
  if (markdown) {
    std::printf("%s", registry->format_markdown().c_str());
    return 0;
  }
  FeatureContext ctx = make_feature_context(args, parser, *registry);
  std::vector<std::string> notices;
  st = registry->resolve(ctx, &notices);
  std::printf("optimization level %d, CPU ISA %s\n\n%s", ctx.optimization_level, ctx.cpu_isa.c_str(),
              registry->format_table().c_str());
  for (const std::string& n : notices) std::printf("note: %s\n", n.c_str());
  if (!st.ok()) {
    std::fprintf(stderr, "gale features: error: %s\n", st.message().c_str());
    return 2;
  }
  return 0;
}

}  // namespace gale::cli
