// gale pretrain --freeze-all-layers (Megatron main): from a checkpoint, every iteration's loss is
// the loaded weights' forward loss on its batch (a run at learning rate 0 gives the same losses)
// and the parameters stay the loaded ones (the params norm of every iteration is theirs), where a
// trained run's losses move; the learning rate is logged as 0 and Megatron's warnings turn off the
// distributed optimizer and the overlapped parameter all-gather. TP 2, PP 2 and DP 2 (under mpirun)
// log one process's losses and params norms. --save writes nothing (Megatron's skip_weight_ckpt) and
// a next launch resumes from --save's tracker or --override-ckpt-iteration.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "data/data_test_util.h"
#include "mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

const std::string kModel =
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 32 "
    "--tokenizer-type NullTokenizer --vocab-size 4096 --micro-batch-size 2 --global-batch-size 4 --mock-data "
    "--eval-iters 0 --num-threads 1 --log-interval 1 --attention-dropout 0 --hidden-dropout 0 --log-params-norm";

TEST(FreezeAllLayersCli, LossesAreTheLoadedWeightsForwardLossesAndNothingChanges) {
  testing::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  testing::CommandResult r = testing::run_gale(
      "pretrain " + kModel + " --lr 1e-2 --train-iters 2 --save-interval 2 --save " + ckpt, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string load = " --train-iters 3 --load " + ckpt;
  testing::CommandResult frozen =
      testing::run_gale("pretrain " + kModel + " --lr 1e-2 --freeze-all-layers --use-distributed-optimizer "
                                               "--overlap-grad-reduce --overlap-param-gather" + load,
                        dir.path());
  ASSERT_EQ(frozen.exit_code, 0) << frozen.err;
  EXPECT_NE(frozen.err.find("WARNING: --freeze-all-layers incompatible with use_distributed_optimizer. Disabling "
                            "use_distributed_optimizer."),
            std::string::npos)
      << frozen.err;
  EXPECT_NE(frozen.err.find("WARNING: --freeze-all-layers incompatible with overlap_param_gather. Disabling "
                            "overlap_param_gather."),
            std::string::npos)
      << frozen.err;
  testing::CommandResult still =
      testing::run_gale("pretrain " + kModel + " --lr 0 --min-lr 0 --finetune" + load, dir.path());
  ASSERT_EQ(still.exit_code, 0) << still.err;
  testing::CommandResult trained = testing::run_gale("pretrain " + kModel + " --lr 1e-2 --finetune" + load, dir.path());
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const std::vector<double> lf = testing::logged_values(frozen.out, "lm loss");
  const std::vector<double> ls = testing::logged_values(still.out, "lm loss");
  const std::vector<double> lt = testing::logged_values(trained.out, "lm loss");
  ASSERT_EQ(lf.size(), 3u) << frozen.out;
  ASSERT_EQ(ls.size(), 3u) << still.out;
  ASSERT_EQ(lt.size(), 3u) << trained.out;
  EXPECT_EQ(lf, ls);        // every batch's forward loss with the loaded weights
  EXPECT_EQ(lt[0], lf[0]);  // the same first batch and weights
  EXPECT_NE(lt[2], lf[2]);  // a run that trains moves
  const std::vector<double> pf = testing::logged_values(frozen.out, "params norm");
  const std::vector<double> ps = testing::logged_values(still.out, "params norm");
  const std::vector<double> pt = testing::logged_values(trained.out, "params norm");
  ASSERT_EQ(pf.size(), 3u) << frozen.out;
  ASSERT_EQ(ps.size(), 3u);
  ASSERT_EQ(pt.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(pf[i], ps[0]) << "iteration " << i + 1;
  EXPECT_NE(pt[2], ps[0]);
  EXPECT_EQ(testing::logged_values(frozen.out, "learning rate"), (std::vector<double>{0.0, 0.0, 0.0}));
  const std::vector<double> iterations = testing::regex_values(frozen.out, "iteration +([0-9]+)/ +3 \\|");
  EXPECT_EQ(iterations, (std::vector<double>{1, 2, 3}));  // weights only: iteration 0, as --finetune
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

TEST(FreezeAllLayersCli, ParallelLayoutsLogOneProcesssLossesAndParamsNorms) {
  testing::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  testing::CommandResult r = testing::run_gale(
      "pretrain " + kModel + " --lr 1e-2 --train-iters 2 --save-interval 2 --save " + ckpt, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string frozen = kModel + " --lr 1e-2 --freeze-all-layers --train-iters 3 --load " + ckpt;
  testing::CommandResult one = testing::run_gale("pretrain " + frozen, dir.path());
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::vector<double> losses = testing::logged_values(one.out, "lm loss");
  const std::vector<double> norms = testing::logged_values(one.out, "params norm");
  ASSERT_EQ(losses.size(), 3u) << one.out;
  // TP 2 pads the vocabulary to a multiple of 64 x 2, as the checkpoint's 128 x 1.
  for (const std::string layout : {"--tensor-model-parallel-size 2 --make-vocab-size-divisible-by 64",
                                   "--pipeline-model-parallel-size 2", ""}) {
    SCOPED_TRACE(layout);
    const test::RunResult two =
        test::run_with_timeout(testing::launch_argv(2, {GALE_BINARY, "pretrain"}, words(frozen + " " + layout)),
                               testing::kMpiEnv, 300);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_EQ(testing::logged_values(two.output, "lm loss"), losses) << two.output;
    EXPECT_EQ(testing::logged_values(two.output, "params norm"), norms);
  }
}

// Megatron main's --save of a frozen run: the "saving checkpoint" line, then no weights and no tracker
// (skip_weight_ckpt), so the run's losses are those of a run without --save; its next launch starts at the
// iteration of --save's tracker (read_frozen_resume_iteration), or at --override-ckpt-iteration, and replays
// the samples from there: the losses of the same iterations of the run from iteration 0.
TEST(FreezeAllLayersCli, SaveWritesNothingAndANextLaunchResumesFromTheSaveTracker) {
  testing::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  testing::CommandResult r = testing::run_gale(
      "pretrain " + kModel + " --lr 1e-2 --train-iters 2 --save-interval 2 --save " + ckpt, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string frozen = "pretrain " + kModel + " --lr 1e-2 --freeze-all-layers --train-iters 3 --load " + ckpt;
  testing::CommandResult plain = testing::run_gale(frozen, dir.path());
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::vector<double> losses = testing::logged_values(plain.out, "lm loss");
  ASSERT_EQ(losses.size(), 3u) << plain.out;

  const std::string out = dir.file("out");
  testing::CommandResult saved = testing::run_gale(frozen + " --save-interval 1 --save " + out, dir.path());
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  EXPECT_EQ(testing::logged_values(saved.out, "lm loss"), losses);
  const std::string both = saved.out + saved.err;
  EXPECT_NE(both.find("saving checkpoint at iteration       1 to " + out), std::string::npos) << both;
  EXPECT_NE(both.find("  --freeze-all-layers: nothing was trained, so no checkpoint is written (the weights are the "
                      "loaded ones)"),
            std::string::npos)
      << both;
  EXPECT_EQ(both.find("successfully saved checkpoint"), std::string::npos) << both;
  EXPECT_FALSE(std::filesystem::exists(out + "/latest_checkpointed_iteration.txt"));
  EXPECT_FALSE(std::filesystem::exists(out + "/iter_0000001"));

  // --save's tracker says 2 (the trained run's): the frozen run starts at iteration 3.
  testing::CommandResult resumed = testing::run_gale(frozen + " --save-interval 5 --save " + ckpt, dir.path());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(testing::regex_values(resumed.out, "iteration +([0-9]+)/ +3 \\|"), (std::vector<double>{3}));
  EXPECT_EQ(testing::logged_values(resumed.out, "lm loss"), (std::vector<double>{losses[2]}));
  EXPECT_NE((resumed.out + resumed.err).find("--override-ckpt-iteration: start at iteration 2"), std::string::npos)
      << resumed.out << resumed.err;

  // An explicit --override-ckpt-iteration wins.
  testing::CommandResult overridden =
      testing::run_gale(frozen + " --save-interval 5 --save " + ckpt + " --override-ckpt-iteration 1", dir.path());
  ASSERT_EQ(overridden.exit_code, 0) << overridden.err;
  EXPECT_EQ(testing::regex_values(overridden.out, "iteration +([0-9]+)/ +3 \\|"), (std::vector<double>{2, 3}));
  EXPECT_EQ(testing::logged_values(overridden.out, "lm loss"), (std::vector<double>{losses[1], losses[2]}));
}

}  // namespace
}  // namespace gale
