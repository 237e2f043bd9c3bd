// --swap-optimizer on a tiny GPT (single process, distributed optimizer at DP1): the same losses,
// gradient norms and parameters as the unswapped run, bit for bit, with 1, 3 and 16 chunks (uneven)
// and with SGD; the allocator's exact count drops by the state minus the staging chunk; the
// checkpoints are those of the unswapped run, byte for byte, and a run resumes from either with or
// without the flag, bit for bit; an unusable --swap-optimizer-dir is a start-up error naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>

#include "testing_files.h"
#include "core/allocator.h"
#include "kernels/cpu/fused_ops.h"
#include "swap_runs.h"
#include "testing_run.h"
#include "train/checkpointing.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

// 17 positions: 28064 parameters, so that 3 chunks differ in size.
const std::vector<std::string> kFlags = {
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "17", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "6",
    "--lr", "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--mock-data", "--hidden-dropout", "0.1",
    "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000", "--make-vocab-size-divisible-by", "64",
    "--clip-grad", "0.05", "--weight-decay", "0.1", "--use-distributed-optimizer"};
constexpr int64_t kVocab = testing::kSwapTestVocab;

std::string temp_dir(const std::string& name) { return testing::fresh_swap_dir("gale_swapopt", name, false); }

OpTable ops_with(bool fused_adamw) { return testing::swap_test_ops(false, fused_adamw); }

struct SwapRun : testing::CheckpointRun {
  explicit SwapRun(const std::vector<std::string>& extra, bool fused_adamw = false)
      : CheckpointRun(testing::join({kFlags, extra}), make_self_communicator("world"), kVocab, {}, ops_with(fused_adamw)) {}
  int64_t numel() const { return engine->chunks[0]->params().trainable_numel(); }
};

std::vector<std::string> swap_flags(int64_t times) {
  return {"--swap-optimizer", "--swap-optimizer-times", std::to_string(times)};
}

