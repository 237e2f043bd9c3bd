// `gale pretrain --logits-save-dir` / `--logits-load-dir` across layouts (train/logits_kd_hooks.h):
// a teacher at PP 2 (with and without virtual stages) and with MTP writes the one-process teacher's
// shard byte for byte (only the last stage's TP rank 0 writes); at CP 2 each CP rank writes its
// load-balanced chunk (chunks r and 2·CP−1−r), which merged give the one-process top-K; students at
// PP 2, CP 2 (reading the one-process shards cut into Megatron's cp{C} chunks), PP 2 × TP 2 and with
// MTP at PP 2 reproduce the one-process distillation run's losses and gradient norms; a student
// at another CP size than its teacher's reads the shards resharded.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "cli/log_line.h"
#include "cli/logits_kd_cli_util.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"
#include "train/cached_logits.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing::logged_values;
using testing::TempDir;

constexpr int64_t kS = 32, kMicroBatches = 4, kTopK = 8;

// A tiny 4-layer model, 4 samples per iteration in micro-batches of 1, 2 iterations (tests/cli/logits_kd_cli_util.h).
std::vector<std::string> model(std::vector<std::string> extra) { return testing::kd_tiny_model(4, extra); }

test::RunResult gale(int np, std::vector<std::string> flags) { return testing::run_kd_tiny_model(np, 4, flags); }

std::vector<std::string> teacher_flags(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> f = {"--init-method-std", "0.2", "--freeze-all-layers", "--logits-save-dir", dir,
                                "--logits-save-top-k", std::to_string(kTopK), "--logits-save-dtype", "fp32"};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

std::string hash() {
  LogitsDatasetIdentity id;
  id.seq_length = kS;
  id.train_samples = 2 * kMicroBatches;
  return cached_logits_dataset_hash(id);
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::is_directory(dir)) return names;  // nothing written
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Both iterations' micro-batches of CP rank `cp` in `dir`.
std::vector<std::vector<TopKLogProbs>> read_shards(const std::string& dir, int cp = 0) {
  StatusOr<CachedLogitsReader> reader = CachedLogitsReader::open(dir, cp, 0, 1, hash());
  EXPECT_TRUE(reader.ok()) << reader.status().message();
  std::vector<std::vector<TopKLogProbs>> out;
  for (int64_t it = 0; reader.ok() && it < 2; ++it) {
    StatusOr<std::vector<TopKLogProbs>> mbs = reader.value().iteration(it);
    EXPECT_TRUE(mbs.ok()) << mbs.status().message();
    out.push_back(mbs.ok() ? mbs.value() : std::vector<TopKLogProbs>{});
  }
  return out;
}

// Megatron's load-balanced split at CP size 2 (written out here): the sequence is 4 chunks of 8
// positions; CP rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2, in that order.
int64_t global_position(int cp_rank, int64_t s) {
  const int64_t C = kS / 4, chunk = s < C ? cp_rank : 3 - cp_rank;
  return chunk * C + s % C;
}

class LogitsKdParallelCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    teacher_ = new test::RunResult(gale(1, teacher_flags(dir_->file("logits"), {})));
  }
  static void TearDownTestSuite() {
    delete teacher_;
    delete dir_;
  }
  static TempDir* dir_;
  static test::RunResult* teacher_;
};
TempDir* LogitsKdParallelCli::dir_ = nullptr;
test::RunResult* LogitsKdParallelCli::teacher_ = nullptr;

TEST_F(LogitsKdParallelCli, TeacherAtPipeline2AndWithMtpWritesTheSameShard) {
  ASSERT_EQ(teacher_->exit_code, 0) << teacher_->output;
  ASSERT_EQ(names_in(dir_->file("logits")), std::vector<std::string>{"cp0_dp0__1.tar"});
  const std::string one = testing::read_file(dir_->file("logits/cp0_dp0__1.tar"));
  ASSERT_GT(one.size(), 1024u);
  ASSERT_EQ(read_shards(dir_->file("logits")).size(), 2u);
  struct Layout {
    int np;
    std::vector<std::string> flags;
    const char* what;
  };
  for (const Layout& l : std::vector<Layout>{
           {2, {"--pipeline-model-parallel-size", "2"}, "PP 2"},
           {2, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}, "PP 2 virtual"},
           {1, {"--mtp-num-layers", "1"}, "MTP"},
           {2, {"--mtp-num-layers", "1", "--pipeline-model-parallel-size", "2"}, "MTP PP 2"},
           {2, {"--pipeline-model-parallel-size", "2", "--schedules-method", "dualpipev"}, "DualPipeV"},
       }) {
    SCOPED_TRACE(l.what);
    TempDir dir;
    const test::RunResult r = gale(l.np, teacher_flags(dir.file("logits"), l.flags));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // One shard, from the last stage's TP rank 0 (Megatron's naming: CP and DP ranks only).
    ASSERT_EQ(names_in(dir.file("logits")), std::vector<std::string>{"cp0_dp0__1.tar"}) << r.output;
    EXPECT_TRUE(testing::read_file(dir.file("logits/cp0_dp0__1.tar")) == one);
  }
}

