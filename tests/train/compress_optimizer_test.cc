// --compress-optimizer on a tiny GPT (single process): the same losses, gradient norms, parameters
// and optimizer state as the uncompressed run, bit for bit (AdamW with the reference and the
// vectorised kernel, SGD, with and without the distributed optimizer at DP1); the allocator's exact
// count moves by what the optimizer reports (compressed chunks + one staging chunk) and drops on a
// model large enough for several chunks; checkpoints are the uncompressed run's, byte for byte, and
// resume either way.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <iostream>

#include "core/allocator.h"
#include "kernels/cpu/fused_ops.h"
#include "swap_runs.h"
#include "testing_files.h"
#include "testing_run.h"
#include "train/checkpointing.h"

namespace gale {
namespace {

// About 104k parameters: two compression chunks of 65536 elements.
std::vector<std::string> model_flags(const std::string& hidden, const std::string& layers) {
  return {"--num-layers", layers, "--hidden-size", hidden, "--num-attention-heads", "4", "--seq-length", "16",
          "--max-position-embeddings", "17", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "6",
          "--lr", "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--mock-data", "--hidden-dropout",
          "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
          "--make-vocab-size-divisible-by", "64", "--clip-grad", "0.05", "--weight-decay", "0.1"};
}
constexpr int64_t kVocab = testing::kSwapTestVocab;

OpTable ops_with(bool fused_adamw) { return testing::swap_test_ops(false, fused_adamw); }

struct PackRun : testing::CheckpointRun {
  explicit PackRun(const std::vector<std::string>& extra, bool fused_adamw = false, const std::string& hidden = "64",
               const std::string& layers = "2")
      : CheckpointRun(testing::join({model_flags(hidden, layers), extra}), make_self_communicator("world"), kVocab, {},
                      ops_with(fused_adamw)) {}
  int64_t numel() const { return engine->chunks[0]->params().trainable_numel(); }
};

void expect_same_state(const Optimizer& a, const Optimizer& b) {
  const auto ps = a.state(0), ss = b.state(0);
  ASSERT_EQ(ps.size(), ss.size());
  for (size_t k = 0; k < ps.size(); ++k) {
    EXPECT_EQ(ps[k].first, ss[k].first);
    ASSERT_EQ(ps[k].second.numel(), ss[k].second.numel());
    EXPECT_EQ(std::memcmp(ps[k].second.data<float>(), ss[k].second.data<float>(), ps[k].second.nbytes()), 0)
        << ps[k].first;
  }
}

struct Case {
  const char* name;
  std::vector<std::string> flags;
  bool fused_adamw = false;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class CompressOptimizer : public ::testing::TestWithParam<Case> {};

TEST_P(CompressOptimizer, TrainsBitIdenticallyToTheUncompressedRun) {
  const Case& c = GetParam();
  PackRun plain(c.flags, c.fused_adamw);
  PackRun packed(testing::join({c.flags, {"--compress-optimizer"}}), c.fused_adamw);
  const OptimizerStateSwap* store = packed.engine->optimizer->swap();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->compressed());
  EXPECT_EQ(store->num_chunks(), 2);  // about 104k elements in chunks of 65536
  const std::vector<double> x = plain.train(6), y = packed.train(6);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(x[i], y[i]) << "loss of iteration " << i + 1;
    EXPECT_EQ(plain.grad_norms[i], packed.grad_norms[i]) << "grad norm of iteration " << i + 1;
  }
  EXPECT_NE(x[0], x[5]);  // it trained
  EXPECT_EQ(plain.values(), packed.values());
  expect_same_state(*plain.engine->optimizer, *packed.engine->optimizer);
  // The chunks hold compressed trained state: less than raw, more than nothing.
  EXPECT_GT(store->compressed_bytes(), 0);
  if (store->num_states() > 0) EXPECT_LT(store->compressed_bytes(), store->raw_bytes());
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, CompressOptimizer,
    ::testing::Values(Case{"adam", {}}, Case{"fused_adam", {}, true},
                      Case{"adam_distributed", {"--use-distributed-optimizer"}},
                      Case{"sgd", {"--optimizer", "sgd"}}, Case{"bf16", {"--bf16"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The allocator's exact count: the engine with the flag holds, instead of 8 bytes of Adam state per
// parameter, what the optimizer reports (one staging chunk and the compressed chunks), and after
// training the difference is still exactly that; on a model of many chunks the peak drops.
TEST(CompressOptimizerMemory, AllocatorCountsTheCompressedState) {
  { PackRun warm({}, false, "128", "4"); }  // statics allocated once, before measuring
  Allocator& a = host_allocator();
  const int64_t base = a.current_bytes();
  auto plain = std::make_unique<PackRun>(std::vector<std::string>{}, false, "128", "4");
  const int64_t n = plain->numel();
  EXPECT_EQ(plain->engine->optimizer->state_bytes(), 8 * n);
  a.reset_peak();
  plain->train(3);
  const int64_t plain_peak = a.peak_bytes() - base, plain_after = a.current_bytes() - base;
  plain.reset();
  a.release_cache();
  ASSERT_EQ(a.current_bytes(), base);
  auto packed = std::make_unique<PackRun>(std::vector<std::string>{"--compress-optimizer"}, false, "128", "4");
  const OptimizerStateSwap& store = *packed->engine->optimizer->swap();
  EXPECT_GT(store.num_chunks(), 8);
  a.reset_peak();
  packed->train(3);
  const int64_t packed_peak = a.peak_bytes() - base, packed_after = a.current_bytes() - base;
  const int64_t state = packed->engine->optimizer->state_bytes();
  EXPECT_EQ(state, store.staging_bytes() + store.compressed_bytes());
  // Between steps the only difference is the state (each plane's allocation rounds up to 64 bytes).
  const int64_t planes = 2 * 4 * store.num_chunks();
  EXPECT_GE(plain_after - packed_after, 8 * n - state - planes * 64);
  EXPECT_LE(plain_after - packed_after, 8 * n - state);
  std::cout << "[ compress-optimizer ] " << n << " parameters, " << store.num_chunks() << " chunks: state " << 8 * n
            << " -> " << state << " bytes (compressed " << store.compressed_bytes() << ", ratio "
            << double(store.compressed_bytes()) / double(store.raw_bytes()) << ", staging " << store.staging_bytes()
            << "), training peak " << plain_peak << " -> " << packed_peak << " bytes\n";
  EXPECT_LT(state, 8 * n);
  EXPECT_LT(packed_peak, plain_peak);
}

TEST(CompressOptimizerCheckpoint, SameCheckpointAndResumesEitherWay) {
  const std::string dir_plain = testing::fresh_swap_dir("gale_compressopt", "plain", false);
  const std::string dir_packed = testing::fresh_swap_dir("gale_compressopt", "packed", false);
  PackRun whole({});
  const std::vector<double> expected = whole.train(6);
  const std::vector<uint32_t> expected_values = whole.values();
  PackRun first_plain({"--save", dir_plain, "--save-interval", "3"});
  first_plain.train(3);
  ASSERT_TRUE(first_plain.save().ok());
  PackRun first_packed({"--save", dir_packed, "--save-interval", "3", "--compress-optimizer"});
  first_packed.train(3);
  ASSERT_TRUE(first_packed.save().ok());
  testing::expect_same_files(dir_plain, dir_packed);
  testing::expect_same_files(dir_packed, dir_plain);
  for (const auto& [dir, flags] : {std::pair<std::string, std::vector<std::string>>{dir_packed, {}},
                                   {dir_plain, {"--compress-optimizer"}}}) {
    PackRun second(testing::join({{"--load", dir}, flags}));
    ASSERT_TRUE(second.load().ok());
    const std::vector<double> b = second.train(3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << dir << " iteration " << 4 + i;
    EXPECT_EQ(second.values(), expected_values) << dir;
  }
  std::filesystem::remove_all(dir_plain);
  std::filesystem::remove_all(dir_packed);
}

}  // namespace
}  // namespace gale