struct Case {
  const char* name;
  std::vector<std::string> flags;
  int64_t times;
  int expected_chunks;
  bool fused_adamw = false;  // the vectorised kernel: chunk edges must keep its vector lanes
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class SwapOptimizer : public ::testing::TestWithParam<Case> {};

TEST_P(SwapOptimizer, TrainsBitIdenticallyToTheUnswappedRun) {
  const Case& c = GetParam();
  SwapRun plain(c.flags, c.fused_adamw);
  SwapRun swapped(testing::join({c.flags, swap_flags(c.times)}), c.fused_adamw);
  const OptimizerStateSwap* swap = swapped.engine->optimizer->swap();
  ASSERT_NE(swap, nullptr);
  EXPECT_EQ(swap->num_chunks(), c.expected_chunks);
  const std::vector<int64_t>& b = swap->bounds();
  std::set<int64_t> sizes;
  for (size_t i = 0; i + 1 < b.size(); ++i) sizes.insert(b[i + 1] - b[i]);
  if (c.expected_chunks > 1) {
    EXPECT_GT(sizes.size(), 1u) << "the chunks should be uneven";
  }
  const std::vector<double> x = plain.train(6), y = swapped.train(6);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(x[i], y[i]) << "loss of iteration " << i + 1;
    EXPECT_EQ(plain.grad_norms[i], swapped.grad_norms[i]) << "grad norm of iteration " << i + 1;
  }
  EXPECT_NE(x[0], x[5]);  // it trained
  EXPECT_EQ(plain.values(), swapped.values());
  // The state read back from the file is the unswapped optimizer's, bit for bit.
  const auto ps = plain.engine->optimizer->state(0), ss = swapped.engine->optimizer->state(0);
  ASSERT_EQ(ps.size(), ss.size());
  for (size_t k = 0; k < ps.size(); ++k) {
    EXPECT_EQ(ps[k].first, ss[k].first);
    ASSERT_EQ(ps[k].second.numel(), ss[k].second.numel());
    EXPECT_EQ(std::memcmp(ps[k].second.data<float>(), ss[k].second.data<float>(), ps[k].second.nbytes()), 0)
        << ps[k].first;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Chunks, SwapOptimizer,
    ::testing::Values(Case{"adam_1", {}, 1, 1}, Case{"adam_3", {}, 3, 3}, Case{"adam_16", {}, 16, 16},
                      Case{"adam_0", {}, 0, 1},
                      Case{"fused_adam_7", {}, 7, 7, true}, Case{"sgd_3", {"--optimizer", "sgd"}, 3, 3}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The allocator's exact count: the engine holds 8 bytes of Adam state per parameter without the
// flag, the staging chunk (2 states × the largest chunk) with it; training's peak drops by as much.
TEST(SwapOptimizerMemory, ResidentStateDropsToOneChunk) {
  { SwapRun warm({}); }  // statics (tables, thread pools) allocated once, before measuring
  Allocator& a = host_allocator();
  const int64_t base = a.current_bytes();
  auto plain = std::make_unique<SwapRun>(std::vector<std::string>{});
  const int64_t plain_bytes = a.current_bytes() - base, n = plain->numel();
  EXPECT_EQ(plain->engine->optimizer->state_bytes(), 8 * n);
  a.reset_peak();
  plain->train(3);
  const int64_t plain_peak = a.peak_bytes() - base;
  plain.reset();
  ASSERT_EQ(a.current_bytes(), base);
  auto swapped = std::make_unique<SwapRun>(swap_flags(16));
  const int64_t swapped_bytes = a.current_bytes() - base;
  const OptimizerStateSwap& swap = *swapped->engine->optimizer->swap();
  const std::vector<int64_t>& b = swap.bounds();
  int64_t largest = 0;
  for (size_t i = 0; i + 1 < b.size(); ++i) largest = std::max(largest, b[i + 1] - b[i]);
  const int64_t staging = 2 * 4 * largest;
  EXPECT_EQ(swap.staging_bytes(), staging);
  EXPECT_EQ(swapped->engine->optimizer->state_bytes(), staging);
  EXPECT_EQ(swap.file_bytes(), 8 * n);
  EXPECT_LE(largest, n / 16 + 64);  // about state/times
  EXPECT_EQ(plain_bytes - swapped_bytes, 8 * n - staging) << n << " parameters";
  a.reset_peak();
  swapped->train(3);
  const int64_t swapped_peak = a.peak_bytes() - base;
  std::cout << "[ swap-optimizer ] " << n << " parameters, 16 chunks: engine " << plain_bytes << " -> "
            << swapped_bytes << " bytes, training peak " << plain_peak << " -> " << swapped_peak
            << " bytes (state " << 8 * n << ", staging " << staging << ")\n";
  EXPECT_EQ(plain_peak - swapped_peak, 8 * n - staging);
}

using testing::expect_same_files;

TEST(SwapOptimizerCheckpoint, SameCheckpointAndResumesEitherWay) {
  const std::string dir_plain = temp_dir("plain"), dir_swap = temp_dir("swap");
  SwapRun whole({});
  const std::vector<double> expected = whole.train(6);
  const std::vector<uint32_t> expected_values = whole.values();

  SwapRun first_plain({"--save", dir_plain, "--save-interval", "3"});
  first_plain.train(3);
  ASSERT_TRUE(first_plain.save().ok());
  SwapRun first_swap(testing::join({{"--save", dir_swap, "--save-interval", "3"}, swap_flags(3)}));
  first_swap.train(3);
  ASSERT_TRUE(first_swap.save().ok());
  expect_same_files(dir_plain, dir_swap);
  expect_same_files(dir_swap, dir_plain);

  for (const auto& [dir, flags] :
       {std::pair<std::string, std::vector<std::string>>{dir_swap, {}}, {dir_plain, swap_flags(3)},
        {dir_swap, swap_flags(16)}}) {
    SwapRun second(testing::join({{"--load", dir}, flags}));
    ASSERT_TRUE(second.load().ok());
    const std::vector<double> b = second.train(3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << dir << " iteration " << 4 + i;
    EXPECT_EQ(second.values(), expected_values) << dir;
  }
  std::filesystem::remove_all(dir_plain);
  std::filesystem::remove_all(dir_swap);
}

TEST(SwapOptimizerErrors, UnusableDirectoryIsAStartUpError) {
  const std::string missing = "/nonexistent-gale-swap-dir";
  const std::string m =
      testing::engine_build_error(testing::join({kFlags, swap_flags(4), {"--swap-optimizer-dir", missing}}), kVocab);
  EXPECT_NE(m.find("--swap-optimizer-dir " + missing), std::string::npos) << m;
  EXPECT_NE(m.find(missing + "/gale-swap-optimizer-"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

}  // namespace
}  // namespace gale
