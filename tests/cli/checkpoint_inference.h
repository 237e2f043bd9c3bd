// Running `gale generate`, `gale evaluate` and `gale convert` on a checkpoint a CLI test trained: the
// model from the checkpoint's args (NullTokenizer), and the one-line refusal of a conversion.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "subprocess.h"

namespace gale::testing {

// `gale <sub> --load <ckpt> --use-checkpoint-args` with the NullTokenizer of 4096 tokens, then `extra`
// (one OpenMP thread, 300 s).
inline test::RunResult infer_from_checkpoint(const char* sub, const std::string& ckpt, std::vector<std::string> extra) {
  std::vector<std::string> argv = {GALE_BINARY, sub, "--load", ckpt, "--use-checkpoint-args",
                                   "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return test::run_with_timeout(argv, {"OMP_NUM_THREADS=1"}, 300);
}

// `gale convert` of the Gale checkpoint `ckpt` to Hugging Face's format in `out` fails with `expected`.
inline void expect_hf_conversion_refused(const std::string& ckpt, const std::string& out, const std::string& expected) {
  const test::RunResult hf = test::run_with_timeout({GALE_BINARY, "convert", "--load-model-type", "gale",
                                                     "--save-model-type", "hf", "--load-dir", ckpt, "--save-dir", out},
                                                    {}, 60);
  EXPECT_NE(hf.exit_code, 0);
  EXPECT_NE(hf.output.find(expected), std::string::npos) << hf.output;
}

}  // namespace gale::testing
