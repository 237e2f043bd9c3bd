// Checkpoint resharding across layouts (4 ranks): a checkpoint saved at TP2·PP2 after 3 iterations
// resumes at TP1·PP4, at DP4 (4 ranks of TP1·PP1) and at interleaved PP2·VPP2·DP2, and iterations
// 4–6 give the losses and gradient norms of an uninterrupted run within 1e-5 relative; the final
// parameters match too. Each rank runs the uninterrupted single-process reference itself. The
// same for a checkpoint of the partial distributed optimizer (--num-distributed-optimizer-instances),
// for one saved with an explicit split (--num-layer-list), resumed at other splits, and for one
// saved under DualPipeV (--schedules-method dualpipev), resumed at plain PP and back.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <unistd.h>

#include "mpi_test_env.h"
#include "testing_run.h"
#include "checkpoint_checks.h"
#include "ckpt/checkpoint_reader.h"
#include "train/checkpointing.h"
#include "train/engine.h"
#include "train/trainer.h"

namespace gale {
namespace {

constexpr int64_t kVocab = testing::kTinyVocab;

const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "6", "--lr", "2e-3",
    "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
    "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
    "--clip-grad", "0.5"};
const std::vector<std::string>& kGpt = testing::kTinyGpt;
const std::vector<std::string>& kLlama = testing::kTinyLlama;

struct TrainingRun : testing::TestRun {
  TrainingRun(const std::vector<std::string>& model, const std::vector<std::string>& flags, const Comm& world)
      : TestRun(testing::join({kCommon, model, flags}), world, kVocab) {}
};

// A directory every rank agrees on, removed by rank 0 at the end.
std::string shared_temp_dir(const Comm& world, const std::string& name) {
  return testing::shared_temp_dir(world, "reshard_" + name);
}

double max_relative_param_error(const Engine& run, const Engine& reference) {
  const ParamBuffer& ref = reference.chunks[0]->params();
  double worst = 0.0;
  for (const auto& chunk : run.chunks) {
    const ParamBuffer& pb = chunk->params();
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      const int rid = ref.find(s.name);
      GALE_CHECK_GE(rid, 0) << s.name;
      double diff = 0.0, norm = 0.0;
      for (int64_t i = 0; i < s.local_numel(); ++i) {
        const double r = ref.param_data(rid)[s.global_index(i)];
        diff += (pb.param_data(id)[i] - r) * (pb.param_data(id)[i] - r);
        norm += r * r;
      }
      worst = std::max(worst, norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff));
    }
  }
  return worst;
}

using Targets = std::vector<std::pair<std::string, std::vector<std::string>>>;

// Trains 3 iterations of `model` with `flags` on `world`, checks them against `whole` and saves
// to `dir`.
void train_and_save(const std::vector<std::string>& model, std::vector<std::string> flags, const Comm& world,
                    const TrainingRun& whole, const std::string& dir) {
  flags.insert(flags.end(), {"--save", dir, "--save-interval", "3"});
  TrainingRun first(model, flags, world);
  first.train(3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(first.losses[i], whole.losses[i], 1e-5 * whole.losses[i]) << i;
  ASSERT_TRUE(save_checkpoint(first.args, *first.engine, first.trainer->state()).ok());
}

// Resumes the checkpoint in `dir` at each target layout: iteration 3 and its consumed samples,
// then iterations 4–6 and the final parameters as in the uninterrupted `whole`.
void expect_resumes_like_whole(const std::vector<std::string>& model, const Targets& targets, const Comm& world,
                               const TrainingRun& whole, const std::string& dir) {
  for (const auto& [name, flags] : targets) {
    SCOPED_TRACE(name);
    std::vector<std::string> load_flags = flags;
    load_flags.insert(load_flags.end(), {"--load", dir});
    TrainingRun resumed(model, load_flags, world);
    bool loaded = false;
    Status st = load_checkpoint(resumed.args, *resumed.engine, resumed.trainer->state(), &loaded);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(loaded);
    EXPECT_EQ(resumed.trainer->state().iteration, 3);
    EXPECT_EQ(resumed.trainer->state().consumed_train_samples, 24);
    resumed.train(3);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(resumed.losses[i], whole.losses[3 + i], 1e-5 * whole.losses[3 + i]) << "loss of iteration " << 4 + i;
      EXPECT_NEAR(resumed.grad_norms[i], whole.grad_norms[3 + i], 1e-5 * whole.grad_norms[3 + i])
          << "grad norm of iteration " << 4 + i;
    }
    // AdamW turns rounding in near-zero gradients into ±lr steps (see invariance_mpi_test.cc).
    EXPECT_LT(max_relative_param_error(*resumed.engine, *whole.engine), 1e-3);
  }
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

// Loads the checkpoint in `dir` at `flags` (no training) and checks that every parameter this rank
// holds equals the checkpoint's, bit for bit; returns the run for further checks.
std::unique_ptr<TrainingRun> load_bit_for_bit(const std::vector<std::string>& model, std::vector<std::string> flags,
                                              const Comm& world, const std::string& dir) {
  flags.insert(flags.end(), {"--load", dir});
  auto resumed = std::make_unique<TrainingRun>(model, flags, world);
  bool loaded = false;
  Status st = load_checkpoint(resumed->args, *resumed->engine, resumed->trainer->state(), &loaded);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(loaded);
  testing::expect_params_equal_checkpoint(*resumed->engine, dir);
  return resumed;
}

class Reshard : public ::testing::TestWithParam<bool> {};

TEST_P(Reshard, SavedAtTp2Pp2ResumesAtOtherLayouts) {
  Comm world = test::world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const bool llama = GetParam();
  const auto& model = llama ? kLlama : kGpt;
  TrainingRun whole(model, {}, make_self_communicator("world"));
  whole.train(6);
  const std::string dir = shared_temp_dir(world, llama ? "llama" : "gpt");
  train_and_save(model, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}, world, whole,
                 dir);
  expect_resumes_like_whole(
      model,
      {{"TP1·PP4", {"--pipeline-model-parallel-size", "4"}},
       {"DP4", {}},
       {"PP2·VPP2·DP2", {"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"}},
       {"TP2·PP2 (same layout)", {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}}},
      world, whole, dir);
}