// Without --freeze-all-layers the saver still zeroes the loss, the MTP losses included (Megatron
// overrides compute_language_model_loss, which its MTP layers call too): nothing is differentiated,
// the weights keep their values and the same shard is written.
TEST_F(LogitsKdParallelCli, TrainingTeacherWithMtpZeroesTheMtpLossToo) {
  ASSERT_EQ(teacher_->exit_code, 0) << teacher_->output;
  TempDir dir;
  std::vector<std::string> flags = teacher_flags(dir.file("logits"), {"--mtp-num-layers", "1", "--weight-decay", "0"});
  flags.erase(std::find(flags.begin(), flags.end(), "--freeze-all-layers"));
  const test::RunResult r = gale(1, flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* key : {"lm loss", "mtp_1 loss"}) {
    const std::vector<double> v = logged_values(r.output, key);
    ASSERT_EQ(v.size(), 2u) << key << "\n" << r.output;
    for (double x : v) EXPECT_EQ(x, 0.0) << key;
  }
  EXPECT_TRUE(testing::read_file(dir.file("logits/cp0_dp0__1.tar")) ==
              testing::read_file(dir_->file("logits/cp0_dp0__1.tar")));
}

TEST_F(LogitsKdParallelCli, TeacherAtContextParallel2WritesEachRanksChunk) {
  ASSERT_EQ(teacher_->exit_code, 0) << teacher_->output;
  TempDir dir;
  const test::RunResult r = gale(2, teacher_flags(dir.file("logits"), {"--context-parallel-size", "2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(names_in(dir.file("logits")), (std::vector<std::string>{"cp0_dp0__1.tar", "cp1_dp0__1.tar"}));
  const auto one = read_shards(dir_->file("logits"));
  const auto cp0 = read_shards(dir.file("logits"), 0), cp1 = read_shards(dir.file("logits"), 1);
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(cp0.size(), 2u);
  ASSERT_EQ(cp1.size(), 2u);
  int64_t compared = 0;
  for (int64_t it = 0; it < 2; ++it) {
    ASSERT_EQ(cp0[it].size(), static_cast<size_t>(kMicroBatches));
    ASSERT_EQ(cp1[it].size(), static_cast<size_t>(kMicroBatches));
    for (int64_t m = 0; m < kMicroBatches; ++m) {
      const TopKLogProbs& whole = one[it][m];
      for (int cp = 0; cp < 2; ++cp) {
        const TopKLogProbs& part = (cp == 0 ? cp0 : cp1)[it][m];
        ASSERT_EQ(part.S, kS / 2);
        ASSERT_EQ(part.B, 1);
        ASSERT_EQ(part.K, kTopK);
        for (int64_t s = 0; s < part.S; ++s) {
          const int64_t g = global_position(cp, s);
          for (int64_t k = 0; k < kTopK; ++k) {
            EXPECT_NEAR(part.logprobs[s * kTopK + k], whole.logprobs[g * kTopK + k], 1e-4)
                << "iteration " << it << " micro-batch " << m << " cp " << cp << " position " << s;
            const bool tied = k + 1 < kTopK && whole.logprobs[g * kTopK + k] - whole.logprobs[g * kTopK + k + 1] < 1e-3;
            const bool tied_before = k > 0 && whole.logprobs[g * kTopK + k - 1] - whole.logprobs[g * kTopK + k] < 1e-3;
            if (!tied && !tied_before) {
              EXPECT_EQ(part.indices[s * kTopK + k], whole.indices[g * kTopK + k]);
              ++compared;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 2 * kMicroBatches * kS * kTopK / 2);
}

std::vector<std::string> student(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> f = {"--logits-load-dir", dir, "--logits-load-kd-loss-alpha", "0.25"};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

// The one-process teacher's shard cut into Megatron's CP 2 shards (each rank's positions, in order).
void split_for_cp2(const std::string& from, const std::string& to) {
  StatusOr<CachedLogitsTar> tar = read_cached_logits_tar(from + "/cp0_dp0__1.tar", hash());
  ASSERT_TRUE(tar.ok()) << tar.status().message();
  fs::create_directories(to);
  for (int cp = 0; cp < 2; ++cp) {
    CachedLogitsTar out;
    out.meta = tar.value().meta;
    for (const auto& [it, member] : tar.value().iterations) {
      StatusOr<std::vector<TopKLogProbs>> mbs = decode_cached_logits_iteration(member, "member");
      ASSERT_TRUE(mbs.ok());
      std::vector<TopKLogProbs> parts;
      for (const TopKLogProbs& whole : mbs.value()) {
        TopKLogProbs p;
        p.S = whole.S / 2;
        p.B = whole.B;
        p.K = whole.K;
        for (int64_t s = 0; s < p.S; ++s) {
          const int64_t g = global_position(cp, s);
          p.logprobs.insert(p.logprobs.end(), whole.logprobs.begin() + g * p.K, whole.logprobs.begin() + (g + 1) * p.K);
          p.indices.insert(p.indices.end(), whole.indices.begin() + g * p.K, whole.indices.begin() + (g + 1) * p.K);
        }
        parts.push_back(std::move(p));
      }
      StatusOr<std::string> enc = encode_cached_logits_iteration(parts, LogitsSaveDtype::kF32);
      ASSERT_TRUE(enc.ok());
      out.iterations.emplace_back(it, enc.value());
    }
    ASSERT_TRUE(write_cached_logits_tar(to + "/" + cached_logits_tar_name(cp, 0, 1), out).ok());
  }
}

void expect_same_losses(const test::RunResult& one, const test::RunResult& other, const char* what, double tol) {
  for (const char* key : {"lm loss", "logits distillation loss", "total loss", "grad norm"}) {
    const std::vector<double> a = logged_values(one.output, key), b = logged_values(other.output, key);
    ASSERT_EQ(a.size(), 2u) << key << "\n" << one.output;
    ASSERT_EQ(b.size(), 2u) << what << " " << key << "\n" << other.output;
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(b[i], a[i], tol * std::abs(a[i])) << what << " " << key << " iteration " << i + 1;
  }
}

TEST_F(LogitsKdParallelCli, StudentsAtPipelineContextAndTensorParallelismMatchOneProcess) {
  ASSERT_EQ(teacher_->exit_code, 0) << teacher_->output;
  const std::string logits = dir_->file("logits");
  const test::RunResult one = gale(1, student(logits, {}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_GT(logged_values(one.output, "logits distillation loss")[0], 0.1) << one.output;
  TempDir cp_dir;
  ASSERT_NO_FATAL_FAILURE(split_for_cp2(logits, cp_dir.file("logits")));
  struct Layout {
    int np;
    std::string dir;
    std::vector<std::string> flags;
    const char* what;
  };
  for (const Layout& l : std::vector<Layout>{
           {2, logits, {"--pipeline-model-parallel-size", "2"}, "PP 2"},
           {2, logits, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"},
            "PP 2 virtual"},
           {2, cp_dir.file("logits"), {"--context-parallel-size", "2"}, "CP 2"},
           {4, logits, {"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2"}, "PP 2 x TP 2"},
           {2, logits, {"--pipeline-model-parallel-size", "2", "--schedules-method", "dualpipev"}, "DualPipeV"},
       }) {
    const test::RunResult r = gale(l.np, student(l.dir, l.flags));
    ASSERT_EQ(r.exit_code, 0) << l.what << "\n" << r.output;
    expect_same_losses(one, r, l.what, 1e-5);
  }
  // With MTP: its loss beside the KD mix, alike at PP 2 (the MTP layer on the last stage).
  const test::RunResult mtp = gale(1, student(logits, {"--mtp-num-layers", "1"}));
  ASSERT_EQ(mtp.exit_code, 0) << mtp.output;
  EXPECT_EQ(logged_values(mtp.output, "lm loss")[0], logged_values(one.output, "lm loss")[0]);
  const test::RunResult mtp_pp = gale(2, student(logits, {"--mtp-num-layers", "1", "--pipeline-model-parallel-size", "2"}));
  ASSERT_EQ(mtp_pp.exit_code, 0) << mtp_pp.output;
  expect_same_losses(mtp, mtp_pp, "MTP PP 2", 1e-5);
}

// Beyond Megatron (which needs the teacher's CP layout): a CP 2 student of the one-process teacher
// reads both halves resharded, the same as the CP 2 student of the cut shards; a one-process student
// of the CP 2 teacher merges its cp0/cp1 shards.
TEST_F(LogitsKdParallelCli, StudentsAtAnotherContextParallelSizeReshard) {
  ASSERT_EQ(teacher_->exit_code, 0) << teacher_->output;
  const std::string logits = dir_->file("logits");
  TempDir cp_dir;
  ASSERT_NO_FATAL_FAILURE(split_for_cp2(logits, cp_dir.file("logits")));
  const test::RunResult cut = gale(2, student(cp_dir.file("logits"), {"--context-parallel-size", "2"}));
  ASSERT_EQ(cut.exit_code, 0) << cut.output;
  const test::RunResult resharded = gale(2, student(logits, {"--context-parallel-size", "2"}));
  ASSERT_EQ(resharded.exit_code, 0) << resharded.output;
  EXPECT_NE(resharded.output.find("teacher logits saved at context-parallel size 1, resharded for this run's 2"),
            std::string::npos)
      << resharded.output;
  expect_same_losses(cut, resharded, "CP 2 resharded", 0.0);
  // The CP 2 teacher's shards (its top-K within float rounding of the one-process teacher's).
  TempDir teacher_cp2;
  const test::RunResult t2 = gale(2, teacher_flags(teacher_cp2.file("logits"), {"--context-parallel-size", "2"}));
  ASSERT_EQ(t2.exit_code, 0) << t2.output;
  const test::RunResult one = gale(1, student(logits, {}));
  const test::RunResult merged = gale(1, student(teacher_cp2.file("logits"), {}));
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  expect_same_losses(one, merged, "CP 1 of a CP 2 teacher", 1e-4);
}

}  // namespace
}  // namespace gale
