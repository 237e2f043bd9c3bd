// Start-up validation of the parallel layout flags: every rule gives its one-line message, and
// valid layouts pass with the derived sizes.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "model/ring_options.h"
#include "train/arg_parser.h"
#include "train/arguments.h"

namespace gale {
namespace {

// A small valid model; flags given in a test's `extra` replace these.
const std::vector<std::pair<std::string, std::string>> kBase = {{"--num-layers", "8"},
                                                                {"--hidden-size", "64"},
                                                                {"--num-attention-heads", "8"},
                                                                {"--seq-length", "32"},
                                                                {"--max-position-embeddings", "32"},
                                                                {"--micro-batch-size", "2"},
                                                                {"--train-iters", "10"},
                                                                {"--lr", "1e-3"}};

struct Validated {
  Status status;
  Arguments args;
};

Validated validate(const std::string& extra, int64_t world_size) {
  std::vector<std::string> words = {"gale", "--mock-data"};
  for (const auto& [flag, value] : kBase) {
    if (extra.find(flag + " ") != std::string::npos) continue;
    words.push_back(flag);
    words.push_back(value);
  }
  std::istringstream in(extra);
  for (std::string w; in >> w;) words.push_back(w);
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  Validated v;
  ArgParser p("gale pretrain", "test");
  add_all_pretrain_args(p, v.args);
  Status parsed = p.parse(static_cast<int>(argv.size()), argv.data());
  EXPECT_TRUE(parsed.ok()) << parsed.to_string();
  v.status = validate_all_pretrain_args(v.args, p, world_size);
  return v;
}

std::string message(const std::string& extra, int64_t world_size) {
  Validated v = validate(extra, world_size);
  return v.status.ok() ? "ok" : v.status.message();
}

TEST(ParallelArgs, SingleProcessAndDataParallelPass) {
  Validated one = validate("", 1);
  ASSERT_TRUE(one.status.ok()) << one.status.to_string();
  EXPECT_EQ(one.args.parallel.data_parallel_size, 1);
  Validated four = validate("--global-batch-size 16", 4);
  ASSERT_TRUE(four.status.ok()) << four.status.to_string();
  EXPECT_EQ(four.args.parallel.data_parallel_size, 4);
  EXPECT_EQ(four.args.parallel.virtual_pipeline_model_parallel_size, 1);
  // --global-batch-size defaults to micro-batch x DP
  EXPECT_EQ(validate("", 4).args.training.global_batch_size, 8);
}

TEST(ParallelArgs, WorldNotDivisible) {
  EXPECT_EQ(message("--tensor-model-parallel-size 4", 6),
            "world size 6 is not divisible by --tensor-model-parallel-size 4 x --pipeline-model-parallel-size 1 x "
            "--context-parallel-size 1 = 4");
  EXPECT_EQ(message("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2", 6),
            "world size 6 is not divisible by --tensor-model-parallel-size 2 x --pipeline-model-parallel-size 2 x "
            "--context-parallel-size 1 = 4");
  EXPECT_EQ(message("--pipeline-model-parallel-size 0", 1),
            "--pipeline-model-parallel-size: expected a positive integer, found 0");
  EXPECT_EQ(message("--distributed-timeout-minutes 0", 1),
            "--distributed-timeout-minutes: expected a positive integer, found 0");
}

TEST(ParallelArgs, HeadsAndQueryGroupsDivideByTp) {
  EXPECT_EQ(message("--tensor-model-parallel-size 3", 3),
            "--num-attention-heads 8 must be divisible by --tensor-model-parallel-size 3 (or give --unaligned-linear)");
  EXPECT_EQ(message("--group-query-attention --num-query-groups 2 --tensor-model-parallel-size 4", 4),
            "--num-query-groups 2 must be divisible by --tensor-model-parallel-size 4 (or give --unaligned-linear)");
  EXPECT_EQ(message("--ffn-hidden-size 100 --tensor-model-parallel-size 8", 8),
            "--ffn-hidden-size 100 must be divisible by --tensor-model-parallel-size 8 (or give --unaligned-linear)");
  // Valid TP layouts pass.
  EXPECT_EQ(message("--group-query-attention --num-query-groups 4 --tensor-model-parallel-size 4", 4),
            "ok");
}

// MindSpeed's --unaligned-linear: uneven splits pass; what it does not cover is refused.
TEST(ParallelArgs, UnalignedLinearLiftsDivisibility) {
  EXPECT_EQ(message("--unaligned-linear --tensor-model-parallel-size 3", 3), "ok");
  EXPECT_EQ(message("--unaligned-linear --num-attention-heads 10 --hidden-size 80 --group-query-attention "
                    "--num-query-groups 5 --ffn-hidden-size 100 --tensor-model-parallel-size 3", 3),
            "ok");
  EXPECT_EQ(message("--unaligned-linear --num-attention-heads 10 --hidden-size 80 --group-query-attention "
                    "--num-query-groups 2 --tensor-model-parallel-size 3", 3),
            "--unaligned-linear keeps every query group whole on one rank: --num-query-groups 2 must be at least "
            "--tensor-model-parallel-size 3 (a rank would hold no heads)");
  EXPECT_EQ(message("--unaligned-linear --ffn-hidden-size 2 --tensor-model-parallel-size 3", 3),
            "--unaligned-linear: --ffn-hidden-size 2 must be at least --tensor-model-parallel-size 3");
  EXPECT_EQ(message("--unaligned-linear --tensor-model-parallel-size 3 --num-experts 4 --sequence-parallel "
                    "--seq-length 30 --max-position-embeddings 30", 3),
            "--unaligned-linear does not support MoE models: found --num-experts 4");
  EXPECT_EQ(message("--unaligned-linear --tensor-model-parallel-size 3 --multi-latent-attention", 3),
            "--unaligned-linear does not support --multi-latent-attention");
  EXPECT_EQ(message("--unaligned-linear --tensor-model-parallel-size 3 --lora-target-modules linear_qkv", 3),
            "--unaligned-linear does not support LoRA: found --lora-target-modules");
  EXPECT_EQ(message("--unaligned-linear --tensor-model-parallel-size 3 --mtp-num-layers 1", 3),
            "--unaligned-linear with --mtp-num-layers needs --hidden-size 64 divisible by "
            "--tensor-model-parallel-size 3 (the MTP projection splits it evenly)");
  // The sequence stays evenly split under --sequence-parallel.
  EXPECT_EQ(message("--unaligned-linear --tensor-model-parallel-size 3 --sequence-parallel", 3),
            "--seq-length 32 must be divisible by --tensor-model-parallel-size 3 with --sequence-parallel "
            "(--unaligned-linear splits heads and FFN unevenly, not the sequence)");
  EXPECT_EQ(message("--unaligned-linear --tensor-model-parallel-size 3 --sequence-parallel --seq-length 30 "
                    "--max-position-embeddings 30", 3),
            "ok");
  // Ulysses context parallelism splits the heads over TP x CP evenly.
  EXPECT_EQ(message("--unaligned-linear --tensor-model-parallel-size 3 --context-parallel-size 2 "
                    "--context-parallel-algo ulysses_cp_algo --seq-length 36 --max-position-embeddings 36", 6),
            "--context-parallel-algo ulysses_cp_algo splits the heads over TP x CP: --num-attention-heads 8 must be "
            "divisible by --tensor-model-parallel-size 3 x --context-parallel-size 2 = 6");
}

TEST(ParallelArgs, SequenceParallelRules) {
  EXPECT_EQ(
      message("--sequence-parallel --tensor-model-parallel-size 8 --seq-length 36 --max-position-embeddings 36", 8),
      "--seq-length 36 must be divisible by --tensor-model-parallel-size 8 with --sequence-parallel");
  Validated off = validate("--sequence-parallel", 1);  // TP 1: turned off, as Megatron does
  ASSERT_TRUE(off.status.ok()) << off.status.to_string();
  EXPECT_FALSE(off.args.parallel.sequence_parallel);
  EXPECT_EQ(message("--sequence-parallel --tensor-model-parallel-size 2", 2),
            "ok");
}

TEST(ParallelArgs, LayersDivideByPipelineStages) {
  EXPECT_EQ(message("--pipeline-model-parallel-size 3", 3),
            "--num-layers 8 must be divisible by --pipeline-model-parallel-size 3 (or give "
            "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers)");
  Validated pp2 = validate("--pipeline-model-parallel-size 2", 2);
  ASSERT_TRUE(pp2.status.ok()) << pp2.status.to_string();
  EXPECT_EQ(pp2.args.parallel.data_parallel_size, 1);
  EXPECT_EQ(pp2.args.parallel.virtual_pipeline_model_parallel_size, 1);
  // TP x PP x DP on 8 ranks.
  Validated three_d = validate("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel", 8);
  ASSERT_TRUE(three_d.status.ok()) << three_d.status.to_string();
  EXPECT_EQ(three_d.args.parallel.data_parallel_size, 2);
}

TEST(ParallelArgs, VirtualPipelineRules) {
  EXPECT_EQ(message("--num-layers-per-virtual-pipeline-stage 2", 1),
            "--num-layers-per-virtual-pipeline-stage (interleaved pipeline) needs --pipeline-model-parallel-size > 1");
  EXPECT_EQ(message("--num-virtual-stages-per-pipeline-rank 2", 1),
            "--num-virtual-stages-per-pipeline-rank (interleaved pipeline) needs --pipeline-model-parallel-size > 1");
  EXPECT_EQ(
      message("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
              "--num-virtual-stages-per-pipeline-rank 2",
              2),
      "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank are exclusive; give one");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3", 2),
            "the 4 layers per pipeline stage (--num-layers 8 / --pipeline-model-parallel-size 2) must be divisible by "
            "--num-layers-per-virtual-pipeline-stage 3");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 3", 2),
            "the 4 layers per pipeline stage (--num-layers 8 / --pipeline-model-parallel-size 2) must be divisible by "
            "--num-virtual-stages-per-pipeline-rank 3");
  Validated vpp = validate("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 "
                           "--global-batch-size 8",
                           2);
  ASSERT_TRUE(vpp.status.ok()) << vpp.status.to_string();
  EXPECT_EQ(vpp.args.parallel.virtual_pipeline_model_parallel_size, 4);  // 8 layers / 2 stages / 1 layer per chunk
  Validated stages = validate("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
                              "--global-batch-size 4",
                              2);
  ASSERT_TRUE(stages.status.ok()) << stages.status.to_string();
  EXPECT_EQ(stages.args.parallel.virtual_pipeline_model_parallel_size, 2);
}

