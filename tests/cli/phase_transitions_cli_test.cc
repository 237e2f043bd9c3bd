// `gale pretrain --phase-transition-iterations` end to end: a three-phase run (corpus A, B, then A
// again) saves and exits at each transition; the second phase, resumed on corpus B, trains exactly
// as a run that loads the same checkpoint and reads a fresh corpus-B dataset of the phase's size
// from its sample 0 (--override-ckpt-iteration 0): same losses and gradient norms, and a final
// checkpoint equal byte for byte; without the flag the resumed run reads other samples. A changed
// global batch size is Megatron's checkpoint-args error. `gale data-samples` prints each phase's
// own samples.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <regex>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::logged_values;

// 8 documents of 20 random ids below 99: 4 samples of 32 tokens per epoch, so a dataset's sample
// count sets its epochs and shuffles.
void write_corpus(const std::string& prefix, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> docs(8);
  for (auto& d : docs) {
    d.resize(20);
    for (int32_t& t : d) t = static_cast<int32_t>(rng() % 99);
  }
  testing::write_dataset(prefix, docs);
}

std::string model(int gbs = 4) {
  return "pretrain --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
         "--max-position-embeddings 32 --tokenizer-type NullTokenizer --vocab-size 128 --micro-batch-size 2 "
         "--global-batch-size " + std::to_string(gbs) +
         " --lr 3e-3 --lr-decay-style constant --eval-iters 0 --num-threads 1 --log-interval 1 --split 100,0,0 "
         "--seed 7 --save-interval 100 ";
}

std::string tracker(const std::string& dir) { return testing::read_file(dir + "/latest_checkpointed_iteration.txt"); }

// The bytes of every file of a checkpoint directory but its metadata (which records the iteration).
std::map<std::string, std::string> tensor_files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") out[e.path().filename().string()] = testing::read_file(e.path());
  return out;
}

TEST(PhaseTransitionsCli, ExitsAtEachTransitionAndEachPhaseReadsItsDataFromItsFirstSample) {
  testing::TempDir dir;
  const std::string a = dir.file("corpus_a"), b = dir.file("corpus_b"), ckpt = dir.file("ckpt");
  write_corpus(a, 1);
  write_corpus(b, 2);
  const std::string phases = " --train-samples 24 --phase-transition-iterations 4,2 --save " + ckpt;

  testing::CommandResult one = testing::run_gale(model() + "--data-path " + a + phases, dir.path());
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  EXPECT_EQ(logged_values(one.out, "lm loss").size(), 2u) << one.out;
  EXPECT_NE(one.out.find("exiting program at iteration 2"), std::string::npos) << one.out;
  EXPECT_EQ(tracker(ckpt), "2");

  testing::CommandResult two = testing::run_gale(model() + "--data-path " + b + phases + " --load " + ckpt, dir.path());
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_NE(two.out.find("this phase starts at iteration 2; its training dataset holds 8 samples, read from sample 0"),
            std::string::npos)
      << two.out;
  EXPECT_NE(two.out.find("exiting program at iteration 4"), std::string::npos) << two.out;
  EXPECT_EQ(tracker(ckpt), "4");
  const std::vector<double> loss = logged_values(two.out, "lm loss"), norm = logged_values(two.out, "grad norm");
  ASSERT_EQ(loss.size(), 2u) << two.out;
  EXPECT_EQ(logged_values(two.out, "consumed samples"), (std::vector<double>{12, 16}));

  // The reference: the phase-1 checkpoint, a fresh corpus-B dataset of 8 samples read from sample 0.
  const std::string ref_dir = dir.file("ref");
  testing::CommandResult ref = testing::run_gale(
      model() + "--data-path " + b + " --train-samples 8 --load " + ckpt +
          " --ckpt-step 2 --override-ckpt-iteration 0 --override-opt_param-scheduler --save " + ref_dir,
      dir.path());
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  EXPECT_EQ(logged_values(ref.out, "lm loss"), loss);
  EXPECT_EQ(logged_values(ref.out, "grad norm"), norm);
  const auto phase_tensors = tensor_files(ckpt + "/iter_0000004"), ref_tensors = tensor_files(ref_dir + "/iter_0000002");
  ASSERT_FALSE(phase_tensors.empty());
  EXPECT_TRUE(phase_tensors == ref_tensors) << "the phase's model and optimizer state differ from the reference's";

  // Without the flag the run resumed on corpus B reads samples 8.. of its whole-run dataset.
  testing::CommandResult plain = testing::run_gale(
      model() + "--data-path " + b + " --train-samples 16 --load " + ckpt +
          " --ckpt-step 2 --override-opt_param-scheduler --save " + dir.file("plain"),
      dir.path());
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  const std::vector<double> plain_loss = logged_values(plain.out, "lm loss");
  ASSERT_EQ(plain_loss.size(), 2u);
  EXPECT_NE(plain_loss[0], loss[0]);

  // The last phase (corpus A again) runs to --train-samples and saves at the end.
  testing::CommandResult three =
      testing::run_gale(model() + "--data-path " + a + phases + " --load " + ckpt, dir.path());
  ASSERT_EQ(three.exit_code, 0) << three.out << three.err;
  EXPECT_EQ(logged_values(three.out, "consumed samples"), (std::vector<double>{20, 24}));
  EXPECT_EQ(three.out.find("exiting program at iteration"), std::string::npos) << three.out;
  EXPECT_EQ(tracker(ckpt), "6");
}

