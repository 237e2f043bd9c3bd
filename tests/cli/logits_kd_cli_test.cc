// `gale pretrain --logits-save-dir` / `--logits-load-dir` end to end (Megatron main's offline
// distillation, train/logits_kd_hooks.h): a frozen teacher writes Megatron's shards (read back by
// the library's reader, which checks the layout and the dataset hash) whose top-K are the teacher's
// logits' (from --config-logger-dir's input_and_logits dump), at a checkpoint save and at the end of
// training, alike at TP 2; a student's first iteration logs kd (the library's loss on its own dumped
// logits and the saved top-K) and α·kd + (1 − α)·lm; α = 0 trains exactly as a plain run; DP 2 and
// TP 2 reproduce one process; a missing iteration is a one-line error, or with
// --logits-load-ignore-errors a warning and the LM loss.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "ckpt/torch_file.h"
#include "cli/log_line.h"
#include "cli/logits_kd_cli_util.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "model/topk_kl.h"
#include "subprocess.h"
#include "train/cached_logits.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing::logged_values;
using testing::TempDir;

constexpr int64_t kS = 32, kV = 4096, kMicroBatches = 4, kTopK = 8;

// A tiny 2-layer model, 4 samples per iteration in micro-batches of 1, 2 iterations (tests/cli/logits_kd_cli_util.h) (the dataset hash holds 2 × 4 training samples: teacher
// and students alike).
std::vector<std::string> model(std::vector<std::string> extra) { return testing::kd_tiny_model(2, extra); }

test::RunResult gale(int np, std::vector<std::string> flags) { return testing::run_kd_tiny_model(np, 2, flags); }

// The teacher: another initialisation (not in the dataset hash), frozen, top-8 in fp16.
std::vector<std::string> teacher_flags(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> f = {"--init-method-std", "0.2", "--freeze-all-layers", "--logits-save-dir", dir,
                                "--logits-save-top-k", std::to_string(kTopK)};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

std::string hash() {
  LogitsDatasetIdentity id;
  id.seq_length = kS;
  id.train_samples = 2 * kMicroBatches;
  return cached_logits_dataset_hash(id);
}

// Logits [S·B, V] of call n of the input_and_logits dump in `dir` (one process).
std::vector<float> dumped_logits(const std::string& dir, int64_t n) {
  StatusOr<PyRef> r = read_torch_file(dir + "/input_and_logits.rank_0_0_0_0_0.iter" + std::to_string(n) + ".pth");
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return {};
  const PyValue* v = r.value()->get("logits");
  EXPECT_TRUE(v && v->kind == PyValue::kTensor);
  if (!v || v->kind != PyValue::kTensor || v->data.numel() != kS * kV) return {};
  return std::vector<float>(v->data.data<float>(), v->data.data<float>() + kS * kV);
}

// Both iterations' micro-batches from `dir` as a one-rank student reads them.
std::vector<std::vector<TopKLogProbs>> read_shards(const std::string& dir) {
  StatusOr<CachedLogitsReader> reader = CachedLogitsReader::open(dir, 0, 0, 1, hash());
  EXPECT_TRUE(reader.ok()) << reader.status().message();
  std::vector<std::vector<TopKLogProbs>> out;
  for (int64_t it = 0; reader.ok() && it < 2; ++it) {
    StatusOr<std::vector<TopKLogProbs>> mbs = reader.value().iteration(it);
    EXPECT_TRUE(mbs.ok()) << mbs.status().message();
    out.push_back(mbs.ok() ? mbs.value() : std::vector<TopKLogProbs>{});
  }
  return out;
}

class LogitsKdCli : public ::testing::Test {
 protected:
  // One teacher for the whole suite: --save-interval 1 flushes a shard per iteration.
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    teacher_ = new test::RunResult(gale(1, teacher_flags(dir_->file("logits"), {"--save", dir_->file("ckpt"),
                                                                               "--save-interval", "1",
                                                                               "--config-logger-dir", dir_->file("cfg")})));
  }
  static void TearDownTestSuite() {
    delete teacher_;
    delete dir_;
  }
  static TempDir* dir_;
  static test::RunResult* teacher_;
};
TempDir* LogitsKdCli::dir_ = nullptr;
test::RunResult* LogitsKdCli::teacher_ = nullptr;