TEST(ParallelArgs, InterleavedScheduleNeedsMicroBatchesAMultipleOfPipelineSize) {
  // Default global batch: micro-batch x DP = one micro-batch per iteration.
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2", 2),
            "the interleaved pipeline schedule needs the micro-batches per iteration (--global-batch-size 2 / "
            "(--micro-batch-size 2 x data-parallel size 1) = 1) to be a multiple of --pipeline-model-parallel-size 2");
  EXPECT_EQ(message("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 --global-batch-size 24",
                    8),
            "the interleaved pipeline schedule needs the micro-batches per iteration (--global-batch-size 24 / "
            "(--micro-batch-size 2 x data-parallel size 2) = 6) to be a multiple of --pipeline-model-parallel-size 4");
  EXPECT_EQ(message("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 --global-batch-size 32",
                    8),
            "ok");
  // 1F1B runs any number of micro-batches.
  EXPECT_EQ(message("--pipeline-model-parallel-size 4 --global-batch-size 6", 4), "ok");
  // A global batch that does not divide is reported by the batch check, not as a schedule problem.
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
                    "--global-batch-size 5",
                    2),
            "--global-batch-size 5 must be a multiple of --micro-batch-size 2 times the data-parallel size 1");
}

TEST(ParallelArgs, UnevenFirstAndLastStages) {
  EXPECT_EQ(message("--decoder-first-pipeline-num-layers 2", 1),
            "--decoder-first-pipeline-num-layers needs --pipeline-model-parallel-size > 1");
  // 10 layers on 4 stages: first 1, last 1, the 2 middle stages 4 each.
  EXPECT_EQ(message("--num-layers 10 --pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 1 "
                    "--decoder-last-pipeline-num-layers 1",
                    4),
            "ok");
  EXPECT_EQ(message("--num-layers 11 --pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 1", 4),
            "the 10 layers left for the 3 middle pipeline stages (--num-layers minus "
            "--decoder-first/last-pipeline-num-layers) must divide evenly among them");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 3 "
                    "--decoder-last-pipeline-num-layers 3",
                    2),
            "--decoder-first-pipeline-num-layers 3 + --decoder-last-pipeline-num-layers 3 must equal --num-layers 8 "
            "with --pipeline-model-parallel-size 2");
  EXPECT_EQ(message("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 "
                    "--decoder-last-pipeline-num-layers 4",
                    4),
            "--decoder-first/last-pipeline-num-layers take 10 layers, more than --num-layers 8");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --decoder-last-pipeline-num-layers 0", 2),
            "--decoder-last-pipeline-num-layers: expected a positive integer, found 0");
  // With interleaving, each uneven stage and each middle stage divides by the virtual stages.
  EXPECT_EQ(message("--num-layers 12 --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 "
                    "--decoder-first-pipeline-num-layers 3",
                    4),
            "--decoder-first-pipeline-num-layers 3 must be divisible by --num-virtual-stages-per-pipeline-rank 2");
  EXPECT_EQ(message("--num-layers 12 --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 "
                    "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 4",
                    4),
            "the 3 layers of each middle pipeline stage must be divisible by --num-virtual-stages-per-pipeline-rank 2");
  EXPECT_EQ(message("--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1 "
                    "--decoder-first-pipeline-num-layers 2",
                    4),
            "--num-layers-per-virtual-pipeline-stage cannot be combined with --decoder-first/last-pipeline-num-layers; "
            "give --num-virtual-stages-per-pipeline-rank");
}

