// `gale pretrain`'s full argument parser for the argument tests: parse a command line and run
// every validation, as the binary does, without running anything.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train/arguments.h"

namespace gale::testing {

// The smallest valid model and training flags (mock data).
inline std::vector<std::string> minimal_pretrain_flags() {
  return {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
          "--max-position-embeddings", "32", "--micro-batch-size", "2", "--train-iters", "10", "--lr", "1e-3",
          "--mock-data"};
}

struct PretrainCli {
  ArgParser parser{"gale pretrain", "test"};
  Arguments args;
  PretrainCli() { add_all_pretrain_args(parser, args); }
  // `argv` without the program name; `world` is the number of ranks the layout is checked against.
  Status parse(std::vector<std::string> argv, int64_t world = 1) {
    std::vector<std::string> all = {"gale"};
    all.insert(all.end(), argv.begin(), argv.end());
    std::vector<char*> ptrs;
    for (auto& a : all) ptrs.push_back(a.data());
    GALE_RETURN_IF_ERROR(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()));
    return validate_all_pretrain_args(args, parser, world);
  }
  // minimal_pretrain_flags() followed by `extra`.
  Status parse_minimal(const std::vector<std::string>& extra, int64_t world = 1) {
    std::vector<std::string> argv = minimal_pretrain_flags();
    argv.insert(argv.end(), extra.begin(), extra.end());
    return parse(argv, world);
  }
};

// A bad command line for the parametrised error tests: minimal_pretrain_flags() plus `flags` on
// `world` ranks must fail with one line containing `expected`.
struct FlagErrorCase {
  std::vector<std::string> flags;
  int64_t world;
  std::string expected;  // a substring of the one-line message
};

inline void expect_one_line_error(const FlagErrorCase& e) {
  PretrainCli cli;
  const Status s = cli.parse_minimal(e.flags, e.world);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(e.expected), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
}

}  // namespace gale::testing
