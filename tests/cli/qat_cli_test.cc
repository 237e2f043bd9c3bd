// `gale pretrain --qat-scheme`: the flag reaches the model through the feature registry (the loss
// differs from the run without it and still falls), is off below --optimization-level 2 (the same
// losses as without it, and a notice), and its validation errors end the run at start-up.
#include <gtest/gtest.h>

#include "cli/log_line.h"
#include "subprocess.h"

namespace gale {
namespace {

// A tiny Mixtral-like model (every input dimension a multiple of 32: hidden 64, ffn 128, experts 64).
std::vector<std::string> model(std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--ffn-hidden-size", "128", "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2",
      "--global-batch-size", "4", "--train-iters", "6", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096",
      "--log-interval", "1", "--eval-iters", "0", "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm",
      "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
      "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--num-experts", "4", "--moe-router-topk", "2",
      "--moe-ffn-hidden-size", "64", "--moe-layer-freq", "[0,1]"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<double> losses(const std::vector<std::string>& flags, std::string* output = nullptr) {
  test::RunResult r = test::run_with_timeout(model(flags), {}, 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (output) *output = r.output;
  return testing::logged_values(r.output, "lm loss");
}

TEST(GalePretrainQat, EverySchemeTrainsAndChangesTheLoss) {
  const std::vector<double> plain = losses({});
  ASSERT_EQ(plain.size(), 6u);
  for (const char* scheme : {"w4a16-mxfp4", "w4a16-mxfp4-moe-only", "w8a16-mxfp8", "w8a16-mxfp8-moe-only"}) {
    std::string out;
    const std::vector<double> q = losses({"--qat-scheme", scheme}, &out);
    ASSERT_EQ(q.size(), 6u) << scheme;
    EXPECT_NE(out.find("active: qat"), std::string::npos) << out;
    EXPECT_NE(q.front(), plain.front()) << scheme;
    EXPECT_LT(q.back(), q.front()) << scheme;
  }
}

TEST(GalePretrainQat, OffBelowLevelTwo) {
  const std::vector<double> plain = losses({"--optimization-level", "1"});
  std::string out;
  const std::vector<double> q = losses({"--optimization-level", "1", "--qat-scheme", "w4a16-mxfp4"}, &out);
  EXPECT_EQ(q, plain);
  EXPECT_NE(out.find("--qat-scheme is not active: it needs --optimization-level 2"), std::string::npos) << out;
}

TEST(GalePretrainQat, ValidationErrorsAtStartUp) {
  test::RunResult r = test::run_with_timeout(model({"--qat-scheme", "w8a16-mxfp8", "--qat-quant-block-size", "128"}), {}, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--qat-quant-block-size 128 must divide the input dimension of linear_qkv / linear_fc1 on "
                          "each rank (--hidden-size = 64)"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace gale
