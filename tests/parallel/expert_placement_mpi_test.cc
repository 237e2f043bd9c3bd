// --enable-expert-placement at EP = world (2 or 4 ranks): experts migrate between the EP ranks every
// two steps (the permutation changes, asserted) and training reproduces the run without placement
// bit for bit (losses, grad norms, every expert's parameters and gradients by global expert, the
// dense parameters); a placed run's checkpoint loads into a run without placement, which then
// continues with the placed run's losses; the feature's one-line errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "features/resolved_features.h"
#include "mpi_test_env.h"
#include "testing_checkpoint_run.h"
#include "train/checkpointing.h"
#include "train/expert_placer.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

// A tiny Mixtral (layers 0, 1 and 3 MoE) with 8 experts, top-3 (with three outputs per token their
// summation order shows), the alltoall dispatcher; dropout on.
const std::vector<std::string> kMoe = testing::join(
    {{"--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
      "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "8", "--lr", "2e-3",
      "--lr-warmup-iters", "1", "--mock-data", "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1",
      "--eval-iters", "0", "--log-interval", "1000"},
     testing::kTinyLlama,
     {"--num-experts", "8", "--moe-router-topk", "3", "--moe-ffn-hidden-size", "48", "--moe-layer-freq", "[1,1,0,1]",
      "--moe-aux-loss-coeff", "0.01", "--moe-token-dispatcher-type", "alltoall"}});

const std::vector<std::string> kPlacement = {"--enable-expert-placement", "--expert-placement-freq", "2",
                                             "--print-expert-load"};

std::vector<std::string> layout(const Comm& world) {
  return {"--expert-model-parallel-size", std::to_string(world->size())};
}

std::unique_ptr<testing::CheckpointRun> make_run(const std::vector<std::string>& extra,
                                                 const std::vector<std::string>& features) {
  Comm world = test::world();
  const std::vector<std::string> flags = testing::join({kMoe, layout(world), extra});
  ResolvedFeatures r(testing::join({flags, features}));
  GALE_CHECK_OK(r.status);
  return std::make_unique<testing::CheckpointRun>(flags, world, testing::kTinyVocab, EngineOptions{0, r.recompute},
                                                  r.ops);
}

int64_t global_expert_of(const std::string& name) {
  const size_t at = name.find("local_experts.") + std::string("local_experts.").size();
  return std::stoll(name.substr(at, name.find('.', at) - at));
}

// Every expert tensor of the EP group (values or gradients) by its global name, gathered on every rank.
std::map<std::string, std::vector<float>> experts_by_global_name(const testing::TestRun& run, bool grads) {
  const ParamBuffer& pb = run.engine->chunks[0]->params();
  const Comm& ep = run.engine->ps.expert();
  std::vector<int> ids;
  std::vector<float> mine;
  std::vector<int64_t> experts;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    if (!s.expert_parallel) continue;
    ids.push_back(id);
    const float* p = grads ? pb.grad_data(id) : pb.param_data(id);
    mine.insert(mine.end(), p, p + s.local_numel());
    experts.push_back(global_expert_of(s.whole_model_name()));
  }
  const int64_t P = ep->size();
  std::vector<float> all(mine.size() * static_cast<size_t>(P));
  std::vector<int64_t> all_experts(experts.size() * static_cast<size_t>(P));
  ep->all_gather(mine.data(), all.data(), static_cast<int64_t>(mine.size()), DType::kF32);
  ep->all_gather(experts.data(), all_experts.data(), static_cast<int64_t>(experts.size()), DType::kI64);
  std::map<std::string, std::vector<float>> out;
  size_t at = 0;
  for (int64_t q = 0; q < P; ++q)
    for (size_t i = 0; i < ids.size(); ++i) {
      const ParamSpec& s = pb.spec(ids[i]);
      const std::string name = renamed_expert(s.whole_model_name(), all_experts[q * ids.size() + i]);
      out[name].assign(all.begin() + static_cast<int64_t>(at), all.begin() + static_cast<int64_t>(at + s.local_numel()));
      at += static_cast<size_t>(s.local_numel());
    }
  return out;
}

