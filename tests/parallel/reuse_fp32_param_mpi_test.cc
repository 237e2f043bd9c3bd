// --reuse-fp32-param over data parallelism (2 ranks): with plain DP and with the distributed
// optimizer (its shard updated from the reconstructed masters, the f32 values all-gathered and
// split again, with and without overlapped gathers), a tiny GPT with --bf16 trains bit-identically
// to the same layout without the flag, and every rank holds 2 bytes per parameter less (Gale's
// ranks all hold every parameter of their chunk, so the saving is not divided by DP).
#include <gtest/gtest.h>

#include <cstring>

#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

const std::vector<std::string> kFlags = {
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "3e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--hidden-dropout", "0.1",
    "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000", "--make-vocab-size-divisible-by", "64",
    "--bf16"};

std::vector<uint32_t> values(const testing::TestRun& run) {
  finish_param_sync(*run.engine);
  std::vector<uint32_t> out;
  for (const auto& chunk : run.engine->chunks) {
    const ParamBuffer& pb = chunk->params();
    std::vector<float> v(static_cast<size_t>(pb.numel()));
    pb.read_values(0, pb.numel(), v.data());
    const size_t at = out.size();
    out.resize(at + v.size());
    std::memcpy(out.data() + at, v.data(), v.size() * sizeof(float));
  }
  return out;
}

class ReuseFp32ParamDp : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(ReuseFp32ParamDp, TrainsBitIdenticallyToPlainBf16) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  testing::TestRun plain(testing::join({kFlags, GetParam()}), test::world(), 60);
  testing::TestRun reuse(testing::join({kFlags, GetParam(), {"--reuse-fp32-param"}}), test::world(), 60);
  const ParamBuffer& pb = reuse.model().params();
  ASSERT_TRUE(pb.reuses_fp32());
  EXPECT_EQ(plain.model().params().value_bytes() - pb.value_bytes(), 2 * pb.numel() - 8 * pb.num_split_ties());
  const std::vector<double> a = plain.train(5), b = reuse.train(5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(a[i], b[i]) << "loss of iteration " << i + 1;
    EXPECT_EQ(plain.grad_norms[i], reuse.grad_norms[i]) << "grad norm of iteration " << i + 1;
  }
  EXPECT_NE(a[0], a[4]);
  EXPECT_TRUE(values(plain) == values(reuse));
}

std::string case_name(const ::testing::TestParamInfo<std::vector<std::string>>& info) {
  static const char* const names[] = {"dp2", "dp2_distopt", "dp2_distopt_overlap"};
  return names[info.index];
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ReuseFp32ParamDp,
    ::testing::Values(std::vector<std::string>{}, std::vector<std::string>{"--use-distributed-optimizer"},
                      std::vector<std::string>{"--use-distributed-optimizer", "--overlap-grad-reduce",
                                               "--overlap-param-gather", "--ddp-bucket-size", "3000"}),
    case_name);

}  // namespace
}  // namespace gale
