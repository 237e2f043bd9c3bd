// `gale pretrain --qad-enable` end to end: a teacher checkpoint equal to the student gives kl loss
// 0 and zero gradients at the first iteration with the plain run's lm loss (also under --bf16); a QAT student started
// from the teacher's initial weights distils from it (kl loss falling, logged and in TensorBoard); data parallelism 2
// under mpirun reproduces one process; the student's checkpoint holds exactly what a plain run's
// does (no teacher) and the teacher's checkpoint is unchanged; a mismatched or missing teacher
// checkpoint is a one-line error naming it.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::logged_values;
using testing::TempDir;

// A tiny LLaMA-like model (input dimensions multiples of 32 for --qat-scheme), no dropout (exact
// comparisons), 4 samples per iteration in micro-batches of 1; 4095 tokens + EOD pad to 4096 at TP 1
// and 2 alike, so that one teacher checkpoint serves both.
std::vector<std::string> model(std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128",
      "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "4",
      "--lr", "3e-3", "--mock-data", "--vocab-size", "4095", "--log-interval", "1", "--eval-iters", "0",
      "--num-threads", "1", "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
      "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--attention-dropout", "0",
      "--hidden-dropout", "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

test::RunResult gale(int np, std::vector<std::string> flags) {
  return test::run_with_timeout(testing::launch_argv(np, {GALE_BINARY}, model(std::move(flags))),
                                np > 1 ? testing::kMpiEnv : std::vector<std::string>{}, 300);
}

// The files of a checkpoint directory (relative path -> bytes).
std::map<std::string, std::string> files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file())
      out[std::filesystem::relative(e.path(), dir).string()] = testing::read_file(e.path().string());
  return out;
}