// The hybrid Mamba model ("M*-M", 8 heads in 4 groups): in_proj's z|x|B|C|dt parts, conv1d's x|B|C,
// the heads' A_log, D and dt_bias, the gated norm's weight and out_proj are stored as global tensors
// (each TP rank writes its share of every part), so a checkpoint saved at TP2·DP2 with SP loads bit
// for bit at TP1 (DP4), TP4 and TP2·PP2 and resumes there like the uninterrupted run; one saved at
// TP1 (DP4) resumes at TP2·PP2 and TP4 the same way.
TEST(ReshardHybrid, SavedAtOneTpSizeResumesAtOthers) {
  Comm world = test::world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::vector<std::string> model = {
      "--num-attention-heads", "8", "--is-hybrid-model", "--hybrid-override-pattern", "M*-M", "--mamba-state-dim", "8",
      "--mamba-head-dim", "16", "--mamba-num-groups", "4", "--normalization", "RMSNorm", "--position-embedding-type",
      "rope"};
  TrainingRun whole(model, {}, make_self_communicator("world"));
  whole.train(6);
  const Targets from_tp2 = {
      {"TP1·DP4", {}},
      {"TP4·SP", {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      {"TP2·PP2", {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}}};
  const std::string dir = shared_temp_dir(world, "hybrid_tp2");
  train_and_save(model, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, world, whole, dir);
  for (const auto& [name, flags] : from_tp2) {
    SCOPED_TRACE(name);
    load_bit_for_bit(model, flags, world, dir);
  }
  expect_resumes_like_whole(model, from_tp2, world, whole, dir);
  const std::string dir1 = shared_temp_dir(world, "hybrid_tp1");
  train_and_save(model, {}, world, whole, dir1);
  expect_resumes_like_whole(model, {from_tp2[1], from_tp2[2]}, world, whole, dir1);
}

// Megatron's partial distributed optimizer: saved at DP4 with two instances of two ranks (only
// the first instance writes the optimizer state; the second holds a copy), resumed with one
// instance of four, with four instances of one and without the distributed optimizer.
TEST(ReshardDistOptInstances, SavedWithTwoInstancesResumesWithOtherCounts) {
  Comm world = test::world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  TrainingRun whole(kGpt, {}, make_self_communicator("world"));
  whole.train(6);
  const std::string dir = shared_temp_dir(world, "distopt_instances");
  train_and_save(kGpt, {"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"}, world, whole,
                 dir);
  {  // DP rank 0 writes the parameters; only the first instance (world ranks 0 and 1) the state.
    StatusOr<CheckpointReader> reader = CheckpointReader::open(dir);
    ASSERT_TRUE(reader.ok()) << reader.status().to_string();
    std::vector<int> writers;
    for (const auto& shard : reader->metadata().at("shards")) writers.push_back(shard.at("rank").get<int>());
    EXPECT_EQ(writers, (std::vector<int>{0, 1}));
  }
  expect_resumes_like_whole(
      kGpt,
      {{"one instance", {"--use-distributed-optimizer"}},
       {"four instances", {"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "4"}},
       {"two instances", {"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"}},
       {"no distributed optimizer", {}}},
      world, whole, dir);
}

// MindSpeed-LLM's --num-layer-list / MindSpeed's --pipeline-num-transformer-layers: a checkpoint
// saved at PP2·DP2 with stages of 1 and 3 layers loads bit for bit at PP1 (DP4), at PP2 with 3 and
// 1 layers, at PP4 with an empty stage and at PP2·VPP2 with uneven virtual stages, and training
// resumes like the uninterrupted run.
TEST(ReshardExplicitSplit, SavedWithNumLayerListResumesAtOtherSplits) {
  Comm world = test::world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  TrainingRun whole(kGpt, {}, make_self_communicator("world"));
  whole.train(6);
  const std::string dir = shared_temp_dir(world, "num_layer_list");
  train_and_save(kGpt, {"--pipeline-model-parallel-size", "2", "--num-layer-list", "1,3"}, world, whole, dir);
  const Targets targets = {
      {"PP1·DP4", {}},
      {"PP2·DP2 3,1", {"--pipeline-model-parallel-size", "2", "--num-layer-list", "3,1"}},
      {"PP4 [[2],[0],[1],[1]]", {"--pipeline-model-parallel-size", "4", "--pipeline-num-transformer-layers",
                                 "[[2],[0],[1],[1]]"}},
      {"PP2·VPP2·DP2 [[1,2],[1,0]]", {"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
                                      "2", "--pipeline-num-transformer-layers", "[[1,2],[1,0]]"}}};
  for (const auto& [name, flags] : targets) {  // the loaded parameters, before any training
    SCOPED_TRACE(name);
    const std::unique_ptr<TrainingRun> resumed = load_bit_for_bit(kGpt, flags, world, dir);
    if (name == "PP2·DP2 3,1") {  // the list reaches the engine: layers 0-2 on the first stage, 3 on the second
      const ModelPartition& part = resumed->engine->chunks[0]->partition();
      using Range = std::pair<int64_t, int64_t>;
      EXPECT_EQ((Range{part.first_layer, part.num_layers}), part.pre_process ? (Range{0, 3}) : (Range{3, 1}));
    }
  }
  expect_resumes_like_whole(kGpt, targets, world, whole, dir);
}

// DualPipeV's V placement (rank r: layer chunks r and 2PP−1−r, rank 0 the embedding and the loss):
// a checkpoint saved at TP2·PP2 under DualPipeV loads bit for bit at plain PP2·DP2, at PP1·DP4 and
// under DualPipeV again, and training resumes like the uninterrupted run; a plain TP2·PP2
// checkpoint loads bit for bit under DualPipeV.
TEST(ReshardDualPipeV, SavedUnderDualPipeVResumesAtPlainPipelineAndBack) {
  Comm world = test::world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  TrainingRun whole(kGpt, {}, make_self_communicator("world"));
  whole.train(6);
  const std::vector<std::string> v = {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                      "--schedules-method", "dualpipev"};
  const std::string dir = shared_temp_dir(world, "dualpipev");
  train_and_save(kGpt, v, world, whole, dir);
  const Targets targets = {{"PP2·DP2", {"--pipeline-model-parallel-size", "2"}},
                           {"PP1·DP4", {}},
                           {"TP2·PP2 dualpipev (same layout)", v}};
  for (const auto& [name, flags] : targets) {  // the loaded parameters, before any training
    SCOPED_TRACE(name);
    load_bit_for_bit(kGpt, flags, world, dir);
  }
  expect_resumes_like_whole(kGpt, targets, world, whole, dir);
  // And the other way: a plain TP2·PP2 checkpoint under DualPipeV.
  const std::string plain = shared_temp_dir(world, "dualpipev_from_plain");
  train_and_save(kGpt, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}, world, whole,
                 plain);
  {
    const std::unique_ptr<TrainingRun> resumed = load_bit_for_bit(kGpt, v, world, plain);
    // The V reached the engine: rank 0 holds layers 0 and 3, rank 1 layers 1 and 2.
    using Range = std::pair<int64_t, int64_t>;
    const bool first = resumed->engine->ps.coords().pp == 0;
    const ModelPartition& c0 = resumed->engine->chunks[0]->partition();
    const ModelPartition& c1 = resumed->engine->chunks[1]->partition();
    EXPECT_EQ((Range{c0.first_layer, c0.num_layers}), first ? (Range{0, 1}) : (Range{1, 1}));
    EXPECT_EQ((Range{c1.first_layer, c1.num_layers}), first ? (Range{3, 1}) : (Range{2, 1}));
  }
  expect_resumes_like_whole(kGpt, {{"TP2·PP2 dualpipev from plain", v}}, world, whole, plain);
}

INSTANTIATE_TEST_SUITE_P(Models, Reshard, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "llama" : "gpt"; });

}  // namespace
}  // namespace gale
