// The --stage / DPO flags: MindSpeed-LLM's names and defaults, and one-line refusals naming the
// flags for everything DPO does not compose with yet (tensor, context, pipeline and expert parallelism,
// MoE, bf16, fp16, --rampup-batch-size, evaluation and --skip-train it does).
#include <gtest/gtest.h>

#include <algorithm>

#include "pretrain_cli.h"
#include "train/arguments.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

const std::vector<std::string> kDpo = {"--stage", "dpo", "--is-pairwise-dataset", "--load", "ckpt", "--eval-iters",
                                       "0"};

std::vector<std::string> dpo(std::vector<std::string> extra) {
  std::vector<std::string> argv = kDpo;
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(DpoArguments, MindSpeedDefaults) {
  Cli off;
  ASSERT_TRUE(off.parse_minimal({}).ok());
  EXPECT_FALSE(off.args.dpo.enabled());
  EXPECT_EQ(off.args.dpo.dpo_beta, 0.1);
  EXPECT_EQ(off.args.dpo.dpo_loss_type, "sigmoid");
  EXPECT_EQ(off.args.dpo.dpo_label_smoothing, 0.0);
  EXPECT_EQ(off.args.dpo.pref_ftx, 0.0);
  EXPECT_TRUE(off.args.dpo.ref_model.empty());
  Cli sft;
  EXPECT_TRUE(sft.parse_minimal({"--stage", "sft"}).ok());
  EXPECT_FALSE(sft.args.dpo.enabled());
  Cli on;
  ASSERT_TRUE(on.parse_minimal(dpo({"--dpo-beta", "0.5", "--dpo-loss-type", "ipo", "--ref-model", "ref"})).ok());
  EXPECT_TRUE(on.args.dpo.enabled());
  EXPECT_EQ(on.args.dpo.dpo_beta, 0.5);
  EXPECT_EQ(on.args.dpo.dpo_loss_type, "ipo");
  EXPECT_EQ(on.args.dpo.ref_model, "ref");
  Cli dp;
  EXPECT_TRUE(dp.parse_minimal(dpo({"--use-distributed-optimizer"}), 2).ok()) << "data parallelism works with DPO";
  Cli tp;
  EXPECT_TRUE(tp.parse_minimal(dpo({"--tensor-model-parallel-size", "2", "--sequence-parallel"}), 2).ok())
      << "tensor and sequence parallelism work with DPO";
  Cli cp;
  EXPECT_TRUE(cp.parse_minimal(dpo({"--context-parallel-size", "2"}), 2).ok()) << "context parallelism works with DPO";
  Cli pp;
  EXPECT_TRUE(pp.parse_minimal(dpo({"--pipeline-model-parallel-size", "2"}), 2).ok())
      << "pipeline parallelism (1F1B) works with DPO";
  Cli vpp;
  EXPECT_TRUE(vpp.parse_minimal(dpo({"--num-layers", "4", "--pipeline-model-parallel-size", "2",
                                     "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "4"}),
                                2)
                  .ok())
      << "the interleaved pipeline works with DPO";
  Cli dualpipev;
  EXPECT_TRUE(dualpipev
                  .parse_minimal(dpo({"--num-layers", "4", "--pipeline-model-parallel-size", "2", "--schedules-method",
                                      "dualpipev", "--global-batch-size", "8"}),
                                 2)
                  .ok())
      << "DualPipeV works with DPO";
  Cli bf16;
  EXPECT_TRUE(bf16.parse_minimal(dpo({"--bf16"})).ok()) << "bf16 works with DPO";
  Cli eval;
  EXPECT_TRUE(eval.parse_minimal({"--stage", "dpo", "--is-pairwise-dataset", "--load", "ckpt"}).ok())
      << "DPO evaluates (Megatron's default --eval-iters 100)";
  Cli skip;
  EXPECT_TRUE(skip.parse_minimal(dpo({"--skip-train"})).ok()) << "DPO evaluates only with --skip-train";
  Cli fp16;
  EXPECT_TRUE(fp16.parse_minimal(dpo({"--fp16"})).ok()) << "fp16 with loss scaling works with DPO";
  Cli ramp;  // sample-based: the minimal flags without their --train-iters
  std::vector<std::string> ramp_argv = testing::minimal_pretrain_flags();
  ramp_argv.erase(std::find(ramp_argv.begin(), ramp_argv.end(), "--train-iters"),
                  std::find(ramp_argv.begin(), ramp_argv.end(), "--train-iters") + 2);
  for (const std::string& f : dpo({"--rampup-batch-size", "2", "2", "8", "--global-batch-size", "4", "--micro-batch-size",
                                   "1", "--train-samples", "16"}))
    ramp_argv.push_back(f);
  const Status ramp_status = ramp.parse(ramp_argv);
  EXPECT_TRUE(ramp_status.ok()) << "--rampup-batch-size works with DPO: " << ramp_status.message();
  Cli moe;
  EXPECT_TRUE(moe.parse_minimal(dpo({"--num-experts", "4", "--expert-model-parallel-size", "2"}), 2).ok())
      << "MoE policy and reference models with expert parallelism";
}

TEST(DpoArguments, RefusalsNameTheFlags) {
  const testing::FlagErrorCase cases[] = {
      {{"--stage", "ppo"}, 1, "--stage ppo: not supported yet (Gale has sft and dpo)"},
      {{"--is-pairwise-dataset"}, 1, "--is-pairwise-dataset needs --stage dpo"},
      {{"--dpo-beta", "0.2"}, 1, "--pref-ftx, --ref-model and --refer-model-iter need --stage dpo"},
      {{"--stage", "dpo", "--load", "ckpt", "--eval-iters", "0"}, 1, "--stage dpo: expected --is-pairwise-dataset"},
      {{"--stage", "dpo", "--is-pairwise-dataset", "--eval-iters", "0"}, 1,
       "--stage dpo: expected --ref-model or --load"},
      {dpo({"--dpo-loss-type", "kto_pair"}), 1, "--dpo-loss-type: expected sigmoid, hinge or ipo, found 'kto_pair'"},
      {dpo({"--dpo-beta", "0"}), 1, "--dpo-beta: expected a positive number, found 0"},
      {dpo({"--dpo-label-smoothing", "0.7"}), 1, "--dpo-label-smoothing: expected a number in [0, 0.5], found 0.7"},
      {dpo({"--pref-ftx", "-1"}), 1, "--pref-ftx: expected a non-negative number"},
      {dpo({"--is-instruction-dataset"}), 1, "--is-instruction-dataset and --is-pairwise-dataset are exclusive"},
      {dpo({"--mtp-num-layers", "1"}), 1, "--stage dpo with --mtp-num-layers: not supported yet"},
      {dpo({"--dist-train", "--mm-model", "model.json"}), 2, "--dist-train with --stage dpo: not supported yet"},
      {dpo({"--calculate-per-token-loss"}), 1, "--stage dpo with --calculate-per-token-loss: not supported"},
      {dpo({"--refer-model-iter", "-1"}), 1, "--refer-model-iter: expected an iteration (>= 0), found -1"},
      {{"--refer-model-iter", "2"}, 1, "--refer-model-iter need --stage dpo"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.expected);
    testing::expect_one_line_error(c);
  }
}

}  // namespace
}  // namespace gale
