// --reuse-fp32-param on a tiny GPT/LLaMA with --bf16: the same losses, gradient norms and final
// parameters as a plain --bf16 run, bit for bit (Adam, SGD, Muon); 2 bytes per parameter less in
// the allocator's exact count; checkpoints identical to a plain run's, and a run resumes with or
// without the flag from either, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "testing_files.h"
#include "core/allocator.h"
#include "testing_checkpoint_run.h"
#include "train/checkpointing.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

const std::vector<std::string> kFlags = {
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "6",
    "--lr", "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--mock-data", "--hidden-dropout", "0.1",
    "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000", "--make-vocab-size-divisible-by", "64",
    "--bf16", "--clip-grad", "0.05"};

struct BfRun : testing::CheckpointRun {
  explicit BfRun(const std::vector<std::string>& extra)
      : CheckpointRun(testing::join({kFlags, extra}), make_self_communicator("world"), 60) {}
  // Every parameter's f32 value, as bits (every chunk, through read_values: the f32 values under
  // --reuse-fp32-param, rather than the first chunk's flat buffer).
  std::vector<uint32_t> values() const {
    finish_param_sync(*engine);
    std::vector<uint32_t> out;
    for (const auto& chunk : engine->chunks) {
      const ParamBuffer& pb = chunk->params();
      std::vector<float> v(static_cast<size_t>(pb.numel()));
      pb.read_values(0, pb.numel(), v.data());
      const size_t at = out.size();
      out.resize(at + v.size());
      std::memcpy(out.data() + at, v.data(), v.size() * sizeof(float));
    }
    return out;
  }
  int64_t numel() const {
    int64_t n = 0;
    for (const auto& chunk : engine->chunks) n += chunk->params().numel();
    return n;
  }
};

std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_reusefp32_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

class ReuseFp32Param : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(ReuseFp32Param, TrainsBitIdenticallyToPlainBf16) {
  BfRun plain(GetParam());
  BfRun reuse(testing::join({GetParam(), {"--reuse-fp32-param"}}));
  ASSERT_TRUE(reuse.model().params().reuses_fp32());
  EXPECT_EQ(plain.values(), reuse.values());
  const std::vector<double> a = plain.train(6), b = reuse.train(6);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(a[i], b[i]) << "loss of iteration " << i + 1;
    EXPECT_EQ(plain.grad_norms[i], reuse.grad_norms[i]) << "grad norm of iteration " << i + 1;
  }
  EXPECT_NE(a[0], a[5]);  // it trained
  EXPECT_EQ(plain.engine->optimizer->params_norm(), reuse.engine->optimizer->params_norm());
  const std::vector<uint32_t> pv = plain.values(), rv = reuse.values();
  ASSERT_EQ(pv.size(), rv.size());
  int64_t differ = 0;
  for (size_t i = 0; i < pv.size(); ++i) differ += pv[i] != rv[i];
  EXPECT_EQ(differ, 0) << "of " << pv.size() << " parameters";
}

std::string case_name(const ::testing::TestParamInfo<std::vector<std::string>>& info) {
  static const char* const names[] = {"adam", "sgd", "muon", "llama"};
  return names[info.index];
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ReuseFp32Param,
    ::testing::Values(std::vector<std::string>{}, std::vector<std::string>{"--optimizer", "sgd"},
                      std::vector<std::string>{"--optimizer", "muon"},
                      std::vector<std::string>{"--group-query-attention", "--num-query-groups", "2", "--normalization",
                                               "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                                               "--disable-bias-linear", "--untie-embeddings-and-output-weights"}),
    case_name);

// The allocator's exact count: a plain --bf16 engine holds an f32 master and a bf16 copy of every
// parameter (6 bytes), the --reuse-fp32-param one 4 bytes; training's peak falls by as much.
TEST(ReuseFp32ParamMemory, TwoBytesPerParameterLess) {
  { BfRun warm({}); }  // statics (tables, thread pools) allocated once, before measuring
  Allocator& a = host_allocator();
  const int64_t base = a.current_bytes();
  auto plain = std::make_unique<BfRun>(std::vector<std::string>{});
  const int64_t plain_bytes = a.current_bytes() - base;
  const int64_t n = plain->numel();
  EXPECT_EQ(plain->model().params().value_bytes(), 6 * n);
  a.reset_peak();
  plain->train(3);
  const int64_t plain_peak = a.peak_bytes() - base;
  plain.reset();
  ASSERT_EQ(a.current_bytes(), base);
  auto reuse = std::make_unique<BfRun>(std::vector<std::string>{"--reuse-fp32-param"});
  const int64_t reuse_bytes = a.current_bytes() - base;
  EXPECT_EQ(plain_bytes - reuse_bytes, 2 * n) << n << " parameters";
  const ParamBuffer& pb = reuse->model().params();
  EXPECT_EQ(pb.value_bytes(), 4 * n + 8 * pb.num_split_ties());
  a.reset_peak();
  reuse->train(3);
  const int64_t reuse_peak = a.peak_bytes() - base;
  std::cout << "[ reuse-fp32-param ] " << n << " parameters: engine " << plain_bytes << " -> " << reuse_bytes
            << " bytes, training peak " << plain_peak << " -> " << reuse_peak << " bytes\n";
  EXPECT_EQ(plain_peak - reuse_peak, 2 * n);
}

using testing::expect_same_files;

TEST(ReuseFp32ParamCheckpoint, SameCheckpointAndResumesEitherWay) {
  const std::string dir_plain = temp_dir("plain"), dir_reuse = temp_dir("reuse");
  BfRun whole({});
  const std::vector<double> expected = whole.train(6);
  const std::vector<uint32_t> expected_values = whole.values();

  BfRun first_plain({"--save", dir_plain, "--save-interval", "3"});
  first_plain.train(3);
  ASSERT_TRUE(first_plain.save().ok());
  BfRun first_reuse({"--save", dir_reuse, "--save-interval", "3", "--reuse-fp32-param"});
  first_reuse.train(3);
  ASSERT_TRUE(first_reuse.save().ok());
  expect_same_files(dir_plain, dir_reuse);
  expect_same_files(dir_reuse, dir_plain);

  for (const auto& [dir, flags] :
       {std::pair<std::string, std::vector<std::string>>{dir_reuse, {}}, {dir_plain, {"--reuse-fp32-param"}},
        {dir_reuse, {"--reuse-fp32-param"}}}) {
    BfRun second(testing::join({{"--load", dir}, flags}));
    ASSERT_TRUE(second.load().ok());
    const std::vector<double> b = second.train(3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << dir << " iteration " << 4 + i;
    EXPECT_EQ(second.values(), expected_values) << dir;
  }
  std::filesystem::remove_all(dir_plain);
  std::filesystem::remove_all(dir_reuse);
}

}  // namespace
}  // namespace gale
