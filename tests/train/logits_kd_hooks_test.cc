// The training loop's offline-distillation hooks (train/logits_kd_hooks.h) on one rank: the saver's
// shard holds the logits' top-K per iteration and is written at flush(); the student's hook gives
// the gradient α·mask·d kl / d logits (central differences of the library's KL), scales the LM
// gradient by 1 − α, sums Megatron's report entries, and reports a missing iteration; both pass
// through when inactive (evaluation); the dataset identity of a command line.
#include "train/logits_kd_hooks.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "model/topk_kl.h"
#include "pretrain_cli.h"
#include "testing.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kS = 3, kB = 2, kT = kS * kB, kV = 40, kK = 5;

class LogitsKdHooks : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gale_logits_kd_hooks_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
            "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    id_.seq_length = kS;
    id_.train_samples = 8;
  }
  void TearDown() override { fs::remove_all(dir_); }
  Tensor logits(uint64_t seed) const {
    const std::vector<float> r = testing::random_vector(kT * kV, seed, 3.0f);
    Tensor t = Tensor::empty({kT, kV});
    std::copy(r.begin(), r.end(), t.data<float>());
    return t;
  }
  MicroBatch mb() const {
    MicroBatch m;
    m.S = kS;
    m.B = kB;
    return m;
  }
  // A teacher's shard of iterations 0 and 1 (two micro-batches each) through the saver hook.
  void save_teacher(int64_t* iteration) {
    LogitsSaverSettings s;
    s.k = kK;
    LogitsSaverHook saver(dir_.string(), s, id_, 0, 0, nullptr, [iteration] { return *iteration; });
    saver.set_active(true);
    for (*iteration = 0; *iteration < 2; ++*iteration)
      for (int m = 0; m < 2; ++m) {
        const HeadLogitsHook::Result r = saver.training_logits(mb(), logits(10 * *iteration + m), mask_, 0);
        EXPECT_EQ(r.lm_coef, 0.0);  // Megatron's saver zeroes the LM loss
        EXPECT_FALSE(r.report_lm_loss);
      }
    EXPECT_FALSE(fs::exists(dir_));  // nothing written before flush()
    ASSERT_TRUE(saver.flush().ok());
  }
  fs::path dir_;
  LogitsDatasetIdentity id_;
  std::vector<float> mask_ = {1, 1, 0, 1, 1, 1};
};

TEST_F(LogitsKdHooks, SaverWritesEachIterationsTopKAtFlush) {
  int64_t iteration = 0;
  ASSERT_NO_FATAL_FAILURE(save_teacher(&iteration));
  ASSERT_TRUE(fs::exists(dir_ / "cp0_dp0__1.tar"));
  StatusOr<CachedLogitsReader> reader = CachedLogitsReader::open(dir_.string(), 0, 0, 1, cached_logits_dataset_hash(id_));
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  for (int64_t it = 0; it < 2; ++it) {
    StatusOr<std::vector<TopKLogProbs>> mbs = reader.value().iteration(it);
    ASSERT_TRUE(mbs.ok()) << mbs.status().message();
    ASSERT_EQ(mbs.value().size(), 2u);
    for (int m = 0; m < 2; ++m) {
      const Tensor z = logits(10 * it + m);
      StatusOr<TopKLogProbs> want = select_topk_logprobs(z.data<float>(), kS, kB, kV, kK, std::nullopt, 1, LogitsSaveDtype::kF16);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(mbs.value()[m].indices, want.value().indices);
      EXPECT_EQ(mbs.value()[m].logprobs, want.value().logprobs);
    }
  }
}

