// --calculate-per-token-loss with MoE (every load-balancing type and the z-loss) and with MTP, as
// Megatron-LM main: with uniform loss masks the per-token run trains as the default mode (the
// routers' losses, multiplied by their tokens and divided by the step's tokens, weigh
// 1 / micro-batches again; each MTP loss, multiplied by Σ mask / Σ mask_k, likewise), with one
// micro-batch per step it does so whatever the masks for MTP (Σ mask / Σ mask_k / Σ mask =
// 1 / Σ mask_k), and with masks that differ between micro-batches it does not. The losses logged
// (load-balancing, z and MTP) are the default mode's formulas: equal at the first iteration.
// --recompute-modules moe under global_aux_loss is bit-identical to no recompute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "pretrain_cli.h"
#include "testing_run.h"

namespace gale {
namespace {

constexpr int64_t kVocab = 60;
constexpr int64_t kSeq = 16;

const std::vector<std::string> kBase = {
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "16", "--global-batch-size", "4", "--train-iters", "10", "--lr", "3e-3",
    "--mock-data", "--hidden-dropout", "0", "--attention-dropout", "0", "--make-vocab-size-divisible-by", "64",
    "--eval-iters", "0", "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24"};

// Each load-balancing type Gale supports, with the z-loss, and MTP (2 layers, both MoE).
const std::vector<std::string> kAux = {"--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "0.5",
                                       "--moe-z-loss-coeff", "0.05"};
const std::vector<std::string> kSeqAux = {"--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff",
                                          "0.5"};
const std::vector<std::string> kGlobalAux = {"--moe-router-load-balancing-type", "global_aux_loss",
                                             "--moe-aux-loss-coeff", "0.5", "--moe-z-loss-coeff", "0.05"};
const std::vector<std::string> kMtp = {"--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.4"};

std::unique_ptr<testing::TestRun> trained(const std::vector<std::string>& extra, bool masked, int iterations) {
  auto run = std::make_unique<testing::TestRun>(testing::join({kBase, extra}), make_self_communicator("world"), kVocab);
  if (masked) run->set_data(std::make_unique<testing::MaskedSyntheticDataset>(100000, kSeq, kVocab));
  run->train(iterations);
  return run;
}

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

void expect_same_training(testing::TestRun& a, testing::TestRun& b, int iterations) {
  for (int i = 0; i < iterations; ++i) {
    EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * b.losses[i]) << "iteration " << i + 1;
    EXPECT_NEAR(a.grad_norms[i], b.grad_norms[i], 1e-5 * b.grad_norms[i]) << "iteration " << i + 1;
    EXPECT_NEAR(a.load_balancing_losses[i], b.load_balancing_losses[i], 1e-5 * (1.0 + b.load_balancing_losses[i]));
  }
  EXPECT_LT(grad_difference(a, b), 1e-4);
}

class PerTokenMoe : public ::testing::TestWithParam<int> {};

const std::vector<std::string>& variant(int i) {
  static const std::vector<std::vector<std::string>> all = {kAux, kSeqAux, kGlobalAux, testing::join({kAux, kMtp})};
  return all[static_cast<size_t>(i)];
}

// Uniform masks, 4 micro-batches: the per-token run is the default mode's (every term).
TEST_P(PerTokenMoe, UniformMasksTrainAsTheDefaultMode) {
  constexpr int kIters = 3;
  const std::vector<std::string>& v = variant(GetParam());
  auto per_token = trained(testing::join({v, {"--micro-batch-size", "1", "--calculate-per-token-loss"}}), false, kIters);
  auto per_micro_batch = trained(testing::join({v, {"--micro-batch-size", "1"}}), false, kIters);
  expect_same_training(*per_token, *per_micro_batch, kIters);
}

// Masks that differ between micro-batches: the modes differ, and the logged losses of the first
// iteration (same parameters, same data) are the same formulas in both.
TEST_P(PerTokenMoe, DifferingMasksDifferButLogTheSameLosses) {
  const std::vector<std::string>& v = variant(GetParam());
  auto per_token = trained(testing::join({v, {"--micro-batch-size", "1", "--calculate-per-token-loss"}}), true, 1);
  auto per_micro_batch = trained(testing::join({v, {"--micro-batch-size", "1"}}), true, 1);
  EXPECT_GT(grad_difference(*per_token, *per_micro_batch), 1e-3);
  EXPECT_GT(per_token->load_balancing_losses[0], 0.0);
  EXPECT_NEAR(per_token->load_balancing_losses[0], per_micro_batch->load_balancing_losses[0],
              1e-6 * per_micro_batch->load_balancing_losses[0]);
  ASSERT_EQ(per_token->mtp_losses[0].size(), per_micro_batch->mtp_losses[0].size());
  for (size_t k = 0; k < per_token->mtp_losses[0].size(); ++k)
    EXPECT_NEAR(per_token->mtp_losses[0][k], per_micro_batch->mtp_losses[0][k], 1e-6 * per_micro_batch->mtp_losses[0][k]);
}

std::string variant_name(const ::testing::TestParamInfo<int>& info) {
  static const char* const names[] = {"aux_loss_z", "seq_aux_loss", "global_aux_loss_z", "aux_loss_z_mtp"};
  return names[info.param];
}
INSTANTIATE_TEST_SUITE_P(Types, PerTokenMoe, ::testing::Values(0, 1, 2, 3), variant_name);

// MTP alone (a dense model), one micro-batch per step with masks: per token is the default mode.
TEST(PerTokenMtp, OneMicroBatchTrainsAsTheDefaultModeWhateverTheMasks) {
  constexpr int kIters = 3;
  std::vector<std::string> dense(kBase.begin(), kBase.end() - 6);
  const auto run = [&](bool per_token) {
    std::vector<std::string> flags = testing::join({kMtp, {"--micro-batch-size", "4"}});
    if (per_token) flags.push_back("--calculate-per-token-loss");
    auto r = std::make_unique<testing::TestRun>(testing::join({dense, flags}), make_self_communicator("world"), kVocab);
    r->set_data(std::make_unique<testing::MaskedSyntheticDataset>(100000, kSeq, kVocab));
    r->train(kIters);
    return r;
  };
  auto per_token = run(true), whole = run(false);
  for (int i = 0; i < kIters; ++i) {
    EXPECT_NEAR(per_token->losses[i], whole->losses[i], 1e-5 * whole->losses[i]) << "iteration " << i + 1;
    EXPECT_NEAR(per_token->grad_norms[i], whole->grad_norms[i], 1e-5 * whole->grad_norms[i]) << "iteration " << i + 1;
    ASSERT_EQ(per_token->mtp_losses[i].size(), 2u);
    for (size_t k = 0; k < 2; ++k)
      EXPECT_NEAR(per_token->mtp_losses[i][k], whole->mtp_losses[i][k], 1e-5 * whole->mtp_losses[i][k]);
  }
  EXPECT_LT(grad_difference(*per_token, *whole), 1e-4);
}

// --recompute-modules moe with global_aux_loss (the rerun takes its forward's n̄): bit-identical to
// no recompute, in both modes, over steps of 4 micro-batches.
TEST(PerTokenMoe, RecomputeMoeWithGlobalAuxLossIsBitIdentical) {
  constexpr int kIters = 3;
  for (const bool per_token : {false, true}) {
    SCOPED_TRACE(per_token ? "per-token" : "default");
    std::vector<std::string> flags = testing::join({kGlobalAux, {"--micro-batch-size", "1"}});
    if (per_token) flags.push_back("--calculate-per-token-loss");
    auto plain = trained(flags, true, kIters);
    auto recompute = trained(
        testing::join({flags, {"--recompute-granularity", "selective", "--recompute-modules", "moe"}}), true, kIters);
    for (int i = 0; i < kIters; ++i) {
      EXPECT_EQ(plain->losses[i], recompute->losses[i]) << "iteration " << i + 1;
      EXPECT_EQ(plain->grad_norms[i], recompute->grad_norms[i]) << "iteration " << i + 1;
      EXPECT_EQ(plain->load_balancing_losses[i], recompute->load_balancing_losses[i]) << "iteration " << i + 1;
    }
    const Tensor &a = plain->model().params().flat_params(), &b = recompute->model().params().flat_params();
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), sizeof(float) * a.numel()), 0);
    const Tensor &ga = plain->model().params().flat_grads(), &gb = recompute->model().params().flat_grads();
    EXPECT_EQ(std::memcmp(ga.data<float>(), gb.data<float>(), sizeof(float) * ga.numel()), 0);
  }
}

TEST(PerTokenMoeFlags, AcceptedWithMoeMtpAndRecomputeMoeGlobalAux) {
  testing::PretrainCli cli;
  ASSERT_TRUE(cli.parse_minimal({"--calculate-per-token-loss", "--num-experts", "4", "--mtp-num-layers", "1"}).ok());
  testing::PretrainCli cli2;
  EXPECT_TRUE(cli2.parse_minimal({"--num-experts", "4", "--moe-router-load-balancing-type", "global_aux_loss",
                                  "--recompute-granularity", "selective", "--recompute-modules", "moe"})
                  .ok());
}

}  // namespace
}  // namespace gale
