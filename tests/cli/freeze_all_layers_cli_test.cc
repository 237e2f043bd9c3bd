// gale pretrain --freeze-all-layers (Megatron main): from a checkpoint, every iteration's loss is
// the loaded weights' forward loss on its batch (a run at learning rate 0 gives the same losses)
// and the parameters stay the loaded ones (the params norm of every iteration is theirs), where a
// trained run's losses move; the learning rate is logged as 0 and Megatron's warnings turn off the
// distributed optimizer and the overlapped parameter all-gather. TP 2, PP 2 and DP 2 (under mpirun)
// log one process's losses and params norms.
#include <gtest/gtest.h>

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

TEST(FreezeAllLayersCli, RefusedWithSave) {
  testing::TempDir dir;
  testing::CommandResult r = testing::run_gale(
      "pretrain " + kModel + " --lr 1e-3 --train-iters 2 --freeze-all-layers --save-interval 2 --save " + dir.file("c"),
      dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("--freeze-all-layers with --save: not supported yet"), std::string::npos)
      << r.out << r.err;
}

}  // namespace
}  // namespace gale