// Megatron's rules for --account-for-embedding/loss-in-pipeline-split: the layers plus the
// embedding and/or the loss divide by the pipeline stages (and by the virtual stages per rank),
// and the uneven split is excluded.
TEST(ParallelArgs, EmbeddingAndLossCountInThePipelineSplit) {
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --account-for-embedding-in-pipeline-split", 2),
            "(--num-layers 8 + 1 for the embedding) = 9 must be divisible by --pipeline-model-parallel-size 2");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --account-for-loss-in-pipeline-split", 2),
            "(--num-layers 8 + 1 for the loss) = 9 must be divisible by --pipeline-model-parallel-size 2");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --account-for-embedding-in-pipeline-split "
                    "--account-for-loss-in-pipeline-split",
                    2),
            "ok");
  EXPECT_EQ(message("--num-layers 7 --pipeline-model-parallel-size 4 --account-for-loss-in-pipeline-split", 4), "ok");
  EXPECT_EQ(message("--num-layers 8 --pipeline-model-parallel-size 4 --account-for-loss-in-pipeline-split", 4),
            "(--num-layers 8 + 1 for the loss) = 9 must be divisible by --pipeline-model-parallel-size 4");
  // No pipeline: the flags change nothing and need nothing.
  EXPECT_EQ(message("--account-for-embedding-in-pipeline-split", 1), "ok");
  // Virtual stages: the layers of a stage, embedding and loss included, divide by them.
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 3 "
                    "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
                    "--global-batch-size 4",
                    2),
            "the 5 layers per pipeline stage ((--num-layers 8 + 2 for the embedding and the loss) / "
            "--pipeline-model-parallel-size 2) must be divisible by --num-virtual-stages-per-pipeline-rank 3");
  EXPECT_EQ(message("--num-layers 7 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3 "
                    "--account-for-embedding-in-pipeline-split --global-batch-size 4",
                    2),
            "the 4 layers per pipeline stage ((--num-layers 7 + 1 for the embedding) / "
            "--pipeline-model-parallel-size 2) must be divisible by --num-layers-per-virtual-pipeline-stage 3");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
                    "--account-for-embedding-in-pipeline-split",
                    2),
            "(--num-layers 8 + 1 for the embedding) = 9 must be divisible by --pipeline-model-parallel-size 2");
  // 7 layers + the embedding on 2 stages of 2 virtual stages of 2 slots.
  Validated vpp = validate("--num-layers 7 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
                           "--account-for-embedding-in-pipeline-split --global-batch-size 4",
                           2);
  ASSERT_TRUE(vpp.status.ok()) << vpp.status.to_string();
  EXPECT_EQ(vpp.args.parallel.virtual_pipeline_model_parallel_size, 2);
  EXPECT_EQ(message("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 2 "
                    "--account-for-loss-in-pipeline-split",
                    4),
            "--account-for-loss-in-pipeline-split cannot be combined with --decoder-first-pipeline-num-layers (Megatron "
            "counts the embedding and the loss only in the even split)");
}

// Megatron's --pipeline-model-parallel-layout: the VPP size from the stage count, the layers of
// each (rank, virtual stage) from the symbols (train/pipeline_layout.h), and Megatron's exclusions.
TEST(ParallelArgs, PipelineModelParallelLayout) {
  Validated v = validate("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*2|ttt||t*3L "
                         "--global-batch-size 4",
                         2);
  ASSERT_TRUE(v.status.ok()) << v.status.to_string();
  EXPECT_EQ(v.args.parallel.virtual_pipeline_model_parallel_size, 2);
  EXPECT_EQ(v.args.parallel.pipeline_layers, (std::vector<std::vector<int64_t>>{{2, 0}, {3, 3}}));
  Validated flat = validate("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*5|t*3L", 2);
  ASSERT_TRUE(flat.status.ok()) << flat.status.to_string();
  EXPECT_EQ(flat.args.parallel.virtual_pipeline_model_parallel_size, 1);
  EXPECT_EQ(flat.args.parallel.pipeline_layers, (std::vector<std::vector<int64_t>>{{5}, {3}}));
  EXPECT_EQ(message("--pipeline-model-parallel-layout Et*8L", 1), "ok");
  const std::string f = "--pipeline-model-parallel-layout ";
  EXPECT_EQ(message("--pipeline-model-parallel-layout Et*4|t*4L", 1),
            f + "'Et*4|t*4L' has 2 stages: virtual pipeline stages need --pipeline-model-parallel-size > 1");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*4|t*3|L", 2),
            f + "'Et*4|t*3|L': expected a number of stages divisible by --pipeline-model-parallel-size 2, found 3");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*4|t*3L", 2),
            f + "'Et*4|t*3L': expected --num-layers 8 decoder layers (t), found 7");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
                    "--pipeline-model-parallel-layout Et*4|t*4L",
                    2),
            "--pipeline-model-parallel-layout gives the virtual stages itself (as Megatron: no more than one of it, "
            "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank), found "
            "--num-virtual-stages-per-pipeline-rank");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layer-list 4,4 --pipeline-model-parallel-layout Et*4|t*4L",
                    2),
            "--num-layer-list, --pipeline-num-transformer-layers and --pipeline-model-parallel-layout each give the "
            "layers of every pipeline stage: expected one of them, found 2");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 3 "
                    "--pipeline-model-parallel-layout Et*4|t*4L",
                    2),
            "--pipeline-model-parallel-layout gives every stage's layers itself: expected no "
            "--decoder-first-pipeline-num-layers, found it set");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --schedules-method dualpipev "
                    "--pipeline-model-parallel-layout Et*4|t*4L",
                    2),
            "--schedules-method dualpipev places the layers itself (2 x PP equal chunks, rank r holding chunks r and "
            "2PP-1-r): expected no --pipeline-model-parallel-layout, found it set");
}