TEST_F(LogitsKdHooks, StudentGradientIsAlphaTimesTheKlsAndTheReportIsMegatrons) {
  int64_t iteration = 0;
  ASSERT_NO_FATAL_FAILURE(save_teacher(&iteration));
  StatusOr<CachedLogitsReader> reader = CachedLogitsReader::open(dir_.string(), 0, 0, 1, cached_logits_dataset_hash(id_));
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  const double alpha = 0.3;
  iteration = 1;
  CachedLogitsKdHook hook(std::move(reader).value(), alpha, false, nullptr, [&iteration] { return iteration; });
  const Tensor z = logits(77);
  // Inactive (evaluation): the LM loss alone, nothing read.
  HeadLogitsHook::Result r = hook.training_logits(mb(), z, mask_, 0);
  EXPECT_EQ(r.lm_coef, 1.0);
  EXPECT_FALSE(r.logit_grad.defined());
  hook.set_active(true);
  r = hook.training_logits(mb(), z, mask_, 0);  // iteration 1, micro-batch 0
  ASSERT_TRUE(hook.take_error().ok());
  EXPECT_DOUBLE_EQ(r.lm_coef, 1.0 - alpha);
  ASSERT_TRUE(r.logit_grad.defined());
  ASSERT_EQ(r.logit_grad.shape(), (Shape{kT, kV}));
  // The saved top-K of iteration 1, micro-batch 0 (the teacher's logits 10).
  StatusOr<TopKLogProbs> t = select_topk_logprobs(logits(10).data<float>(), kS, kB, kV, kK, std::nullopt, 1,
                                                  LogitsSaveDtype::kF16);
  ASSERT_TRUE(t.ok());
  const TeacherTopK teacher{t.value().logprobs.data(), t.value().indices.data(), t.value().K};
  auto kd_of = [&](const std::vector<float>& x) {
    std::vector<double> kl(kT);
    topk_kl_forward_backward(x.data(), kT, kV, 0, teacher, nullptr, kl.data(), nullptr);
    double kd = 0.0;
    for (int64_t i = 0; i < kT; ++i) kd += mask_[i] * kl[i];
    return kd;
  };
  std::vector<float> x(z.data<float>(), z.data<float>() + kT * kV);
  const double kd = kd_of(x);
  for (int64_t i = 0; i < kT * kV; i += 7) {  // d (α·kd) / d z_i by central differences
    const float h = 1e-2f, x0 = x[i];
    x[i] = x0 + h;
    const double up = kd_of(x);
    x[i] = x0 - h;
    const double down = kd_of(x);
    x[i] = x0;
    const double fd = alpha * (up - down) / (2.0 * h);
    EXPECT_NEAR(r.logit_grad.data<float>()[i], fd, 2e-4 + 1e-3 * std::fabs(fd)) << i;
  }
  hook.training_lm_loss(12.5, 5.0);
  const CachedLogitsKdHook::Sums s = hook.take_sums();
  EXPECT_NEAR(s.kd, kd, 1e-9 * kd);
  EXPECT_EQ(s.kd_tokens, 5.0);
  EXPECT_NEAR(s.total, alpha * kd + (1.0 - alpha) * 12.5, 1e-9);
  EXPECT_EQ(s.total_tokens, 5.0);
  // Micro-batch 1 exists; a third does not: an error naming the iteration.
  r = hook.training_logits(mb(), z, mask_, 0);
  hook.training_lm_loss(1.0, 5.0);
  EXPECT_TRUE(hook.take_error().ok());
  r = hook.training_logits(mb(), z, mask_, 0);
  EXPECT_EQ(r.lm_coef, 1.0);
  const Status e = hook.take_error();
  EXPECT_NE(e.message().find("micro-batch 2 of iteration 1 out of range: only 2"), std::string::npos) << e.message();
  // Iteration 2 was never saved.
  iteration = 2;
  r = hook.training_logits(mb(), z, mask_, 0);
  EXPECT_NE(hook.take_error().message().find("no teacher logits for iteration 2"), std::string::npos);
}