// The teacher: 3 plain iterations saved to dir/teacher.
void save_teacher(const TempDir& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {"--train-iters", "3", "--save", dir.file("teacher"), "--save-interval", "3"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  test::RunResult r = gale(1, flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

std::vector<std::string> finetune(const TempDir& dir, int iters, std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--train-iters", std::to_string(iters), "--load", dir.file("teacher"),
                                    "--finetune"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

TEST(GalePretrainQad, TeacherEqualToStudentStartsAtZeroKl) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(save_teacher(dir));
  test::RunResult plain = gale(1, finetune(dir, 2, {}));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  test::RunResult q = gale(1, finetune(dir, 2, {"--qad-enable", "--qad-teacher-load", dir.file("teacher")}));
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_NE(q.output.find("loaded the QAD teacher model from " + dir.file("teacher")), std::string::npos) << q.output;
  const std::vector<double> kl = logged_values(q.output, "kl loss");
  ASSERT_EQ(kl.size(), 2u) << q.output;
  EXPECT_EQ(kl[0], 0.0) << q.output;                   // the same weights, no quantisation: KL 0 ...
  EXPECT_EQ(logged_values(q.output, "grad norm")[0], 0.0) << q.output;  // ... and no gradient (KL-only)
  // The logged lm loss is the student's cross-entropy: the plain run's at the first iteration.
  EXPECT_EQ(logged_values(q.output, "lm loss")[0], logged_values(plain.output, "lm loss")[0]);
  EXPECT_LT(q.output.find("lm loss"), q.output.find("kl loss"));
  EXPECT_EQ(plain.output.find("kl loss"), std::string::npos);
  // --bf16: the teacher gets its bf16 GEMM copy too, so the same weights still give KL 0.
  test::RunResult bf16 =
      gale(1, finetune(dir, 1, {"--bf16", "--qad-enable", "--qad-teacher-load", dir.file("teacher")}));
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  ASSERT_EQ(logged_values(bf16.output, "kl loss").size(), 1u) << bf16.output;
  EXPECT_EQ(logged_values(bf16.output, "kl loss")[0], 0.0) << bf16.output;
}

TEST(GalePretrainQad, QatStudentDistilsAndParallelLayoutsMatchOneProcess) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(save_teacher(dir));
  const std::map<std::string, std::string> teacher_before = files(dir.file("teacher"));
  const std::vector<std::string> qad = {"--qad-enable", "--qad-teacher-load", dir.file("teacher"), "--qat-scheme",
                                        "w4a16-mxfp4", "--kl-temperature", "2", "--lr", "1e-3"};
  // The student starts from the initial weights the teacher was trained from (no --load): far
  // enough from the teacher for distillation to show over six iterations of different batches.
  std::vector<std::string> one_flags = {"--train-iters", "6"};
  one_flags.insert(one_flags.end(), qad.begin(), qad.end());
  for (const std::string& f : {std::string("--save"), dir.file("student"), std::string("--save-interval"),
                               std::string("6"), std::string("--tensorboard-dir"), dir.file("tb")})
    one_flags.push_back(f);
  test::RunResult one = gale(1, one_flags);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("active: qad-enable"), std::string::npos) << one.output;
  const std::vector<double> kl = logged_values(one.output, "kl loss");
  ASSERT_EQ(kl.size(), 6u) << one.output;
  EXPECT_GT(kl.front(), 0.0) << one.output;
  EXPECT_LT(kl.back(), 0.5 * kl.front()) << one.output;  // measured: 6.6e-3 -> 6.8e-4
  std::string events;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("tb"))) events += testing::read_file(e.path().string());
  EXPECT_NE(events.find("kl loss"), std::string::npos);
  // Data parallelism 2 (two micro-batches per rank instead of four on one; also with the distributed
  // optimizer and its overlapped reduce-scatter and parameter all-gather), pipeline parallelism 2
  // (the last stage holds the whole teacher), tensor parallelism 2
  // (the KL over vocabulary slices, all-reduced over TP) with and without sequence parallelism:
  // the same losses, up to the order of f64 sums of f32 values and GEMM splits (1e-5 relative).
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{},
        std::vector<std::string>{"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"},
        std::vector<std::string>{"--pipeline-model-parallel-size", "2"},
        std::vector<std::string>{"--tensor-model-parallel-size", "2"},
        std::vector<std::string>{"--tensor-model-parallel-size", "2", "--sequence-parallel"}}) {
    std::vector<std::string> two_flags = {"--train-iters", "6"};
    two_flags.insert(two_flags.end(), qad.begin(), qad.end());
    two_flags.insert(two_flags.end(), layout.begin(), layout.end());
    test::RunResult two = gale(2, two_flags);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    for (const char* key : {"lm loss", "kl loss"}) {
      const std::vector<double> a = logged_values(one.output, key), b = logged_values(two.output, key);
      ASSERT_EQ(a.size(), b.size()) << key << "\n" << two.output;
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << key << " iteration " << i + 1 << " with DP 2, PP 2 or TP 2:"
                                             << (layout.empty() ? std::string() : " " + layout[0]);
    }
  }
  // The student's checkpoint holds what a plain run's holds (no teacher weights): the same files,
  // the tensor shards of the same sizes (metadata.json records the run's flags, so it differs);
  // the teacher's checkpoint is byte-identical to before.
  test::RunResult plain = gale(1, {"--train-iters", "6", "--qat-scheme", "w4a16-mxfp4", "--save", dir.file("plain"),
                                   "--save-interval", "6"});
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const std::map<std::string, std::string> student = files(dir.file("student")), reference = files(dir.file("plain"));
  ASSERT_EQ(student.size(), reference.size());
  for (const auto& [name, bytes] : reference) {
    ASSERT_TRUE(student.count(name)) << name;
    if (name.size() > 12 && name.substr(name.size() - 12) == ".safetensors")
      EXPECT_EQ(student.at(name).size(), bytes.size()) << name;
  }
  EXPECT_TRUE(files(dir.file("teacher")) == teacher_before);
}

TEST(GalePretrainQad, TeacherCheckpointErrors) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(save_teacher(dir, {"--ffn-hidden-size", "96"}));
  test::RunResult mismatch = gale(1, {"--train-iters", "1", "--qad-enable", "--qad-teacher-load", dir.file("teacher")});
  EXPECT_NE(mismatch.exit_code, 0);
  EXPECT_NE(mismatch.output.find("--qad-teacher-load " + dir.file("teacher")), std::string::npos) << mismatch.output;
  EXPECT_NE(mismatch.output.find("does not match this model: it was saved with ffn_hidden_size = 96, this run has 128"),
            std::string::npos)
      << mismatch.output;
  test::RunResult missing = gale(1, {"--train-iters", "1", "--qad-enable", "--qad-teacher-load", dir.file("none")});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("--qad-teacher-load " + dir.file("none") + ": expected a checkpoint directory"),
            std::string::npos)
      << missing.output;
  test::RunResult no_path = gale(1, {"--train-iters", "1", "--qad-enable"});
  EXPECT_NE(no_path.exit_code, 0);
  EXPECT_NE(no_path.output.find("--qad-enable needs --qad-teacher-load"), std::string::npos) << no_path.output;
  test::RunResult bad = gale(1, {"--train-iters", "1", "--qad-enable", "--qad-teacher-load", dir.file("teacher"),
                                 "--kl-loss-reduction", "batchmean"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--kl-loss-reduction"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace gale