// MindSpeed-LLM's --num-layer-list and MindSpeed's --pipeline-num-transformer-layers: parsed into
// the layers of every (pipeline rank, virtual stage), with MindSpeed's rules on length, sum, sign
// and the flags they exclude.
TEST(ParallelArgs, ExplicitPipelineSplit) {
  Validated list = validate("--pipeline-model-parallel-size 4 --num-layer-list 1,3,3,1", 4);
  ASSERT_TRUE(list.status.ok()) << list.status.to_string();
  EXPECT_EQ(list.args.parallel.pipeline_layers, (std::vector<std::vector<int64_t>>{{1}, {3}, {3}, {1}}));
  // The nested lists with MindSpeed's repetition, a zero and interleaving (2 virtual stages).
  Validated nested = validate("--num-layers 7 --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank "
                              "2 --pipeline-num-transformer-layers [[0,1],[1,1]*2,[2,0]] --global-batch-size 8",
                              4);
  ASSERT_TRUE(nested.status.ok()) << nested.status.to_string();
  EXPECT_EQ(nested.args.parallel.pipeline_layers,
            (std::vector<std::vector<int64_t>>{{0, 1}, {1, 1}, {1, 1}, {2, 0}}));
  // Without virtual stages, one count per row; blanks are ignored and a count may repeat too.
  Validated rows = validate("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[3],[5*1]]", 2);
  ASSERT_TRUE(rows.status.ok()) << rows.status.to_string();
  EXPECT_EQ(rows.args.parallel.pipeline_layers, (std::vector<std::vector<int64_t>>{{3}, {5}}));
  // Megatron's --num-layers-per-virtual-pipeline-stage sets the virtual stages (MindSpeed's way):
  // 8 layers / 2 ranks / 2 per virtual stage = 2 virtual stages.
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
                    "--pipeline-num-transformer-layers [[1,2],[4,1]] --global-batch-size 4",
                    2),
            "ok");
  // Length, sum and sign.
  EXPECT_EQ(message("--pipeline-model-parallel-size 4 --num-layer-list 2,3,3", 4),
            "--num-layer-list 2,3,3: expected one count per pipeline rank (--pipeline-model-parallel-size 4), found 3");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layer-list 3,3", 2),
            "--num-layer-list 3,3 places 6 layers: expected the sum to be --num-layers 8");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layer-list 9,-1", 2),
            "--num-layer-list 9,-1: expected layer counts >= 0, found -1 for pipeline rank 1");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[4],[4],[0]]", 2),
            "--pipeline-num-transformer-layers [[4],[4],[0]]: expected one row per pipeline rank "
            "(--pipeline-model-parallel-size 2), found 3");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
                    "--pipeline-num-transformer-layers [[2,2],[4]] --global-batch-size 4",
                    2),
            "--pipeline-num-transformer-layers [[2,2],[4]]: expected 2 counts per row (the virtual stages of each "
            "pipeline rank), found 1 in row 1");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[2,2],[4,0]]", 2),
            "--pipeline-num-transformer-layers [[2,2],[4,0]]: expected 1 count per row (the virtual stages of each "
            "pipeline rank: none), found 2 in row 0");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[4],[5]]", 2),
            "--pipeline-num-transformer-layers [[4],[5]] places 9 layers: expected the sum to be --num-layers 8");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[9],[-1]]", 2),
            "--pipeline-num-transformer-layers [[9],[-1]]: expected layer counts >= 0, found -1 for pipeline rank 1");
  // Malformed text.
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layer-list 4,,4", 2),
            "--num-layer-list: expected comma-separated layer counts such as 4,6,6,4, found \"\" in \"4,,4\"");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layer-list 4,4x", 2),
            "--num-layer-list: expected comma-separated layer counts such as 4,6,6,4, found \"4x\" in \"4,4x\"");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layer-list 4,1234567890", 2),
            "--num-layer-list: expected comma-separated layer counts such as 4,6,6,4, found \"1234567890\" in "
            "\"4,1234567890\"");
  const std::string nested_syntax =
      "--pipeline-num-transformer-layers: expected nested lists such as [[0,1],[1,1]*2,[3,0]] (one row of counts "
      "per pipeline rank), found ";
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [4,4]", 2),
            nested_syntax + "\"[4,4]\" (a count outside a row at character 2)");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[4],[4]", 2),
            nested_syntax + "\"[[4],[4]\" (the end at character 9)");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[4],[a]]", 2),
            nested_syntax + "\"[[4],[a]]\" ('a' where a count belongs at character 7)");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[4],[[4]]]", 2),
            nested_syntax + "\"[[4],[[4]]]\" (a list nested inside a row at character 7)");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[4]*0,[4]]", 2),
            nested_syntax + "\"[[4]*0,[4]]\" (repeat count 0 (expected 1 to 65536) at character 7)");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[4*65536,4],[4]]", 2),
            nested_syntax + "\"[[4*65536,4],[4]]\" (a row of more than 65536 counts at character 12)");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[4],[1234567890]]", 2),
            nested_syntax + "\"[[4],[1234567890]]\" ('1' where a count belongs at character 7)");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[4],[4]]x", 2),
            nested_syntax + "\"[[4],[4]]x\" (text after the closing ] at character 10)");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers []", 2),
            nested_syntax + "\"[]\" (an empty list at character 2)");
  // The flags an explicit split excludes.
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layer-list 4,4 --pipeline-num-transformer-layers "
                    "[[4],[4]]",
                    2),
            "--num-layer-list, --pipeline-num-transformer-layers and --pipeline-model-parallel-layout each give the "
            "layers of every pipeline stage: expected one of them, found 2");
  EXPECT_EQ(message("--num-layer-list 8", 1),
            "--num-layer-list splits the layers over pipeline stages: expected --pipeline-model-parallel-size > 1, "
            "found 1");
  EXPECT_EQ(message("--pipeline-num-transformer-layers [[8]]", 1), "ok");  // MindSpeed: one row for PP 1
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 --num-layer-list 4,4 "
                    "--global-batch-size 4",
                    2),
            "--num-layer-list cannot be combined with --num-layers-per-virtual-pipeline-stage (as in MindSpeed-LLM: "
            "one count per pipeline rank, no virtual stages; give --pipeline-num-transformer-layers for the layers "
            "of each virtual stage)");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --num-layer-list 4,4 "
                    "--global-batch-size 4",
                    2),
            "--num-layer-list cannot be combined with --num-virtual-stages-per-pipeline-rank (as in MindSpeed-LLM: "
            "one count per pipeline rank, no virtual stages; give --pipeline-num-transformer-layers for the layers "
            "of each virtual stage)");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layer-list 4,4 --noop-layers 0", 2),
            "--num-layer-list cannot be combined with --noop-layers (as in MindSpeed: both decide which stage holds "
            "which layers; give one), found --noop-layers 0");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --pipeline-num-transformer-layers [[4],[4]] "
                    "--decoder-first-pipeline-num-layers 4",
                    2),
            "--pipeline-num-transformer-layers gives every stage's layers itself: expected no "
            "--decoder-first-pipeline-num-layers, found it set");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layer-list 4,4 --decoder-last-pipeline-num-layers 4", 2),
            "--num-layer-list gives every stage's layers itself: expected no --decoder-last-pipeline-num-layers, "
            "found it set");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layer-list 4,4 --account-for-embedding-in-pipeline-split",
                    2),
            "--num-layer-list gives every stage's layers itself: expected no "
            "--account-for-embedding-in-pipeline-split, found it set");
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --num-layer-list 4,4 --account-for-loss-in-pipeline-split", 2),
            "--num-layer-list gives every stage's layers itself: expected no --account-for-loss-in-pipeline-split, "
            "found it set");
}

