// Test helper: a `gale pretrain` command line parsed, its features resolved by the real registry
// and applied to an op table and a recompute plan (what pretrain hands the engine).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "features/registry.h"

namespace gale {

struct ResolvedFeatures {
  ArgParser parser{"gale pretrain", "test"};
  Arguments args;
  std::unique_ptr<FeatureRegistry> registry = make_feature_registry();
  OpTable ops = reference_ops();
  RecomputePlan recompute;
  std::vector<std::string> notices;
  Status status;

  explicit ResolvedFeatures(std::vector<std::string> argv) {
    add_all_pretrain_args(parser, args);
    registry->register_args(parser);
    argv.insert(argv.begin(), "gale");
    std::vector<char*> ptrs;
    for (auto& a : argv) ptrs.push_back(a.data());
    storage_ = std::move(argv);
    status = parser.parse(static_cast<int>(ptrs.size()), ptrs.data());
    if (!status.ok()) return;
    FeatureContext ctx = make_feature_context(args, parser, *registry);
    status = registry->resolve(ctx, &notices);
    if (!status.ok()) return;
    EngineSetup setup{&ops, &recompute};
    status = registry->apply(ctx, setup);
  }
  std::string impl(const std::string& op) { return ops.impl.at(op); }

 private:
  std::vector<std::string> storage_;
};

}  // namespace gale
