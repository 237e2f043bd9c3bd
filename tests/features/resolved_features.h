// Test helpers: a `gale pretrain` command line parsed, its features resolved by the real registry
// and applied to an op table and a recompute plan (what pretrain hands the engine); or only
// validated as pretrain validates its arguments.
#pragma once

#include <gtest/gtest.h>

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

// The features of the command line `base` followed by `more`.
inline ResolvedFeatures resolve(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return ResolvedFeatures(base);
}

// Expects the command line `argv` to be refused with a one-line message that contains `part`.
inline void expect_one_line_refusal(const std::vector<std::string>& argv, const std::string& part) {
  ResolvedFeatures r(argv);
  ASSERT_FALSE(r.status.ok()) << part;
  EXPECT_NE(r.status.message().find(part), std::string::npos) << r.status.message();
  EXPECT_EQ(r.status.message().find('\n'), std::string::npos) << r.status.message();
}

// The same for `base` followed by `more`.
inline void expect_one_line_refusal(std::vector<std::string> base, const std::vector<std::string>& more,
                                    const std::string& part) {
  base.insert(base.end(), more.begin(), more.end());
  expect_one_line_refusal(base, part);
}

// What validate_all_pretrain_args says of a tiny one-process run (2 layers, hidden 16, 2 heads,
// sequence 8, one sample of mock data per iteration) with `flags` added.
inline Status validated_pretrain_args(const std::vector<std::string>& flags) {
  ArgParser parser("gale pretrain", "test");
  Arguments args;
  add_all_pretrain_args(parser, args);
  std::vector<std::string> argv = {"gale", "--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2",
                                   "--seq-length", "8", "--max-position-embeddings", "8", "--micro-batch-size", "1",
                                   "--global-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::vector<char*> ptrs;
  for (auto& a : argv) ptrs.push_back(a.data());
  GALE_RETURN_IF_ERROR(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()));
  return validate_all_pretrain_args(args, parser, 1);
}

}  // namespace gale