// Megatron's get_model: --ddp-num-buckets excludes --ddp-bucket-size and must be positive.
TEST(ParallelArgs, DdpNumBuckets) {
  EXPECT_EQ(message("--ddp-num-buckets 4", 1), "ok");
  EXPECT_EQ(message("--ddp-num-buckets 4 --ddp-bucket-size 1000", 1),
            "--ddp-num-buckets and --ddp-bucket-size cannot both be given: expected one, found --ddp-num-buckets 4 "
            "and --ddp-bucket-size 1000");
  EXPECT_EQ(message("--ddp-num-buckets 0", 1), "--ddp-num-buckets: expected a positive integer, found 0");
}

// Megatron's partial distributed optimizer: needs the distributed optimizer, no expert
// parallelism, and a count dividing DP x CP.
TEST(ParallelArgs, DistributedOptimizerInstances) {
  EXPECT_EQ(message("--use-distributed-optimizer --num-distributed-optimizer-instances 2", 4), "ok");
  EXPECT_EQ(message("--use-distributed-optimizer --num-distributed-optimizer-instances 4 --context-parallel-size 2", 4),
            "ok");
  EXPECT_EQ(message("--num-distributed-optimizer-instances 2", 4),
            "--num-distributed-optimizer-instances 2 shards the distributed optimizer: expected "
            "--use-distributed-optimizer");
  EXPECT_EQ(message("--use-distributed-optimizer --num-distributed-optimizer-instances 3", 4),
            "--num-distributed-optimizer-instances 3: expected a divisor of the data-parallel size x "
            "--context-parallel-size, found 4 x 1 = 4");
  EXPECT_EQ(message("--use-distributed-optimizer --num-distributed-optimizer-instances 0", 4),
            "--num-distributed-optimizer-instances: expected a positive integer, found 0");
  EXPECT_EQ(message("--use-distributed-optimizer --num-distributed-optimizer-instances 2 --num-experts 4 "
                    "--expert-model-parallel-size 2",
                    4),
            "--num-distributed-optimizer-instances 2: Megatron's partial distributed optimizer cannot be used with "
            "expert parallelism (found --expert-model-parallel-size 2)");
  EXPECT_EQ(message("--num-distributed-optimizer-instances 1", 4), "ok");
}

// Megatron's validate_args for --overlap-param-gather-with-optimizer-step.
TEST(ParallelArgs, OverlapParamGatherWithOptimizerStep) {
  const std::string ok = "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
                         "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
                         "--global-batch-size 16 --overlap-param-gather-with-optimizer-step";
  EXPECT_EQ(message(ok, 4), "ok");
  EXPECT_EQ(message("--overlap-param-gather-with-optimizer-step --pipeline-model-parallel-size 2 "
                    "--num-virtual-stages-per-pipeline-rank 2 --global-batch-size 16",
                    4),
            "--overlap-param-gather-with-optimizer-step is only supported with the distributed optimizer: expected "
            "--use-distributed-optimizer");
  EXPECT_EQ(message("--use-distributed-optimizer --overlap-param-gather-with-optimizer-step "
                    "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --global-batch-size 16",
                    4),
            "--overlap-param-gather-with-optimizer-step needs --overlap-param-gather");
  EXPECT_EQ(message("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
                    "--overlap-param-gather-with-optimizer-step",
                    4),
            "--overlap-param-gather-with-optimizer-step is only supported with interleaved pipeline parallelism: "
            "expected --num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank");
}

TEST(ParallelArgs, GlobalBatchDividesByMicroBatchTimesDataParallel) {
  EXPECT_EQ(message("--global-batch-size 12", 4),
            "--global-batch-size 12 must be a multiple of --micro-batch-size 2 times the data-parallel size 4");
  EXPECT_EQ(message("--global-batch-size 24", 4), "ok");
}

// --schedules-method dualpipev (MindSpeed's DualpipeVFeature): two chunks per rank, the even V split,
// at least 2·PP micro-batches, and a one-line refusal of every flag that places layers otherwise.
TEST(ParallelArgs, DualPipeV) {
  const std::string v = "--schedules-method dualpipev ";
  Validated ok = validate(v + "--pipeline-model-parallel-size 2 --global-batch-size 8", 2);
  ASSERT_TRUE(ok.status.ok()) << ok.status.to_string();
  EXPECT_EQ(ok.args.parallel.virtual_pipeline_model_parallel_size, 2);  // the V's two chunks
  EXPECT_EQ(ok.args.parallel.schedules_method, "dualpipev");
  // DP, TP with SP, CP and the distributed optimizer combine with it.
  EXPECT_EQ(message(v + "--pipeline-model-parallel-size 2 --global-batch-size 16 --use-distributed-optimizer "
                        "--overlap-grad-reduce --overlap-param-gather",
                    4),
            "ok");
  EXPECT_EQ(message(v + "--pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel "
                        "--global-batch-size 8",
                    4),
            "ok");
  EXPECT_EQ(message(v + "--pipeline-model-parallel-size 2 --context-parallel-size 2 --global-batch-size 8", 4), "ok");
  EXPECT_EQ(message(v + "--global-batch-size 8", 1),
            "--schedules-method dualpipev needs --pipeline-model-parallel-size >= 2, found 1");
  EXPECT_EQ(message(v + "--pipeline-model-parallel-size 4 --global-batch-size 16 --num-layers 12", 4),
            "--schedules-method dualpipev cuts the layers into 2 x --pipeline-model-parallel-size = 8 equal chunks: "
            "expected --num-layers divisible by 8, found 12");
  EXPECT_EQ(message(v + "--pipeline-model-parallel-size 2 --global-batch-size 6", 2),
            "--schedules-method dualpipev needs at least 2 x --pipeline-model-parallel-size = 4 micro-batches per "
            "iteration (--global-batch-size / (--micro-batch-size x data-parallel size)), found 3");
  EXPECT_EQ(message(v + "--pipeline-model-parallel-size 2 --global-batch-size 8", 4),  // DP2: 2 micro-batches
            "--schedules-method dualpipev needs at least 2 x --pipeline-model-parallel-size = 4 micro-batches per "
            "iteration (--global-batch-size / (--micro-batch-size x data-parallel size)), found 2");
  const std::pair<const char*, const char*> others[] = {
      {"--num-layers-per-virtual-pipeline-stage 2", "--num-layers-per-virtual-pipeline-stage"},
      {"--num-virtual-stages-per-pipeline-rank 2", "--num-virtual-stages-per-pipeline-rank"},
      {"--microbatch-group-size-per-virtual-pipeline-stage 2", "--microbatch-group-size-per-virtual-pipeline-stage"},
      {"--num-layer-list 4,4", "--num-layer-list"},
      {"--pipeline-num-transformer-layers [[2,2],[2,2]]", "--pipeline-num-transformer-layers"},
      {"--decoder-first-pipeline-num-layers 2", "--decoder-first-pipeline-num-layers"},
      {"--decoder-last-pipeline-num-layers 2", "--decoder-last-pipeline-num-layers"},
      {"--account-for-embedding-in-pipeline-split", "--account-for-embedding-in-pipeline-split"},
      {"--account-for-loss-in-pipeline-split", "--account-for-loss-in-pipeline-split"},
  };
  for (const auto& [flags, flag] : others)
    EXPECT_EQ(message(v + "--pipeline-model-parallel-size 2 --global-batch-size 8 " + flags, 2),
              std::string("--schedules-method dualpipev places the layers itself (2 x PP equal chunks, rank r holding "
                          "chunks r and 2PP-1-r): expected no ") +
                  flag + ", found it set");
  EXPECT_EQ(message(v + "--pipeline-model-parallel-size 2 --global-batch-size 16 --use-distributed-optimizer "
                        "--overlap-grad-reduce --overlap-param-gather --overlap-param-gather-with-optimizer-step",
                    4),
            "--schedules-method dualpipev places the layers itself (2 x PP equal chunks, rank r holding chunks r and "
            "2PP-1-r): expected no --overlap-param-gather-with-optimizer-step, found it set");
}