TEST_F(LogitsKdCli, TeacherWritesMegatronShardsOfItsLogitsTopK) {
  ASSERT_EQ(teacher_->exit_code, 0) << teacher_->output;
  // A shard per checkpoint save (Megatron's flush point), named by (CP, DP, last iteration).
  EXPECT_TRUE(fs::exists(dir_->file("logits/cp0_dp0__0.tar"))) << teacher_->output;
  EXPECT_TRUE(fs::exists(dir_->file("logits/cp0_dp0__1.tar"))) << teacher_->output;
  // The LM loss is zeroed while saving (Megatron's saver), and Megatron's training_log prints every
  // entry whose average is >= 0: "lm loss: 0.000000E+00" on both lines.
  const std::vector<double> lm = logged_values(teacher_->output, "lm loss");
  ASSERT_EQ(lm.size(), 2u) << teacher_->output;
  for (double v : lm) EXPECT_EQ(v, 0.0);
  EXPECT_NE(teacher_->output.find("| lm loss: 0.000000E+00 |"), std::string::npos) << teacher_->output;
  const std::vector<std::vector<TopKLogProbs>> shards = read_shards(dir_->file("logits"));
  ASSERT_EQ(shards.size(), 2u);
  for (int64_t it = 0; it < 2; ++it) {
    ASSERT_EQ(shards[it].size(), static_cast<size_t>(kMicroBatches));
    for (int64_t m = 0; m < kMicroBatches; ++m) {
      const TopKLogProbs& saved = shards[it][m];
      ASSERT_EQ(saved.S, kS);
      ASSERT_EQ(saved.B, 1);
      ASSERT_EQ(saved.K, kTopK);
      const std::vector<float> logits = dumped_logits(dir_->file("cfg"), it * kMicroBatches + m);
      ASSERT_EQ(logits.size(), static_cast<size_t>(kS * kV));
      StatusOr<TopKLogProbs> want =
          select_topk_logprobs(logits.data(), kS, 1, kV, kTopK, std::nullopt, 1, LogitsSaveDtype::kF16);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(saved.indices, want.value().indices) << "iteration " << it << " micro-batch " << m;
      EXPECT_EQ(saved.logprobs, want.value().logprobs) << "iteration " << it << " micro-batch " << m;
      for (int64_t t = 0; t < kS; ++t) {  // independently of the library: the first is the argmax
        const float* row = logits.data() + t * kV;
        EXPECT_EQ(saved.indices[t * kTopK], std::max_element(row, row + kV) - row);
      }
    }
  }
}

