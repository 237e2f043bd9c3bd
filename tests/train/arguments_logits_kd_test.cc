// Megatron's --logits-save-* / --logits-load-* flags (train/arguments_logits_kd.cc): its defaults,
// every flag read, Megatron's checks as one-line errors naming the flag, and the one-line refusals
// of what does not compose with offline distillation yet.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "pretrain_cli.h"
#include "train/arguments.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;
using testing::expect_one_line_error;

TEST(LogitsKdArguments, MegatronDefaults) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({}).ok());
  const LogitsKdArgs& k = cli.args.logits_kd;
  EXPECT_TRUE(k.logits_save_dir.empty());
  EXPECT_TRUE(std::isnan(k.logits_save_top_p));
  EXPECT_EQ(k.logits_save_top_p_min_k, 1);
  EXPECT_EQ(k.logits_save_dtype, "fp16");
  EXPECT_EQ(k.logits_load_decode_threads, 4);
  EXPECT_EQ(k.logits_load_prefetch_factor, 3);
  EXPECT_EQ(k.logits_load_msc_prefetch_depth, 2);
  EXPECT_EQ(k.logits_load_kd_loss_alpha, 1.0);
  EXPECT_FALSE(k.logits_load_ignore_errors);
}

// Without their directories the flags are read (Megatron ignores them; Gale warns) and the run is fine.
TEST(LogitsKdArguments, EveryFlagIsRead) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({"--logits-save-top-k", "16", "--logits-save-top-p", "0.9", "--logits-save-top-p-min-k",
                                 "2", "--logits-save-dtype", "bf16", "--logits-load-decode-threads", "2",
                                 "--logits-load-prefetch-factor", "5", "--logits-load-msc-prefetch-depth", "0",
                                 "--logits-load-kd-loss-alpha", "0.25", "--logits-load-ignore-errors"})
                  .ok());
  const LogitsKdArgs& k = cli.args.logits_kd;
  EXPECT_EQ(k.logits_save_top_k, 16);
  EXPECT_EQ(k.logits_save_top_p, 0.9);
  EXPECT_EQ(k.logits_save_top_p_min_k, 2);
  EXPECT_EQ(k.logits_save_dtype, "bf16");
  EXPECT_EQ(k.logits_load_decode_threads, 2);
  EXPECT_EQ(k.logits_load_prefetch_factor, 5);
  EXPECT_EQ(k.logits_load_msc_prefetch_depth, 0);
  EXPECT_EQ(k.logits_load_kd_loss_alpha, 0.25);
  EXPECT_TRUE(k.logits_load_ignore_errors);
}

class LogitsKdArgumentErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    // One directory per test and process: ctest runs the tests of this file side by side.
    dir_ = std::filesystem::temp_directory_path() /
           ("gale_logits_kd_args_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
            "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "a_file") << "x";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  std::filesystem::path dir_;
};

TEST_F(LogitsKdArgumentErrors, OneLineErrorsNamingTheFlag) {
  const std::string file = (dir_ / "a_file").string();
  for (const testing::FlagErrorCase& e : std::vector<testing::FlagErrorCase>{
           {{"--logits-save-dir", dir()}, 1, "--logits-save-top-k is required when --logits-save-dir is set"},
           {{"--logits-save-dir", dir(), "--logits-save-top-k", "0"}, 1, "--logits-save-top-k: expected a positive"},
           {{"--logits-save-dir", dir(), "--logits-save-top-k", "4", "--logits-save-top-p", "1.5"}, 1,
            "--logits-save-top-p: expected a value in (0, 1], found 1.5"},
           {{"--logits-save-dir", dir(), "--logits-save-top-k", "4", "--logits-save-top-p-min-k", "0"}, 1,
            "--logits-save-top-p-min-k: expected at least 1"},
           {{"--logits-save-dir", dir(), "--logits-save-top-k", "4", "--logits-save-dtype", "fp8"}, 1,
            "--logits-save-dtype"},
           {{"--logits-save-dir", file, "--logits-save-top-k", "4"}, 1, "exists and is not a directory"},
           {{"--logits-load-dir", (dir_ / "missing").string()}, 1, "--logits-load-dir: '"},
           {{"--logits-load-dir", dir(), "--logits-load-kd-loss-alpha", "nan"}, 1, "--logits-load-kd-loss-alpha"},
           {{"--logits-load-dir", dir(), "--logits-load-decode-threads", "0"}, 1, "--logits-load-decode-threads"},
       })
    expect_one_line_error(e);
}

// Valid flags run (the training loop saves or loads logits, train/logits_kd_hooks.h); what does not
// compose yet is refused in one line naming it.
TEST_F(LogitsKdArgumentErrors, AcceptedAndWhatDoesNotComposeRefusedInOneLine) {
  Cli save, load;
  EXPECT_TRUE(save.parse_minimal({"--logits-save-dir", dir(), "--logits-save-top-k", "4", "--freeze-all-layers"}).ok());
  EXPECT_TRUE(load.parse_minimal({"--logits-load-dir", dir(), "--logits-load-kd-loss-alpha", "0.5"}).ok());
  const std::vector<std::string> s = {"--logits-save-dir", dir(), "--logits-save-top-k", "4"};
  const std::vector<std::string> l = {"--logits-load-dir", dir()};
  auto with = [](std::vector<std::string> a, std::vector<std::string> b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  for (const testing::FlagErrorCase& e : std::vector<testing::FlagErrorCase>{
           {with(s, l), 1, "--logits-save-dir with --logits-load-dir: saving a student's logits while it distils is not supported"},
           {with(l, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}), 2,
            "--logits-load-dir with --context-parallel-algo ulysses_cp_algo: not supported (the cp{C} shards hold "
            "Megatron's load-balanced split; use megatron_cp_algo)"},
           {with(s, {"--context-parallel-size", "2", "--context-parallel-algo", "adaptive_cp_algo"}), 2,
            "--logits-save-dir with --context-parallel-algo adaptive_cp_algo: not supported"},
           {with(l, {"--tp-2d", "--tensor-model-parallel-size", "4", "--tp-x", "2", "--tp-y", "2"}), 4,
            "--logits-load-dir with --tp-2d: not supported yet"},
       })
    expect_one_line_error(e);
}

// Pipeline (virtual pipeline included), context parallelism (Megatron's split), MTP and the
// per-split data paths compose with both directions (train/logits_kd_hooks.h).
TEST_F(LogitsKdArgumentErrors, PipelineContextMtpAndPerSplitDataAreAccepted) {
  const std::vector<std::string> s = {"--logits-save-dir", dir(), "--logits-save-top-k", "4", "--freeze-all-layers"};
  const std::vector<std::string> l = {"--logits-load-dir", dir()};
  struct Case {
    std::vector<std::string> flags;
    int64_t world;
  };
  for (const std::vector<std::string>& base : {s, l})
    for (const Case& c : std::vector<Case>{
             {{"--pipeline-model-parallel-size", "2"}, 2},
             {{"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}, 2},
             {{"--context-parallel-size", "2"}, 2},
             {{"--mtp-num-layers", "1"}, 1},
         }) {
      std::vector<std::string> flags = base;
      flags.insert(flags.end(), c.flags.begin(), c.flags.end());
      Cli cli;
      const Status st = cli.parse_minimal(flags, c.world);
      EXPECT_TRUE(st.ok()) << st.message() << " (" << flags.back() << ")";
    }
}

}  // namespace
}  // namespace gale