// The dense parameters' bits by name.
std::map<std::string, std::vector<float>> dense_params(const testing::TestRun& run) {
  const ParamBuffer& pb = run.engine->chunks[0]->params();
  std::map<std::string, std::vector<float>> out;
  for (int id = 0; id < pb.size(); ++id)
    if (!pb.spec(id).expert_parallel) out[pb.spec(id).name].assign(pb.param_data(id), pb.param_data(id) + pb.spec(id).local_numel());
  return out;
}

void expect_same_experts(const testing::TestRun& a, const testing::TestRun& b, const std::string& what) {
  const auto pa = experts_by_global_name(a, false), pb = experts_by_global_name(b, false);
  EXPECT_EQ(pa.size(), pb.size());
  EXPECT_TRUE(pa == pb) << what << ": expert parameters differ";
  EXPECT_TRUE(dense_params(a) == dense_params(b)) << what << ": dense parameters differ";
}

TEST(ExpertPlacementMpi, MigrationReproducesTheUnplacedRunBitwise) {
  if (test::world()->size() != 2 && test::world()->size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  auto plain = make_run({}, {});
  auto placed = make_run({}, kPlacement);
  ASSERT_NE(placed->engine->expert_placer, nullptr);
  plain->train(6);
  placed->train(6);
  EXPECT_EQ(placed->losses, plain->losses);
  EXPECT_EQ(placed->grad_norms, plain->grad_norms);
  EXPECT_EQ(placed->load_balancing_losses, plain->load_balancing_losses);
  // re-placements after steps 2, 4 and 6 in each of the 3 MoE layers; the permutation changed at
  // two steps at least, and some layer ends away from the identity
  const auto& reports = placed->engine->expert_placer->reports();
  EXPECT_EQ(reports.size(), 9u);
  std::set<int64_t> steps_migrated;
  for (const auto& r : reports)
    if (r.migrated) steps_migrated.insert(r.step);
  EXPECT_GE(steps_migrated.size(), 2u);
  bool moved = false;
  for (const auto& [layer, w] : placed->engine->expert_placer->layers(0)) moved = moved || !w->placement->identity();
  EXPECT_TRUE(moved);
  expect_same_experts(*placed, *plain, "after 6 steps");
  EXPECT_TRUE(experts_by_global_name(*placed, true) == experts_by_global_name(*plain, true)) << "expert gradients";
}

// LoRA on the experts (model/lora_expert.h): the frozen experts migrate with their adapters (values,
// gradients, Adam state), so the placed run is the unplaced one, adapters included.
TEST(ExpertPlacementMpi, MigrationCarriesTheExpertsLoraAdapters) {
  if (test::world()->size() != 2 && test::world()->size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  const std::vector<std::string> lora = {"--lora-r", "4", "--lora-alpha", "8", "--lora-target-modules", "linear_fc1",
                                         "linear_fc2"};
  auto plain = make_run(lora, {});
  auto placed = make_run(lora, kPlacement);
  ASSERT_NE(placed->engine->expert_placer, nullptr);
  plain->train(6);
  placed->train(6);
  EXPECT_EQ(placed->losses, plain->losses);
  EXPECT_EQ(placed->grad_norms, plain->grad_norms);
  int migrated = 0;
  for (const auto& r : placed->engine->expert_placer->reports()) migrated += r.migrated;
  EXPECT_GE(migrated, 2);
  const auto pa = experts_by_global_name(*placed, false), pb = experts_by_global_name(*plain, false);
  int adapters = 0;
  for (const auto& [name, values] : pa) adapters += name.find(".lora_") != std::string::npos;
  EXPECT_EQ(adapters, 3 * 8 * 2 * 2);  // 3 MoE layers x 8 experts x A, B of fc1 and fc2
  expect_same_experts(*placed, *plain, "LoRA, after 6 steps");
}

// --enable-fine-grained-expert-placement: a layer migrates only when the CV of its ranks' loads
// drops by the threshold; some layers keep their placement at 0.05, and the run stays the same.
TEST(ExpertPlacementMpi, FineGrainedMigratesOnlyWorthwhileLayers) {
  if (test::world()->size() != 2 && test::world()->size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  auto plain = make_run({}, {});
  auto placed = make_run({}, testing::join({kPlacement, {"--enable-fine-grained-expert-placement",
                                                         "--fine-grained-expert-placement-thre", "0.05"}}));
  plain->train(6);
  placed->train(6);
  EXPECT_EQ(placed->losses, plain->losses);
  int migrated = 0, kept = 0;
  for (const auto& r : placed->engine->expert_placer->reports()) {
    if (r.cv_before - r.cv_after < 0.05) EXPECT_FALSE(r.migrated) << "step " << r.step << " layer " << r.layer;
    (r.migrated ? migrated : kept) += 1;
  }
  EXPECT_GT(migrated, 0);
  EXPECT_GT(kept, 0);
  expect_same_experts(*placed, *plain, "fine-grained");
}

TEST(ExpertPlacementMpi, PlacedCheckpointLoadsIntoAnUnplacedRun) {
  Comm world = test::world();
  if (world->size() != 2 && world->size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  int64_t pid = world->rank() == 0 ? static_cast<int64_t>(::getpid()) : 0;
  pid = world->all_reduce_scalar(pid, ReduceOp::kMax);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("gale_expert_placement_" + std::to_string(pid))).string();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
  world->barrier();
  auto placed = make_run({"--save", dir, "--save-interval", "4"}, kPlacement);
  placed->train(4);
  bool moved = false;
  for (const auto& [layer, w] : placed->engine->expert_placer->layers(0)) moved = moved || !w->placement->identity();
  ASSERT_TRUE(moved) << "no layer placed away from the identity at the save";
  ASSERT_TRUE(placed->save().ok());
  world->barrier();
  for (bool with_placement : {false, true}) {
    auto resumed = make_run({"--load", dir}, with_placement ? kPlacement : std::vector<std::string>{});
    ASSERT_TRUE(resumed->load().ok());
    expect_same_experts(*resumed, *placed, with_placement ? "loaded into a placed run" : "loaded without placement");
  }
  auto resumed = make_run({"--load", dir}, {});
  ASSERT_TRUE(resumed->load().ok());
  placed->train(2);
  resumed->train(2);
  EXPECT_EQ(std::vector<double>(placed->losses.end() - 2, placed->losses.end()), resumed->losses);
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

TEST(ExpertPlacementMpi, ValidationErrors) {
  Comm world = test::world();
  const auto error = [&](const std::vector<std::string>& extra) {
    ResolvedFeatures r(testing::join({kMoe, extra}));
    return r.status.message();
  };
  EXPECT_NE(error({"--enable-expert-placement"}).find("expected --expert-model-parallel-size greater than 1, found 1"),
            std::string::npos);
  const std::vector<std::string> ep = {"--expert-model-parallel-size", "2"};
  EXPECT_NE(error(testing::join({ep, {"--enable-expert-placement", "--moe-token-dispatcher-type", "allgather"}}))
                .find("expected --moe-token-dispatcher-type alltoall, found allgather"),
            std::string::npos);
  EXPECT_NE(error(testing::join({ep, {"--enable-expert-placement", "--use-distributed-optimizer"}}))
                .find("--enable-expert-placement with --use-distributed-optimizer"),
            std::string::npos);
  EXPECT_NE(error(testing::join({ep, {"--enable-expert-placement", "--expert-placement-freq", "0"}}))
                .find("--expert-placement-freq: expected a positive integer, found 0"),
            std::string::npos);
  EXPECT_NE(error(testing::join({ep, {"--print-expert-load"}})).find("--print-expert-load needs --enable-expert-placement"),
            std::string::npos);
  EXPECT_NE(error(testing::join({ep, {"--enable-fine-grained-expert-placement"}}))
                .find("--enable-fine-grained-expert-placement needs --enable-expert-placement"),
            std::string::npos);
}

}  // namespace
}  // namespace gale