// Flags refused at parsing: another --schedules-method.
TEST(ParallelArgs, DualPipeVRefusesOtherMethods) {
  auto parse = [](std::vector<std::string> words) {
    Arguments args;
    ArgParser p("gale pretrain", "test");
    add_all_pretrain_args(p, args);
    words.insert(words.begin(), "gale");
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    return p.parse(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_TRUE(parse({"--schedules-method", "dualpipev", "--dualpipev-dw-detach"}).ok());
  Status other = parse({"--schedules-method", "dualpipe"});
  EXPECT_FALSE(other.ok());
  EXPECT_NE(other.message().find("--schedules-method"), std::string::npos) << other.message();
}

// --dualpipev-dw-detach: DualPipeV only, and refused with what its deferred weight gradients do not
// cover (layers whose backward it does not split, the overlapped gradient reduction).
TEST(ParallelArgs, DualPipeVDwDetach) {
  const std::string v = "--schedules-method dualpipev --pipeline-model-parallel-size 2 --global-batch-size 8 ";
  Validated ok = validate(v + "--dualpipev-dw-detach", 2);
  ASSERT_TRUE(ok.status.ok()) << ok.status.to_string();
  EXPECT_TRUE(ok.args.parallel.dualpipev_dw_detach);
  EXPECT_EQ(message("--pipeline-model-parallel-size 2 --global-batch-size 8 --dualpipev-dw-detach", 2),
            "--dualpipev-dw-detach needs --schedules-method dualpipev, found --schedules-method ''");
  const std::string dense =
      "--dualpipev-dw-detach defers the weight gradients of the GPT layers' linears (attention, MLA, MLP, MoE "
      "experts) only: ";
  for (const char* moe_or_mla :
       {"--num-experts 4", "--num-experts 4 --moe-shared-expert-intermediate-size 32 --disable-bias-linear",
        "--multi-latent-attention --kv-lora-rank 12 --qk-head-dim 6 --qk-pos-emb-head-dim 4 --v-head-dim 5 "
        "--position-embedding-type rope"}) {
    Validated deferred = validate(v + "--dualpipev-dw-detach " + moe_or_mla, 2);
    EXPECT_TRUE(deferred.status.ok()) << moe_or_mla << ": " << deferred.status.to_string();
  }
  EXPECT_EQ(message(v + "--dualpipev-dw-detach --lora-target-modules linear_qkv", 2),
            dense + "expected no LoRA adapters, found --lora-target-modules (not supported yet)");
  EXPECT_EQ(message(v + "--dualpipev-dw-detach --swap-attention", 2),
            dense + "expected no --swap-attention (its swapped-in activations are reused before the deferred "
                    "gradients run), found it set (not supported yet)");
  EXPECT_EQ(message(v + "--dualpipev-dw-detach --overlap-grad-reduce", 2),
            "--dualpipev-dw-detach runs weight gradients after their layer's backward: expected no "
            "--overlap-grad-reduce (a bucket's reduction would start before them), found it set (not supported yet)");
}

// MindSpeed's kvallgather_cp_algo is the all-gather of keys and values (--cp-comm-type allgather).
TEST(ParallelArgs, KvAllGatherContextParallel) {
  Validated kv = validate("--context-parallel-size 2 --context-parallel-algo kvallgather_cp_algo", 2);
  ASSERT_TRUE(kv.status.ok()) << kv.status.to_string();
  EXPECT_EQ(kv.args.parallel.context_parallel_algo, "kvallgather_cp_algo");
  EXPECT_EQ(kv.args.parallel.cp_comm_type, "allgather");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-algo kvallgather_cp_algo --cp-comm-type allgather", 2),
            "ok");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-algo kvallgather_cp_algo --cp-comm-type p2p", 2),
            "--context-parallel-algo kvallgather_cp_algo all-gathers keys and values: expected --cp-comm-type "
            "allgather or none, found 'p2p'");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-algo kvallgather_cp_algo --cp-comm-type a2a", 2),
            "--cp-comm-type a2a selects the context-parallel algorithm itself (ulysses_cp_algo): expected "
            "--context-parallel-algo megatron_cp_algo (the default), found 'kvallgather_cp_algo'");
  // Gale keeps the load-balanced split with documents too (MindSpeed: S % CP with --reset-attention-mask).
  EXPECT_EQ(message("--context-parallel-size 4 --context-parallel-algo kvallgather_cp_algo --reset-attention-mask "
                    "--seq-length 36 --max-position-embeddings 36", 4),
            "--seq-length 36 must be divisible by 2 x --context-parallel-size 4 = 8 (each sequence is cut into 2 x CP "
            "equal chunks)");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-algo kvallgather_cp_algo --ulysses-degree-in-cp 2", 2),
            "--ulysses-degree-in-cp 2 needs --context-parallel-algo hybrid_cp_algo, found 'kvallgather_cp_algo'");
}

