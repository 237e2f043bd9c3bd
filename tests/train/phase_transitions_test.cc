// --phase-transition-iterations (train/phase_transitions.h): Megatron's sorted parse, its phase
// boundaries in samples and the phase's data offset, the resume-iteration hint, the flag's checks,
// and the phase's training dataset: on a run resumed in phase 2 it is, sample for sample, the
// dataset of a fresh run on the same data with --train-samples = the phase's length.
#include "train/phase_transitions.h"

#include <gtest/gtest.h>

#include <random>

#include "ckpt/checkpoint_layout.h"
#include "data/data_test_util.h"
#include "train/data_setup.h"
#include "train/pretrain_cli.h"

namespace gale {
namespace {

using testing::expect_one_line_error;
using testing::PretrainCli;

TEST(PhaseTransitions, ParsesAndSortsLikeMegatron) {
  EXPECT_EQ(parse_phase_transition_iterations("100, 200,50").value(), (std::vector<int64_t>{50, 100, 200}));
  EXPECT_EQ(parse_phase_transition_iterations("7").value(), (std::vector<int64_t>{7}));
  for (const char* bad : {"1,x", "1,,2", "1.5", "", " , 3"}) {
    StatusOr<std::vector<int64_t>> r = parse_phase_transition_iterations(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--phase-transition-iterations: expected comma-separated integers"),
              std::string::npos)
        << r.status().message();
  }
}

// Megatron's get_train_valid_test_num_samples and consumed_train_samples_in_current_phase for
// transitions {2, 4}, G = 4, --train-samples 24: boundaries 0, 8, 16, 24.
TEST(PhaseTransitions, PhaseBoundariesAndOffsetAreMegatrons) {
  const std::vector<int64_t> t = {2, 4};
  struct Case {
    int64_t iteration, first_iteration, first_sample, end_sample;
  };
  for (const Case& c : {Case{0, 0, 0, 8}, Case{1, 0, 0, 8}, Case{2, 2, 8, 16}, Case{3, 2, 8, 16}, Case{4, 4, 16, 24},
                        Case{5, 4, 16, 24}, Case{6, 4, 24, 24}}) {
    const PhaseSpan p = phase_at(t, c.iteration, 4, 24);
    EXPECT_EQ(p.first_iteration, c.first_iteration) << c.iteration;
    EXPECT_EQ(p.first_sample, c.first_sample) << c.iteration;
    EXPECT_EQ(p.end_sample, c.end_sample) << c.iteration;
  }
  EXPECT_EQ(phase_at(t, 3, 4, 24).samples(), 8);
  // A run resumed at iteration 3 (12 consumed) reads the phase's sample 4: offset 8.
  EXPECT_EQ(phase_sample_offset(t, 3, 12, 4), 8);
  EXPECT_EQ(phase_sample_offset(t, 2, 8, 4), 8);
  EXPECT_EQ(phase_sample_offset(t, 1, 4, 4), 0);
  EXPECT_EQ(phase_sample_offset({}, 5, 20, 4), 0);
  EXPECT_TRUE(is_phase_transition(t, 2));
  EXPECT_TRUE(is_phase_transition(t, 4));
  EXPECT_FALSE(is_phase_transition(t, 3));
  EXPECT_FALSE(is_phase_transition({}, 2));
}

TEST(PhaseTransitions, ResumeIterationHint) {
  testing::TempDir dir;
  Arguments a;
  EXPECT_EQ(phase_resume_iteration_hint(a).value(), 0);  // no --load
  a.checkpoint.load = dir.path();
  EXPECT_EQ(phase_resume_iteration_hint(a).value(), 0);  // no tracker yet
  ASSERT_TRUE(write_tracker(dir.path(), 6).ok());
  EXPECT_EQ(phase_resume_iteration_hint(a).value(), 6);
  a.checkpoint.ckpt_step = 4;
  EXPECT_EQ(phase_resume_iteration_hint(a).value(), 4);
  a.checkpoint.finetune = true;
  EXPECT_EQ(phase_resume_iteration_hint(a).value(), 0);
  a.checkpoint.override_ckpt_iteration = 3;
  EXPECT_EQ(phase_resume_iteration_hint(a).value(), 3);
}

std::vector<std::string> sample_based(std::vector<std::string> extra) {
  std::vector<std::string> argv = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                   "--seq-length", "16", "--max-position-embeddings", "32", "--micro-batch-size",
                                   "2", "--global-batch-size", "4", "--train-samples", "24", "--lr", "1e-3",
                                   "--mock-data"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(PhaseTransitions, FlagIsReadAndSorted) {
  PretrainCli cli;
  ASSERT_TRUE(cli.parse(sample_based({"--phase-transition-iterations", "4,2"})).ok());
  EXPECT_EQ(cli.args.data.phase_transitions, (std::vector<int64_t>{2, 4}));
  PretrainCli off;
  ASSERT_TRUE(off.parse(sample_based({})).ok());
  EXPECT_TRUE(off.args.data.phase_transitions.empty());
}

TEST(PhaseTransitions, MegatronsChecks) {
  expect_one_line_error({{"--phase-transition-iterations", "2,4"}, 1,
                         "--phase-transition-iterations needs sample-based training (--train-samples), not "
                         "--train-iters"});
  expect_one_line_error({{"--phase-transition-iterations", "2;4"}, 1,
                         "--phase-transition-iterations: expected comma-separated integers (iterations), found '2;4'"});
  PretrainCli rampup;
  const Status s = rampup.parse(sample_based({"--phase-transition-iterations", "2", "--rampup-batch-size", "2", "2",
                                              "8"}));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--phase-transition-iterations with --rampup-batch-size: multi-phase training does not "
                             "support batch size ramp-up"),
            std::string::npos)
      << s.message();
}

// The phase's training dataset: resumed at iteration 3 with transitions {2, 4} (phase [8, 16) of
// 24 samples) it is the dataset of a fresh run with --train-samples 8 on the same corpus, and on a
// corpus this small (the sample count sets the epochs, hence the shuffles) not the whole run's.
// Validation keeps the whole run's size.
TEST(PhaseTransitions, PhaseDatasetIsAFreshRunsDataset) {
  testing::TempDir dir;
  const std::string prefix = dir.file("corpus_b");
  {  // 30 documents of 2-9 ids and an EOD: a few samples per epoch, so the sample count sets the epochs
    std::mt19937 rng(3);
    std::vector<std::vector<int32_t>> docs(30);
    for (auto& d : docs) {
      d.resize(2 + rng() % 8);
      for (int32_t& t : d) t = static_cast<int32_t>(rng() % 99);
      d.push_back(99);
    }
    testing::write_dataset(prefix, docs);
  }
  auto parse = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                     "--seq-length", "16", "--max-position-embeddings", "32", "--micro-batch-size",
                                     "2", "--global-batch-size", "4", "--lr", "1e-3", "--data-path", prefix,
                                     "--split", "90,10,0", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
                                     "--eval-interval", "2", "--eval-iters", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto cli = std::make_unique<PretrainCli>();
    Status s = cli->parse(argv);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return cli;
  };
  auto phased = parse({"--train-samples", "24", "--phase-transition-iterations", "2,4"});
  phased->args.data.phase_resume_iteration = 3;
  auto fresh = parse({"--train-samples", "8"});
  auto whole = parse({"--train-samples", "24"});
  EXPECT_EQ(pretrain_sample_counts(phased->args).train, 8);
  EXPECT_EQ(pretrain_sample_counts(phased->args).valid, pretrain_sample_counts(whole->args).valid);
  StatusOr<PretrainData> p = build_pretrain_data(phased->args, [](const std::string&) {});
  StatusOr<PretrainData> f = build_pretrain_data(fresh->args, [](const std::string&) {});
  StatusOr<PretrainData> w = build_pretrain_data(whole->args, [](const std::string&) {});
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_EQ(p->train->size(), f->train->size());
  for (int64_t k = 0; k < p->train->size(); ++k) {
    TrainingSample a, b;
    ASSERT_TRUE(p->train->get(k, &a).ok());
    ASSERT_TRUE(f->train->get(k, &b).ok());
    EXPECT_EQ(a.tokens, b.tokens) << k;
    EXPECT_EQ(a.labels, b.labels) << k;
  }
  TrainingSample first_phase, first_whole;
  ASSERT_TRUE(p->train->get(0, &first_phase).ok());
  ASSERT_TRUE(w->train->get(0, &first_whole).ok());
  EXPECT_NE(first_phase.tokens, first_whole.tokens);  // the sizes differ, so do the shuffles
}

}  // namespace
}  // namespace gale