// A transition saved only by a global non-persistent checkpoint (Megatron saves no persistent one
// when a non-persistent save fell on that iteration): the tracker of --load says nothing, so the
// training data is first sized for phase 1 (8 samples), then rebuilt for phase 2 (16) once the
// non-persistent checkpoint at iteration 2 is loaded. The phase trains as a fresh 16-sample
// corpus-B run from the same checkpoint.
TEST(PhaseTransitionsCli, ACheckpointInAnotherPhaseThanExpectedRebuildsTheData) {
  testing::TempDir dir;
  const std::string a = dir.file("corpus_a"), b = dir.file("corpus_b"), ckpt = dir.file("ckpt");
  write_corpus(a, 1);
  write_corpus(b, 2);
  const std::string phases = " --train-samples 24 --phase-transition-iterations 2 --save " + ckpt +
                             " --non-persistent-save-interval 1 --non-persistent-ckpt-type global";
  testing::CommandResult one = testing::run_gale(model() + "--data-path " + a + phases, dir.path());
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  EXPECT_NE(one.out.find("exiting program at iteration 2"), std::string::npos) << one.out;
  ASSERT_FALSE(std::filesystem::exists(ckpt + "/latest_checkpointed_iteration.txt"));
  EXPECT_EQ(tracker(ckpt + "/non_persistent"), "2");
  // (The next run's non-persistent saves remove iteration 2 there: the reference loads a copy.)
  std::filesystem::copy(ckpt + "/non_persistent", dir.file("at2"), std::filesystem::copy_options::recursive);
  testing::CommandResult two = testing::run_gale(model() + "--data-path " + b + phases + " --load " + ckpt, dir.path());
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_NE(two.out.find("this phase starts at iteration 2; its training dataset holds 16 samples, read from sample 0"),
            std::string::npos)
      << two.out;
  const std::vector<double> loss = logged_values(two.out, "lm loss");
  ASSERT_EQ(loss.size(), 4u) << two.out;
  testing::CommandResult ref = testing::run_gale(
      model() + "--data-path " + b + " --train-samples 16 --load " + dir.file("at2") +
          " --override-ckpt-iteration 0 --override-opt_param-scheduler --save " +
          dir.file("ref"),
      dir.path());
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  EXPECT_EQ(logged_values(ref.out, "lm loss"), loss);
  EXPECT_EQ(logged_values(ref.out, "grad norm"), logged_values(two.out, "grad norm"));
}

// The "ids" arrays of `gale data-samples` lines, in order.
std::vector<std::string> sample_ids(const std::string& out) {
  std::vector<std::string> ids;
  const std::regex re(R"("ids": \[([0-9, ]+)\])");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    ids.push_back((*it)[1]);
  return ids;
}

// `gale data-samples` with the flag: the token ids of consumed samples 8.. (the second phase) are
// those of a fresh run's samples 0.. on the same corpus, not the whole run's samples 8..; a range
// across a transition is refused.
TEST(PhaseTransitionsCli, DataSamplesPrintsEachPhasesOwnSamples) {
  testing::TempDir dir;
  const std::string b = dir.file("corpus_b");
  write_corpus(b, 2);
  const std::string flags = "data-samples --seq-length 32 --tokenizer-type NullTokenizer --vocab-size 128 "
                            "--micro-batch-size 2 --global-batch-size 4 --split 100,0,0 --seed 7 --eval-iters 0 "
                            "--data-path " + b;
  testing::CommandResult phased = testing::run_gale(
      flags + " --train-samples 24 --phase-transition-iterations 4,2 --sample-index 8 --sample-count 8", dir.path());
  ASSERT_EQ(phased.exit_code, 0) << phased.err;
  testing::CommandResult fresh =
      testing::run_gale(flags + " --train-samples 8 --sample-index 0 --sample-count 8", dir.path());
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  testing::CommandResult whole =
      testing::run_gale(flags + " --train-samples 24 --sample-index 8 --sample-count 8", dir.path());
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  ASSERT_EQ(sample_ids(phased.out).size(), 8u) << phased.out;
  EXPECT_EQ(sample_ids(phased.out), sample_ids(fresh.out));
  EXPECT_NE(sample_ids(phased.out), sample_ids(whole.out));
  testing::CommandResult across = testing::run_gale(
      flags + " --train-samples 24 --phase-transition-iterations 4,2 --sample-index 6 --sample-count 4", dir.path());
  EXPECT_NE(across.exit_code, 0);
  EXPECT_NE(across.err.find("crosses the phase transition at sample 8"), std::string::npos) << across.err;
}

TEST(PhaseTransitionsCli, GlobalBatchSizeMustStayTheSame) {
  testing::TempDir dir;
  const std::string a = dir.file("corpus_a"), ckpt = dir.file("ckpt");
  write_corpus(a, 1);
  const std::string phases = " --train-samples 48 --phase-transition-iterations 2 --save " + ckpt;
  testing::CommandResult one = testing::run_gale(model() + "--data-path " + a + phases, dir.path());
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  testing::CommandResult two =
      testing::run_gale(model(8) + "--data-path " + a + phases + " --load " + ckpt, dir.path());
  EXPECT_NE(two.exit_code, 0);
  EXPECT_NE((two.out + two.err).find("global_batch_size value from checkpoint (4) is not equal to the input "
                                     "argument value (8)"),
            std::string::npos)
      << two.out << two.err;
}

}  // namespace
}  // namespace gale