// MindSpeed's adaptive CP: ring attention over an adaptive layout (parallel/adaptive_cp.h); its
// sub-flags only with it, the dynamic mode with document masks, and what is not supported yet.
TEST(ParallelArgs, AdaptiveContextParallel) {
  Validated on = validate("--context-parallel-size 4 --context-parallel-algo adaptive_cp_algo "
                          "--adaptive-cp-only-reschedule --adaptive-cp-without-coarse --attention-mask-on-cpu", 4);
  ASSERT_TRUE(on.status.ok()) << on.status.to_string();
  EXPECT_TRUE(on.args.parallel.adaptive_cp_only_reschedule);
  EXPECT_TRUE(on.args.parallel.adaptive_cp_without_coarse);
  EXPECT_EQ(on.args.parallel.cp_comm_type, "p2p");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-algo adaptive_cp_algo --reset-attention-mask "
                    "--adaptive-cp-dynamic-attn-mask --tensor-model-parallel-size 2 --sequence-parallel", 4),
            "ok");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-algo adaptive_cp_algo --reset-attention-mask", 2),
            "--context-parallel-algo adaptive_cp_algo with --reset-attention-mask: the document mask changes every "
            "micro-batch, so the layout must too: expected --adaptive-cp-dynamic-attn-mask (a layout computed once "
            "would skip blocks that later micro-batches need)");
  EXPECT_EQ(message("--adaptive-cp-only-reschedule", 1),
            "--adaptive-cp-only-reschedule applies to --context-parallel-algo adaptive_cp_algo or "
            "hybrid_adaptive_cp_algo with --context-parallel-size > 1, found --context-parallel-size 1");
  EXPECT_EQ(message("--context-parallel-size 2 --adaptive-cp-dynamic-attn-mask", 2),
            "--adaptive-cp-dynamic-attn-mask applies to --context-parallel-algo adaptive_cp_algo or "
            "hybrid_adaptive_cp_algo with --context-parallel-size > 1, found --context-parallel-algo megatron_cp_algo");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-algo adaptive_cp_algo "
                    "--adaptive-cp-manually-set-mask-list", 2),
            "--adaptive-cp-manually-set-mask-list: not supported yet (MindSpeed takes the mask list from a Python "
            "function the user edits, generate_adaptive_cp_mask_list_by_user; Gale derives every block from the "
            "document ids and --sliding-window)");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-algo adaptive_cp_algo --cp-comm-type allgather", 2),
            "--context-parallel-algo adaptive_cp_algo skips the empty blocks of ring attention: expected "
            "--cp-comm-type p2p, found 'allgather'");
  // The double ring and the ring's key/value cache apply to its ring too.
  EXPECT_EQ(message("--context-parallel-size 4 --context-parallel-algo adaptive_cp_algo --cp-window-size 2 "
                    "--context-parallel-kv-cache-policy half", 4),
            "ok");
  EXPECT_EQ(message("--context-parallel-size 4 --context-parallel-algo adaptive_cp_algo --cp-window-size 4", 4),
            "--cp-window-size 4: expected W < --context-parallel-size 4 and dividing it (windows of W ranks), found 4");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-algo adaptive_cp_algo "
                    "--pipeline-model-parallel-size 2", 4),
            "ok");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-algo adaptive_cp_algo "
                    "--pipeline-model-parallel-size 2 --use-multiparameter-pipeline-model-parallel", 4),
            "--context-parallel-algo adaptive_cp_algo with --use-multiparameter-pipeline-model-parallel: not "
            "supported yet (the later stages would plan without the document ids)");
  // hybrid_adaptive_cp_algo: hybrid_cp_algo (Ulysses groups) whose rings are adaptive.
  Validated hybrid = validate("--context-parallel-size 4 --context-parallel-algo hybrid_adaptive_cp_algo "
                              "--ulysses-degree-in-cp 2", 4);
  ASSERT_TRUE(hybrid.status.ok()) << hybrid.status.to_string();
  EXPECT_EQ(hybrid.args.parallel.context_parallel_algo, "hybrid_cp_algo");
  EXPECT_TRUE(hybrid.args.parallel.adaptive_cp);
  EXPECT_EQ(message("--context-parallel-size 4 --context-parallel-algo hybrid_adaptive_cp_algo", 4),
            "--context-parallel-algo hybrid_adaptive_cp_algo: expected --ulysses-degree-in-cp U with 1 < U < "
            "--context-parallel-size 4 and U dividing it (U = 1 is megatron_cp_algo, U = CP ulysses_cp_algo), found "
            "none");
  EXPECT_EQ(message("--context-parallel-size 4 --context-parallel-algo hybrid_adaptive_cp_algo --ulysses-degree-in-cp "
                    "2 --cp-comm-type allgather", 4),
            "--context-parallel-algo hybrid_adaptive_cp_algo runs ring attention across its Ulysses groups: expected "
            "--cp-comm-type p2p, found 'allgather'");
}

// --cp-window-size: 1 <= W < the ring size, W dividing it, and only for ring attention.
TEST(ParallelArgs, CpWindowSize) {
  EXPECT_EQ(message("--context-parallel-size 4 --cp-window-size 2", 4), "ok");
  EXPECT_EQ(message("--context-parallel-size 4 --cp-window-size 1", 4), "ok");
  EXPECT_EQ(message("--context-parallel-size 8 --context-parallel-algo hybrid_cp_algo --ulysses-degree-in-cp 2 "
                    "--cp-window-size 2", 8),
            "ok");
  EXPECT_EQ(message("--context-parallel-size 4 --cp-window-size 0", 4),
            "--cp-window-size: expected a positive integer, found 0");
  for (const char* w : {"4", "3", "8"})
    EXPECT_EQ(message(std::string("--context-parallel-size 4 --cp-window-size ") + w, 4),
              std::string("--cp-window-size ") + w + ": expected W < --context-parallel-size 4 and dividing it "
              "(windows of W ranks), found " + w);
  EXPECT_EQ(message("--context-parallel-size 8 --context-parallel-algo hybrid_cp_algo --ulysses-degree-in-cp 4 "
                    "--cp-window-size 2", 8),
            "--cp-window-size 2: expected W < the ring degree --context-parallel-size / --ulysses-degree-in-cp = 2 "
            "and dividing it (windows of W ranks), found 2");
  const std::string needs = "ring attention (--context-parallel-size > 1 with megatron_cp_algo and --cp-comm-type "
                            "p2p, or hybrid_cp_algo), found ";
  EXPECT_EQ(message("--cp-window-size 2", 1), "--cp-window-size 2 applies to " + needs + "--context-parallel-size 1");
  EXPECT_EQ(message("--context-parallel-size 4 --cp-window-size 2 --cp-comm-type allgather", 4),
            "--cp-window-size 2 applies to " + needs + "--cp-comm-type allgather");
  EXPECT_EQ(message("--context-parallel-size 4 --cp-window-size 2 --context-parallel-algo ulysses_cp_algo", 4),
            "--cp-window-size 2 applies to " + needs + "--context-parallel-algo ulysses_cp_algo");
  EXPECT_EQ(message("--context-parallel-size 4 --cp-window-size 2 --context-parallel-algo kvallgather_cp_algo", 4),
            "--cp-window-size 2 applies to " + needs + "--context-parallel-algo kvallgather_cp_algo");
}