TEST(LogitsDatasetIdentity, FromTheCommandLineAsMegatronsHash) {
  testing::PretrainCli mock;
  ASSERT_TRUE(mock.parse_minimal({"--global-batch-size", "4", "--seed", "7"}).ok());
  StatusOr<LogitsDatasetIdentity> a = logits_dataset_identity(mock.args);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value().seed, 7);
  EXPECT_EQ(a.value().seq_length, 16);
  EXPECT_EQ(a.value().train_samples, 40);  // --train-iters 10 × --global-batch-size 4
  EXPECT_TRUE(a.value().blend.empty());
  testing::PretrainCli weighted;
  std::vector<std::string> argv = testing::minimal_pretrain_flags();
  argv.erase(std::find(argv.begin(), argv.end(), "--mock-data"));
  for (const char* f : {"--data-path", "0.3", "/d/one_text_document", "0.7", "/e/two.bin", "--train-samples", "64"})
    argv.push_back(f);
  (void)weighted.parse(argv);  // the files do not exist; the identity needs the flags only
  StatusOr<LogitsDatasetIdentity> b = logits_dataset_identity(weighted.args);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.value().train_samples, 64);
  ASSERT_EQ(b.value().blend.size(), 2u);
  EXPECT_EQ(b.value().blend[0], (std::pair<double, std::string>{0.3, "one_text_document"}));
  EXPECT_EQ(b.value().blend[1], (std::pair<double, std::string>{0.7, "two"}));
  weighted.args.data.data_path = {"/d/only"};
  b = logits_dataset_identity(weighted.args);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.value().blend, (std::vector<std::pair<double, std::string>>{{1.0, "only"}}));
  EXPECT_FALSE(b.value().per_split);
}

// --train-data-path (and --per-split-data-args-path's "train"): Megatron's "blend_per_split" of
// the train split; --data-path wins over the per-split flags (get_blend_and_blend_per_split).
TEST_F(LogitsKdHooks, DatasetIdentityOfPerSplitDataPaths) {
  testing::PretrainCli cli;
  std::vector<std::string> argv = testing::minimal_pretrain_flags();
  argv.erase(std::find(argv.begin(), argv.end(), "--mock-data"));
  for (const char* f : {"--train-data-path", "30", "/d/train_a", "70", "/d/train_b.idx", "--valid-data-path", "/d/v"})
    argv.push_back(f);
  (void)cli.parse(argv);
  StatusOr<LogitsDatasetIdentity> a = logits_dataset_identity(cli.args);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a.value().per_split);
  EXPECT_EQ(a.value().blend, (std::vector<std::pair<double, std::string>>{{30.0, "train_a"}, {70.0, "train_b"}}));
  cli.args.data.train_data_path.clear();  // only a validation split: "train": null
  a = logits_dataset_identity(cli.args);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a.value().per_split);
  EXPECT_TRUE(a.value().blend.empty());
  fs::create_directories(dir_);
  const std::string json = (dir_ / "splits.json").string();
  {
    std::ofstream(json) << R"({"train": "0.5 /x/p 0.5 /x/q", "valid": null, "test": null})";
  }
  cli.args.data.valid_data_path.clear();
  cli.args.data.per_split_data_args_path = json;
  a = logits_dataset_identity(cli.args);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a.value().per_split);
  EXPECT_EQ(a.value().blend, (std::vector<std::pair<double, std::string>>{{0.5, "p"}, {0.5, "q"}}));
  cli.args.data.data_path = {"/d/main"};  // --data-path first: a plain "blend"
  a = logits_dataset_identity(cli.args);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a.value().per_split);
  EXPECT_EQ(a.value().blend, (std::vector<std::pair<double, std::string>>{{1.0, "main"}}));
  cli.args.data.data_path.clear();
  cli.args.data.per_split_data_args_path = (dir_ / "missing.json").string();
  a = logits_dataset_identity(cli.args);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--per-split-data-args-path"), std::string::npos) << a.status().message();
}

}  // namespace
}  // namespace gale
