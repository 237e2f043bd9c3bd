// --calculate-per-token-loss: every loss token of the global batch weighs alike. With loss masks
// that differ between micro-batches, four micro-batches in that mode train like one micro-batch of
// the whole global batch in the default mode (Σ ℓ·mask / Σ mask over all of it: an independent
// computation of the same objective), and unlike four micro-batches in the default mode; with
// uniform masks the two modes agree. The flag's conflicts are one-line errors (MoE and MTP are
// accepted: tests/train/per_token_moe_mtp_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "pretrain_cli.h"
#include "testing_run.h"

namespace gale {
namespace {

constexpr int64_t kVocab = 60;
constexpr int64_t kSeq = 16;

std::unique_ptr<testing::TestRun> trained(const std::vector<std::string>& extra, bool masked, int iterations) {
  auto run = std::make_unique<testing::TestRun>(
      testing::join({{"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
                      "--max-position-embeddings", "16", "--global-batch-size", "4", "--train-iters", "10", "--lr",
                      "3e-3", "--mock-data", "--hidden-dropout", "0", "--attention-dropout", "0",
                      "--make-vocab-size-divisible-by", "64", "--eval-iters", "0"},
                     extra}),
      make_self_communicator("world"), kVocab);
  if (masked) run->set_data(std::make_unique<testing::MaskedSyntheticDataset>(100000, kSeq, kVocab));
  run->train(iterations);
  return run;
}

// ‖a − b‖ / ‖b‖ over two flat buffers of the same size.
double relative_difference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    diff += (x - y) * (x - y);
    norm += y * y;
  }
  return std::sqrt(diff / norm);
}

double grad_difference(testing::TestRun& a, testing::TestRun& b) {
  return relative_difference(a.model().params().flat_grads(), b.model().params().flat_grads());
}
double param_difference(testing::TestRun& a, testing::TestRun& b) {
  return relative_difference(a.model().params().flat_params(), b.model().params().flat_params());
}

TEST(PerTokenLoss, MicroBatchesWeighTheirTokensLikeOneWholeBatch) {
  constexpr int kIters = 3;
  auto per_token = trained({"--micro-batch-size", "1", "--calculate-per-token-loss"}, /*masked=*/true, kIters);
  auto whole_batch = trained({"--micro-batch-size", "4"}, /*masked=*/true, kIters);
  auto per_micro_batch = trained({"--micro-batch-size", "1"}, /*masked=*/true, kIters);
  for (int i = 0; i < kIters; ++i) {
    EXPECT_NEAR(per_token->losses[i], whole_batch->losses[i], 1e-5 * whole_batch->losses[i]) << "iteration " << i + 1;
    EXPECT_NEAR(per_token->grad_norms[i], whole_batch->grad_norms[i], 1e-5 * whole_batch->grad_norms[i])
        << "iteration " << i + 1;
  }
  // The gradients of the last iteration (left in the buffers) and the parameters after it.
  EXPECT_LT(grad_difference(*per_token, *whole_batch), 1e-4);
  EXPECT_LT(param_difference(*per_token, *whole_batch), 1e-5);
  // Megatron's default weighs every micro-batch alike, whatever its token count.
  EXPECT_GT(grad_difference(*per_micro_batch, *whole_batch), 1e-2);
  EXPECT_GT(std::abs(per_micro_batch->losses[kIters - 1] - whole_batch->losses[kIters - 1]),
            1e-4 * whole_batch->losses[kIters - 1]);
}

TEST(PerTokenLoss, UniformMasksTrainAsTheDefaultMode) {
  constexpr int kIters = 3;
  auto per_token = trained({"--micro-batch-size", "1", "--calculate-per-token-loss"}, /*masked=*/false, kIters);
  auto per_micro_batch = trained({"--micro-batch-size", "1"}, /*masked=*/false, kIters);
  for (int i = 0; i < kIters; ++i)
    EXPECT_NEAR(per_token->losses[i], per_micro_batch->losses[i], 1e-5 * per_micro_batch->losses[i])
        << "iteration " << i + 1;
  EXPECT_LT(grad_difference(*per_token, *per_micro_batch), 1e-4);
  EXPECT_LT(param_difference(*per_token, *per_micro_batch), 1e-5);
}

// --fp16's loss scale multiplies the summed loss's gradient and is divided out by the optimizer:
// the per-token run matches the whole-batch run in fp16 as in fp32, up to fp16 rounding.
TEST(PerTokenLoss, WithFp16LossScaling) {
  constexpr int kIters = 2;
  auto per_token =
      trained({"--micro-batch-size", "1", "--calculate-per-token-loss", "--fp16", "--loss-scale", "128"}, true, kIters);
  auto whole_batch = trained({"--micro-batch-size", "4", "--fp16", "--loss-scale", "128"}, true, kIters);
  for (int i = 0; i < kIters; ++i) {
    EXPECT_NEAR(per_token->losses[i], whole_batch->losses[i], 1e-3 * whole_batch->losses[i]) << "iteration " << i + 1;
    // The unscaled gradients' norm (Adam would hide a wrong gradient scale in the parameters).
    EXPECT_NEAR(per_token->grad_norms[i], whole_batch->grad_norms[i], 1e-2 * whole_batch->grad_norms[i])
        << "iteration " << i + 1;
  }
  EXPECT_LT(param_difference(*per_token, *whole_batch), 1e-3);
}

TEST(PerTokenLossFlags, ConflictsAreOneLineErrors) {
  testing::expect_one_line_error({{"--calculate-per-token-loss", "--ddp-average-in-collective"},
                                  1,
                                  "--ddp-average-in-collective cannot be used with --calculate-per-token-loss"});
  testing::PretrainCli cli;
  ASSERT_TRUE(cli.parse_minimal({"--calculate-per-token-loss"}).ok());
  EXPECT_TRUE(cli.args.training.calculate_per_token_loss);
}

TEST(IterationsToSkipFlags, ParsedOrOneLineErrors) {
  testing::PretrainCli cli;
  ASSERT_TRUE(cli.parse_minimal({"--iterations-to-skip", "3", "0", "7"}).ok());
  EXPECT_EQ(cli.args.training.iterations_to_skip, (std::vector<int64_t>{3, 0, 7}));
  testing::expect_one_line_error(
      {{"--iterations-to-skip", "3", "x"}, 1, "--iterations-to-skip: expected integers (iterations counted from 0)"});
}

}  // namespace
}  // namespace gale