// --context-parallel-kv-cache-policy and --context-parallel-cache-interval (MindSpeed's rules, and
// a ring to cache from).
TEST(ParallelArgs, ContextParallelKvCache) {
  Validated full = validate("--context-parallel-size 2 --context-parallel-kv-cache-policy full", 2);
  ASSERT_TRUE(full.status.ok()) << full.status.to_string();
  EXPECT_EQ(full.args.parallel.context_parallel_kv_cache_policy, "full");
  EXPECT_EQ(message("--context-parallel-size 4 --context-parallel-kv-cache-policy half --cp-window-size 2 "
                    "--context-parallel-cache-interval 7", 4),
            "ok");
  EXPECT_EQ(message("--context-parallel-size 4 --context-parallel-algo hybrid_cp_algo --ulysses-degree-in-cp 2 "
                    "--context-parallel-kv-cache-policy full", 4),
            "ok");
  const std::string needs = "ring attention (--context-parallel-size > 1 with megatron_cp_algo and --cp-comm-type "
                            "p2p, or hybrid_cp_algo), found ";
  EXPECT_EQ(message("--context-parallel-kv-cache-policy full", 1),
            "--context-parallel-kv-cache-policy full keeps the key/value blocks of " + needs +
                "--context-parallel-size 1");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-algo ulysses_cp_algo "
                    "--context-parallel-kv-cache-policy half", 2),
            "--context-parallel-kv-cache-policy half keeps the key/value blocks of " + needs +
                "--context-parallel-algo ulysses_cp_algo");
  EXPECT_EQ(message("--context-parallel-size 2 --cp-comm-type allgather --context-parallel-kv-cache-policy half", 2),
            "--context-parallel-kv-cache-policy half keeps the key/value blocks of " + needs +
                "--cp-comm-type allgather");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-cache-interval 1", 2),
            "--context-parallel-cache-interval 1 needs --context-parallel-kv-cache-policy full or half, found none");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-kv-cache-policy full "
                    "--context-parallel-cache-interval -1", 2),
            "--context-parallel-cache-interval: expected a non-negative integer, found -1");
  EXPECT_EQ(message("--context-parallel-size 2 --context-parallel-kv-cache-policy full "
                    "--context-parallel-cache-interval 8", 2),
            "--context-parallel-cache-interval 8: expected less than --num-layers 8");
}

// The layers each interval caches (MindSpeed's 1-based layer_number % (k + 1) == 1).
TEST(ParallelArgs, CacheIntervalPicksLayers) {
  std::vector<int64_t> cached;
  for (int64_t layer = 0; layer < 8; ++layer)
    if (ring_kv_cache_of_layer(RingKvCache::kHalf, 2, layer) == RingKvCache::kHalf) cached.push_back(layer);
  EXPECT_EQ(cached, (std::vector<int64_t>{0, 3, 6}));
  for (int64_t layer = 0; layer < 8; ++layer)
    EXPECT_EQ(ring_kv_cache_of_layer(RingKvCache::kFull, 0, layer), RingKvCache::kFull) << layer;
  EXPECT_EQ(ring_kv_cache_of_layer(RingKvCache::kNone, 0, 0), RingKvCache::kNone);
}

}  // namespace
}  // namespace gale

namespace gale {
namespace {

// MindSpeed's --tp-2d: the grid must be the TP size, the model must split on both axes, and what
// Gale's 2-D path does not support is refused.
TEST(ParallelArgs, Tp2dGridAndRules) {
  const std::string g22 = "--tensor-model-parallel-size 4 --tp-2d --tp-x 2 --tp-y 2 ";
  EXPECT_EQ(message(g22, 4), "ok");
  EXPECT_EQ(message(g22 + "--group-query-attention --num-query-groups 4 --swiglu --normalization RMSNorm", 8), "ok");
  EXPECT_EQ(message("--tensor-model-parallel-size 4 --tp-2d --tp-x 2 --tp-y 1", 4),
            "--tp-2d: --tp-x 2 x --tp-y 1 must equal --tensor-model-parallel-size 4, found 2");
  EXPECT_EQ(message("--tensor-model-parallel-size 2 --tp-2d --tp-x 0 --tp-y 2", 2),
            "--tp-2d: --tp-x and --tp-y must be positive, found 0 and 2");
  EXPECT_EQ(message("--tensor-model-parallel-size 2 --tp-x 2", 2), "--tp-x 2 / --tp-y 1 apply only with --tp-2d");
  EXPECT_EQ(message(g22 + "--group-query-attention --num-query-groups 2", 4),
            "--tp-2d: --num-query-groups 2 must be divisible by --tp-x x --tp-y = 4 (whole query groups over X, then "
            "over Y for attention)");
  EXPECT_EQ(message("--tensor-model-parallel-size 4 --tp-2d --tp-x 4 --tp-y 1 --ffn-hidden-size 102", 4),
            "--tp-2d: --ffn-hidden-size 102 must be divisible by --tp-x 4");
  EXPECT_EQ(message("--tensor-model-parallel-size 4 --tp-2d --tp-x 4 --tp-y 1 --seq-length 30 "
                    "--max-position-embeddings 30", 4),
            "--tp-2d: --seq-length 30 must be divisible by --tp-x 4 and --tp-y 1 (the rows are split by whole "
            "positions on both axes)");
  EXPECT_EQ(message("--tensor-model-parallel-size 4 --tp-2d --tp-x 1 --tp-y 4 --kv-channels 8 --hidden-size 66", 4),
            "--tp-2d: --hidden-size 66 must be divisible by --tp-y 4");
}

TEST(ParallelArgs, Tp2dRefusesWhatItDoesNotSupport) {
  const std::string g22 = "--tensor-model-parallel-size 4 --tp-2d --tp-x 2 --tp-y 2 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--sequence-parallel", "--sequence-parallel (2-D TP splits the sequence itself; as MindSpeed)"},
      {"--num-experts 4 --moe-router-topk 2", "--num-experts (MoE; as MindSpeed)"},
      {"--multi-latent-attention", "--multi-latent-attention"},
      {"--lora-target-modules linear_qkv", "--lora-target-modules (LoRA)"},
      {"--unaligned-linear", "--unaligned-linear"},
      {"--mtp-num-layers 1", "--mtp-num-layers"},
      {"--embed-layernorm", "--embed-layernorm"},
      {"--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
       "--distribute-saved-activations",
       "--distribute-saved-activations"},
      {"--recompute-granularity selective --recompute-modules layernorm", "--recompute-modules layernorm"},
      {"--optimizer muon", "--optimizer muon"},
      {"--variable-seq-lengths", "--variable-seq-lengths"},
  };
  for (const auto& [extra, what] : cases)
    EXPECT_EQ(message(g22 + extra, 4), "--tp-2d does not support " + what) << extra;
  EXPECT_EQ(message(g22 + "--context-parallel-size 2", 8), "ok");
  EXPECT_EQ(message(g22 + "--context-parallel-size 4 --context-parallel-algo hybrid_cp_algo --ulysses-degree-in-cp 2", 16),
            "--tp-2d does not support --context-parallel-algo hybrid_cp_algo (as MindSpeed: megatron_cp_algo or "
            "ulysses_cp_algo)");
  EXPECT_EQ(message("--tensor-model-parallel-size 4 --tp-2d --tp-x 4 --tp-y 1 --seq-length 20 "
                    "--max-position-embeddings 20 --context-parallel-size 2", 8),
            "--tp-2d: --seq-length 20 / --context-parallel-size 2 must be divisible by --tp-x 4 and --tp-y 1 (the rows "
            "are split by whole positions on both axes)");
  EXPECT_EQ(message(g22 + "--pipeline-model-parallel-size 2 --num-layers 8 --schedules-method dualpipev "
                          "--global-batch-size 8",
                    8),
            "--tp-2d does not support --schedules-method dualpipev (as MindSpeed's DualPipeV)");
}

}  // namespace
}  // namespace gale