TEST_F(LogitsKdCli, TeacherAtTensorParallel2WritesTheSameTopKAtTheEnd) {
  ASSERT_EQ(teacher_->exit_code, 0) << teacher_->output;
  TempDir dir;
  const test::RunResult r = gale(2, teacher_flags(dir.file("logits"), {"--tensor-model-parallel-size", "2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // No --save: one shard written at the end of training, from TP rank 0 only.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.file("logits"))) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"cp0_dp0__1.tar"});
  const auto tp2 = read_shards(dir.file("logits")), tp1 = read_shards(dir_->file("logits"));
  ASSERT_EQ(tp2.size(), 2u);
  for (int64_t it = 0; it < 2; ++it)
    for (int64_t m = 0; m < kMicroBatches; ++m) {
      const TopKLogProbs &a = tp1[it][m], &b = tp2[it][m];
      ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
      for (size_t i = 0; i < a.logprobs.size(); ++i) EXPECT_NEAR(b.logprobs[i], a.logprobs[i], 4e-3) << i;
      for (int64_t t = 0; t < kS; ++t)  // the same top-1 where it is not a near tie
        if (a.logprobs[t * kTopK] - a.logprobs[t * kTopK + 1] > 1e-2) {
          EXPECT_EQ(b.indices[t * kTopK], a.indices[t * kTopK]);
        }
    }
}

std::vector<std::string> student(const TempDir& teacher, double alpha, std::vector<std::string> extra) {
  std::vector<std::string> f = {"--logits-load-dir", teacher.file("logits"), "--logits-load-kd-loss-alpha",
                                std::to_string(alpha)};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

TEST_F(LogitsKdCli, StudentLossIsTheAlphaMixAndLayoutsMatchOneProcess) {
  ASSERT_EQ(teacher_->exit_code, 0) << teacher_->output;
  TempDir dir;
  const test::RunResult plain = gale(1, {});
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const double alpha = 0.25;
  const test::RunResult one = gale(1, student(*dir_, alpha, {"--config-logger-dir", dir.file("cfg")}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> lm = logged_values(one.output, "lm loss"),
                            kd = logged_values(one.output, "logits distillation loss"),
                            total = logged_values(one.output, "total loss");
  ASSERT_EQ(lm.size(), 2u) << one.output;
  ASSERT_EQ(kd.size(), 2u) << one.output;
  ASSERT_EQ(total.size(), 2u) << one.output;
  EXPECT_LT(one.output.find("| lm loss"), one.output.find("| logits distillation loss"));
  EXPECT_LT(one.output.find("| logits distillation loss"), one.output.find("| total loss"));
  // Iteration 1 starts from the plain run's weights: its lm loss; kd from the library's loss on the
  // student's own dumped logits and the teacher's saved top-K (every token counts: mock data).
  EXPECT_EQ(lm[0], logged_values(plain.output, "lm loss")[0]);
  const std::vector<std::vector<TopKLogProbs>> shards = read_shards(dir_->file("logits"));
  ASSERT_EQ(shards.size(), 2u);
  double kd_sum = 0.0;
  for (int64_t m = 0; m < kMicroBatches; ++m) {
    const std::vector<float> logits = dumped_logits(dir.file("cfg"), m);
    ASSERT_EQ(logits.size(), static_cast<size_t>(kS * kV));
    const TopKLogProbs& t = shards[0][m];
    std::vector<double> kl(kS);
    topk_kl_forward_backward(logits.data(), kS, kV, 0, TeacherTopK{t.logprobs.data(), t.indices.data(), t.K}, nullptr,
                             kl.data(), nullptr);
    for (double v : kl) kd_sum += v;
  }
  const double kd_golden = kd_sum / static_cast<double>(kMicroBatches * kS);
  EXPECT_GT(kd_golden, 0.1);  // teacher and student are far apart
  EXPECT_NEAR(kd[0], kd_golden, 1e-5 * kd_golden);
  EXPECT_NEAR(total[0], alpha * kd_golden + (1.0 - alpha) * lm[0], 1e-5 * total[0]);
  EXPECT_NE(logged_values(one.output, "grad norm")[1], logged_values(plain.output, "grad norm")[1]);

  // α = 0: the KD loss is computed and logged but trains nothing: the plain run bit for bit.
  const test::RunResult zero = gale(1, student(*dir_, 0.0, {}));
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  ASSERT_EQ(logged_values(zero.output, "logits distillation loss").size(), 2u) << zero.output;
  for (const char* key : {"lm loss", "grad norm"})
    EXPECT_EQ(logged_values(zero.output, key), logged_values(plain.output, key)) << key;

  // Data parallelism 2 (each rank reads its saved micro-batches, Megatron's DP remapping) and
  // tensor parallelism 2 (the KL over vocabulary slices) reproduce one process.
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{}, std::vector<std::string>{"--tensor-model-parallel-size", "2"}}) {
    const test::RunResult two = gale(2, student(*dir_, alpha, layout));
    ASSERT_EQ(two.exit_code, 0) << two.output;
    for (const char* key : {"lm loss", "logits distillation loss", "total loss"}) {
      const std::vector<double> a = logged_values(one.output, key), b = logged_values(two.output, key);
      ASSERT_EQ(a.size(), b.size()) << key << "\n" << two.output;
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << key << " iteration " << i + 1 << (layout.empty() ? " DP 2" : " TP 2");
    }
  }
}

TEST_F(LogitsKdCli, MissingIterationIsAnErrorOrWithIgnoreErrorsTheLmLoss) {
  ASSERT_EQ(teacher_->exit_code, 0) << teacher_->output;
  TempDir dir;
  fs::create_directories(dir.file("logits"));
  fs::copy_file(dir_->file("logits/cp0_dp0__1.tar"), dir.file("logits/cp0_dp0__1.tar"));  // iteration 0 missing
  const test::RunResult fails = gale(1, student(dir, 0.5, {}));
  EXPECT_NE(fails.exit_code, 0) << fails.output;
  EXPECT_NE(fails.output.find("--logits-load-dir: no teacher logits for iteration 0 in " + dir.file("logits")),
            std::string::npos)
      << fails.output;
  const test::RunResult ignored = gale(1, student(dir, 0.5, {"--logits-load-ignore-errors"}));
  ASSERT_EQ(ignored.exit_code, 0) << ignored.output;
  EXPECT_NE(ignored.output.find("KD loss failed, falling back to the LM loss (--logits-load-ignore-errors)"),
            std::string::npos)
      << ignored.output;
  // Iteration 1 is the LM loss alone (no KD entries; the plain run's lm loss), iteration 2 distils.
  const test::RunResult plain = gale(1, {});
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(logged_values(ignored.output, "lm loss")[0], logged_values(plain.output, "lm loss")[0]);
  EXPECT_EQ(logged_values(ignored.output, "grad norm")[0], logged_values(plain.output, "grad norm")[0]);
  EXPECT_EQ(logged_values(ignored.output, "logits distillation loss").size(), 1u) << ignored.output;
}

}  // namespace
}  // namespace gale
