// Running the `gale` binary from tests: exit code, stdout and stderr of one command; a tiny model's losses.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/log_line.h"

namespace gale::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `GALE_BINARY <args>` through the shell (args must be shell-quoted by the caller).
inline CommandResult run_gale(const std::string& args, const std::string& scratch_dir) {
  std::string out = scratch_dir + "/.stdout", err = scratch_dir + "/.stderr";
  std::string cmd = std::string(GALE_BINARY) + " " + args + " >" + out + " 2>" + err;
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

// A tiny GPT for the model-variant CLI tests: 2 layers, hidden 32, 4 heads, sequence 16, mock data
// over 4096 tokens, 2 sequences a step, one thread, a log line every step, no dropout.
inline const std::string kTinyMockGpt =
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 32 "
    "--tokenizer-type NullTokenizer --vocab-size 4096 --micro-batch-size 2 --global-batch-size 2 --lr 1e-3 "
    "--mock-data --eval-iters 0 --num-threads 1 --log-interval 1 --attention-dropout 0 --hidden-dropout 0";

// `gale pretrain <args> --train-iters 3` in `scratch_dir`: its three logged lm losses (a failure
// is reported, and fewer values returned, when it does not run to the end).
inline std::vector<double> pretrain_losses(const std::string& args, const std::string& scratch_dir) {
  CommandResult r = run_gale("pretrain " + args + " --train-iters 3", scratch_dir);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
  std::vector<double> losses = logged_values(r.out, "lm loss");
  EXPECT_EQ(losses.size(), 3u) << r.out;
  return losses;
}

}  // namespace gale::testing
