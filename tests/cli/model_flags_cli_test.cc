// Model flags recorded in checkpoints only when set (--use-rope-scaling, --openai-gelu, --squared-relu,
// --apply-layernorm-1p, --rotary-seq-len-interpolation-factor, --rotary-interleaved, --no-rope-freq, --attention-output-gate, --embed-layernorm,
// --quick-geglu with --glu-linear-offset and --activation-func-clamp-value, and
// --position-embedding-type alibi): a run that resumes with the same flags continues, one without
// them is refused naming the flag, and --use-checkpoint-args restores them.
#include <gtest/gtest.h>

#include <regex>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

const std::string kModel =
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 32 "
    "--tokenizer-type NullTokenizer --vocab-size 4096 --micro-batch-size 2 --global-batch-size 2 --lr 1e-3 "
    "--mock-data --eval-iters 0 --num-threads 1 --log-interval 1";

TEST(ModelFlagsCli, RecordedFlagsMustMatchOnResume) {
  struct Case {
    std::string flags, base, key;  // the flags, what stays without them, the recorded key
  };
  for (const Case& c : {Case{"--position-embedding-type rope --use-rope-scaling --rope-scaling-factor 16",
                             " --position-embedding-type rope", "rope_scaling_factor = 16.0"},
                        Case{"--openai-gelu", "", "openai_gelu = true"},
                        Case{"--embed-layernorm", "", "embed_layernorm = true"},
                        Case{"--squared-relu", "", "squared_relu = true"},
                        Case{"--apply-layernorm-1p", "", "apply_layernorm_1p = true"},
                        Case{"--position-embedding-type rope --rotary-seq-len-interpolation-factor 4",
                             " --position-embedding-type rope", "rope_position_scale = 0.25"},
                        Case{"--position-embedding-type rope --rotary-interleaved", " --position-embedding-type rope",
                             "rotary_interleaved = true"},
                        Case{"--position-embedding-type rope --no-rope-freq 2", " --position-embedding-type rope",
                             "no_rope_layers = [0,1]"},
                        Case{"--attention-output-gate", "", "attention_output_gate = true"},
                        Case{"--quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value 0.125", "",
                             "activation_func_clamp_value = 0.125"}}) {
    const std::string& flags = c.flags;
    testing::TempDir dir;
    const std::string save = " --save " + dir.file("ckpt") + " --save-interval 2";
    testing::CommandResult r = testing::run_gale("pretrain " + kModel + " " + flags + " --train-iters 2" + save, dir.path());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = testing::run_gale("pretrain " + kModel + c.base + " --train-iters 4 --load " + dir.file("ckpt"), dir.path());
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_NE((r.out + r.err).find("does not match this model: it was saved with " + c.key + ", this run has (absent)"),
              std::string::npos)
        << flags << "\n" << r.out << r.err;
    r = testing::run_gale("pretrain " + kModel + " " + flags + " --train-iters 4 --load " + dir.file("ckpt"), dir.path());
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
    EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(iteration +4/ +4 \|)"))) << r.out;
    r = testing::run_gale("generate --load " + dir.file("ckpt") +
                              " --use-checkpoint-args --tokenizer-type NullTokenizer --vocab-size 4096 --prompt '1 2 3' "
                              "--temperature 0 --max-new-tokens 2",
                          dir.path());
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
  }
}

// --position-embedding-type alibi: the same model at every --optimization-level (level 0 runs the
// reference attention with the bias, level 2 the flash kernels: the same losses within 1e-5),
// recorded in the checkpoint (a resume without it is refused, one with it continues,
// `gale generate --use-checkpoint-args` restores it).
TEST(ModelFlagsCli, AlibiAtEveryLevelAndRecorded) {
  testing::TempDir dir;
  const std::string alibi = " --position-embedding-type alibi";
  std::vector<std::vector<double>> losses;
  for (const char* level : {"0", "2"}) {
    testing::CommandResult run = testing::run_gale(
        "pretrain " + kModel + alibi + " --attention-dropout 0 --hidden-dropout 0 --use-flash-attn --optimization-level " + level +
            " --train-iters 3",
        dir.path());
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_NE(run.out.find("active: position-embedding-type"), std::string::npos) << run.out;
    losses.push_back(testing::logged_values(run.out, "lm loss"));
    ASSERT_EQ(losses.back().size(), 3u) << run.out;
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5 * losses[0][i]) << "iteration " << i + 1;
  testing::CommandResult r;
  const std::string save = " --save " + dir.file("ckpt") + " --save-interval 2";
  r = testing::run_gale("pretrain " + kModel + alibi + " --train-iters 2" + save, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = testing::run_gale("pretrain " + kModel + " --position-embedding-type none --train-iters 4 --load " +
                            dir.file("ckpt"),
                        dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE((r.out + r.err).find("alibi"), std::string::npos) << r.out << r.err;
  r = testing::run_gale("pretrain " + kModel + alibi + " --train-iters 4 --load " + dir.file("ckpt"), dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(iteration +4/ +4 \|)"))) << r.out;
  r = testing::run_gale("generate --load " + dir.file("ckpt") +
                            " --use-checkpoint-args --tokenizer-type NullTokenizer --vocab-size 4096 --prompt '1 2 3' "
                            "--temperature 0 --max-new-tokens 2",
                        dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace gale
