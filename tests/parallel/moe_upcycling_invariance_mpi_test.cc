// Granular upcycling at other layouts (2 ranks: EP2, TP2·SP; 4 ranks: TP2·EP2): the upcycled
// parameters each rank holds are the single-process upcycled model's bit for bit, and the first
// iterations give its losses (1e-5 relative). Rank 0 saves the single-process dense checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include "checkpoint_checks.h"
#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/checkpointing.h"
#include "train/engine.h"
#include "train/trainer.h"

namespace gale {
namespace {

const std::vector<std::string> kCommon = {
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "6",
    "--lr", "3e-3", "--lr-warmup-iters", "1", "--mock-data", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--eval-iters", "0", "--log-interval", "1000", "--make-vocab-size-divisible-by", "32"};

struct TrainingRun : testing::TestRun {
  TrainingRun(const std::vector<std::string>& flags, const Comm& world) : TestRun(testing::join({kCommon, flags}), world, 60) {}
};

// Every local element of `run`'s parameters equals the single-process `ref`'s at its global index.
int64_t mismatches(const TrainingRun& run, const TrainingRun& ref) {
  const ParamBuffer& pb = run.engine->chunks[0]->params();
  const ParamBuffer& rb = ref.engine->chunks[0]->params();
  int64_t bad = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    const int rid = rb.find(s.whole_model_name());
    if (rid < 0) {
      ADD_FAILURE() << "no " << s.whole_model_name() << " in the single-process model";
      continue;
    }
    int64_t here = 0;
    for (int64_t i = 0; i < s.local_numel(); ++i) here += pb.param_data(id)[i] != rb.param_data(rid)[s.global_index(i)];
    if (here > 0) ADD_FAILURE() << s.whole_model_name() << ": " << here << " of " << s.local_numel() << " differ";
    bad += here;
  }
  return bad;
}

struct Model {
  std::string name;
  std::vector<std::string> flags;  // the MoE model's, without --moe-use-upcycling
  std::vector<std::string> dense;  // the dense model's
};

TEST(MoeUpcyclingInvariance, LayoutsUpcycleTheSingleProcessModel) {
  Comm world = test::world();
  const Comm self = make_self_communicator("self");
  std::vector<std::pair<std::string, std::vector<std::string>>> layouts;
  if (world->size() == 2) {
    layouts = {{"EP2", {"--expert-model-parallel-size", "2"}},
               {"TP2·SP", {"--tensor-model-parallel-size", "2", "--sequence-parallel"}}};
  } else if (world->size() == 4) {
    layouts = {{"TP2·SP·EP2", {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                               "--expert-model-parallel-size", "2"}}};
  } else {
    GTEST_SKIP() << "needs 2 or 4 ranks";
  }
  const std::vector<Model> models = {
      {"swiglu_g2",
       {"--swiglu", "--ffn-hidden-size", "32", "--num-experts", "4", "--moe-router-topk", "2",
        "--moe-upcycling-granularity", "2"},
       {"--swiglu", "--ffn-hidden-size", "64"}},
      {"gelu_g4",
       {"--ffn-hidden-size", "16", "--num-experts", "8", "--moe-router-topk", "4", "--moe-upcycling-granularity", "4"},
       {"--ffn-hidden-size", "64"}},
  };
  for (const Model& m : models) {
    SCOPED_TRACE(m.name);
    const std::string dense_dir = testing::shared_temp_dir(world, "upcycle_inv_dense_" + m.name);
    if (world->rank() == 0) {
      TrainingRun dense(testing::join({m.dense, {"--save", dense_dir, "--save-interval", "3"}}), self);
      dense.train(2);
      ASSERT_TRUE(save_checkpoint(dense.args, *dense.engine, dense.trainer->state()).ok());
    }
    world->barrier();
    // Each rank upcycles the single-process reference itself, into its own --save.
    const std::string ref_dir = (std::filesystem::temp_directory_path() /
                                 ("gale_upcycle_inv_ref_" + m.name + "_" + std::to_string(::getpid())))
                                    .string();
    std::filesystem::remove_all(ref_dir);
    // `ref` stays as upcycled (the parameters to compare); `trained` is upcycled again and trained.
    TrainingRun ref(testing::join({m.flags, {"--moe-use-upcycling", "--load", dense_dir, "--save", ref_dir, "--save-interval", "3"}}), self);
    Status st = upcycle_checkpoint(ref.args, *ref.engine, ref.trainer->state());
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::filesystem::remove_all(ref_dir);
    TrainingRun trained(testing::join({m.flags, {"--moe-use-upcycling", "--load", dense_dir, "--save", ref_dir, "--save-interval", "3"}}), self);
    st = upcycle_checkpoint(trained.args, *trained.engine, trained.trainer->state());
    ASSERT_TRUE(st.ok()) << st.to_string();
    trained.train(3);
    for (const auto& [name, flags] : layouts) {
      SCOPED_TRACE(name);
      const std::string dir = testing::shared_temp_dir(world, "upcycle_inv_" + m.name);
      TrainingRun run(testing::join({m.flags, flags, {"--moe-use-upcycling", "--load", dense_dir, "--save", dir, "--save-interval", "3"}}),
                      world);
      st = upcycle_checkpoint(run.args, *run.engine, run.trainer->state());
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(mismatches(run, ref), 0);
      const std::vector<double> losses = run.train(3);
      world->barrier();
      if (world->rank() == 0) std::filesystem::remove_all(dir);
      for (int i = 0; i < 3; ++i)
        EXPECT_NEAR(losses[i], trained.losses[i], 1e-5 * trained.losses[i]) << "iteration " << i + 1;
    }
    std::filesystem::remove_all(ref_dir);
    world->barrier();
    if (world->rank() == 0) std::filesystem::remove_all(dense_dir);
  }
}

}  // namespace
}  // namespace gale
