// For the `gale generate` tests on a tiny checkpoint: GPT-2's tokenizer flags, six English prompts of
// mixed lengths, and a suite fixture with the model (its `command`) trained 4 iterations once per
// suite and a prompts file.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale::testing {

// GPT-2's tokenizer (the repository's data/tokenizers/gpt2).
inline std::vector<std::string> gpt2_tokenizer_flags() {
  const std::string dir = std::string(GALE_TEST_DATA_DIR) + "/../../data/tokenizers/gpt2/";
  return {"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", dir + "vocab.json", "--merge-file",
          dir + "merges.txt"};
}

// Mixed lengths (1 to 36 GPT-2 tokens, 74 in all): under dynamic batching with a step of at most 64
// tokens the last one waits for the first five to be prefilled and joins mid-flight.
inline const std::vector<std::string> kMixedLengthPrompts = {
    "Once upon a time",
    "In the beginning there was nothing but the wide dark sea, and over it the wind moved slowly from the east "
    "to the west, day after day, for a very long time",
    "Hello",
    "The quick brown fox jumps over the lazy dog and",
    "x y z",
    "She opened the old wooden door and looked out at the garden, where the rain had just stopped",
};

// command(sub, extra): the argv of `gale <sub>` with the model's flags and `extra`.
template <std::vector<std::string> (*command)(const std::string& sub, std::vector<std::string> extra)>
class TrainedCheckpointCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    trained_ = new test::RunResult(test::run_with_timeout(
        command("pretrain", {"--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4", "--lr",
                             "3e-3", "--mock-data", "--log-interval", "2", "--eval-interval", "100", "--eval-iters",
                             "1", "--num-threads", "1", "--save", dir_->file("ckpt"), "--save-interval", "4"}),
        {}, 300));
    std::string file;
    for (const std::string& p : kMixedLengthPrompts) file += p + "\n";
    write_file(dir_->file("prompts.txt"), file);
  }
  static void TearDownTestSuite() {
    delete trained_;
    delete dir_;
  }
  static std::string prompts() { return dir_->file("prompts.txt"); }
  inline static TempDir* dir_ = nullptr;
  inline static test::RunResult* trained_ = nullptr;
};

}  // namespace gale::testing
