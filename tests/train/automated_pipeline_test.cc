// --automated-pipeline's search on synthetic profiles (hand-checked optima), its 1F1B simulation and
// memory model, and the policy file (train/automated_pipeline.h).
#include "train/automated_pipeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace gale {
namespace {

// L identical layers on P stages, M micro-batches: forward f, backward b seconds; each layer's
// forward keeps `kept` bytes of which `input` is its input; no static bytes, free embedding and head.
PipelineProfile uniform_profile(int64_t L, int64_t P, int64_t M, double f, double b, int64_t kept, int64_t input) {
  PipelineProfile p;
  p.num_layers = L;
  p.pipeline_size = P;
  p.num_microbatches = M;
  for (int64_t s = 0; s < P; ++s) p.profiled_split.push_back(L / P + (s >= P - L % P ? 1 : 0));
  p.layer_forward_s.assign(static_cast<size_t>(L), f);
  p.layer_backward_s.assign(static_cast<size_t>(L), b);
  p.layer_kept_bytes.assign(static_cast<size_t>(L), kept);
  p.layer_input_bytes.assign(static_cast<size_t>(L), input);
  p.layer_static_bytes.assign(static_cast<size_t>(L), 0);
  p.measured_peak_bytes.assign(static_cast<size_t>(P), 0);
  return p;
}

TEST(AutomatedPipelineSimulation, BalancedStagesTakeMPlusPMinusOneSlots) {
  // Equal stages: (M + P − 1) × (f + b), the 1F1B textbook figure.
  EXPECT_DOUBLE_EQ(simulate_one_f_one_b({1, 1}, {2, 2}, 8), 9 * 3.0);
  EXPECT_DOUBLE_EQ(simulate_one_f_one_b({1, 1, 1, 1}, {2, 2, 2, 2}, 8), 11 * 3.0);
  EXPECT_DOUBLE_EQ(simulate_one_f_one_b({6, 6}, {12, 12}, 8), 162.0);
}

TEST(AutomatedPipelineSimulation, UnbalancedStagesHandTrace) {
  // P = 2, M = 2, stage 0: F 1, B 2; stage 1: F 3, B 6. Rank 0 runs F0 F1 B0 B1, rank 1 F0 B0 F1 B1:
  // F0@0 [0,1], F1@0 [1,2]; F0@1 [1,4], B0@1 [4,10], F1@1 [10,13], B1@1 [13,19]; B0@0 [10,12], B1@0 [19,21].
  EXPECT_DOUBLE_EQ(simulate_one_f_one_b({1, 3}, {2, 6}, 2), 21.0);
}

TEST(AutomatedPipelineMemory, StageModelHandCheck) {
  PipelineProfile p = uniform_profile(4, 2, 8, 1, 2, 100, 10);
  p.layer_static_bytes = {1000, 1000, 1000, 1000};
  p.embedding_static_bytes = 5000;
  p.embedding_kept_bytes = 7;
  p.head_static_bytes = 3000;
  p.head_kept_bytes = 50;
  // Stage 0, layers 0-2, the first recomputed: 3 static layers + embedding, 2 micro-batches in
  // flight of (10 + 100 + 100 + 7), plus one layer's rematerialised 90.
  EXPECT_EQ(stage_memory_bytes(p, 0, 0, 3, 1), 3000 + 5000 + 2 * 217 + 90);
  // The last stage, layer 3 without recomputation: 1 in flight of (100 + 50).
  EXPECT_EQ(stage_memory_bytes(p, 1, 3, 1, 0), 1000 + 3000 + 150);
  // Fewer micro-batches than stages: at most M in flight.
  p.num_microbatches = 1;
  EXPECT_EQ(stage_memory_bytes(p, 0, 0, 2, 0), 2000 + 5000 + 207);
}

TEST(AutomatedPipelineSearch, HeavyHeadMovesLayersOffTheLastStage) {
  // 8 layers (F 1, B 2) on 2 stages, 8 micro-batches; the head costs F 4, B 8; memory free (limit 0
  // and every stage 0 bytes). Stage times balance at 6 layers + nothing vs 2 layers + the head:
  // F 6 / B 12 on both, so the step is (8 + 1) × 18 = 162; the even 4,4 split takes 204.
  PipelineProfile p = uniform_profile(8, 2, 8, 1, 2, 0, 0);
  p.head_forward_s = 4;
  p.head_backward_s = 8;
  const PipelinePolicy policy = search_pipeline_policy(p, 0.2);
  EXPECT_EQ(policy.num_layer_list, (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(policy.recompute_module_list, (std::vector<int64_t>{0, 0}));
  EXPECT_DOUBLE_EQ(policy.step_seconds, 162.0);
  EXPECT_TRUE(policy.feasible);
  EXPECT_EQ(policy.candidates, 7);  // 1..7 layers on stage 0
  EXPECT_DOUBLE_EQ(simulate_one_f_one_b({4, 8}, {8, 16}, 8), 204.0);
  EXPECT_DOUBLE_EQ(policy.even_step_seconds, 204.0);
}

TEST(AutomatedPipelineSearch, MemoryLimitForcesRecompute) {
  // 2 layers on 2 stages (one split: 1,1), 4 micro-batches; a layer keeps 100 bytes, 10 of them its
  // input. Even split: stage 0 holds 2 micro-batches (200), stage 1 one (100). --save-memory-ratio
  // 0.4: limit 120, so stage 0 recomputes its layer (2 × 10 + 90 rematerialised = 110) and stage 1
  // does not (100). Its backward then reruns the forward: F 1/1, B 3/2.
  const PipelineProfile p = uniform_profile(2, 2, 4, 1, 2, 100, 10);
  const PipelinePolicy policy = search_pipeline_policy(p, 0.4);
  EXPECT_EQ(policy.num_layer_list, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(policy.recompute_module_list, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(policy.memory_limit_bytes, 120);
  EXPECT_EQ(policy.even_stage_bytes, (std::vector<int64_t>{200, 100}));
  EXPECT_EQ(policy.stage_bytes, (std::vector<int64_t>{110, 100}));
  EXPECT_TRUE(policy.feasible);
  EXPECT_DOUBLE_EQ(policy.step_seconds, simulate_one_f_one_b({1, 1}, {3, 2}, 4));
  // Without a saving nothing recomputes.
  EXPECT_EQ(search_pipeline_policy(p, 0.0).recompute_module_list, (std::vector<int64_t>{0, 0}));
}

TEST(AutomatedPipelineSearch, RecomputeOrMoveLayersWhicheverIsFaster) {
  // 4 layers (F 1, B 2, keeping 100 bytes of which 10 input) on 2 stages, 4 micro-batches. Even
  // split: stage 0 400, stage 1 200; ratio 0.25: limit 300. The candidates that fit:
  //   3,1: stage 0 must recompute all 3 (2 × 30 + 90 = 150): F 3/1, B 9/2 -> 48
  //   2,2: stage 0 recomputes both (2 × 20 + 90 = 130; one gives 310): F 2/2, B 6/4 -> 36
  //   1,3: no recomputation (200 and 300): F 1/3, B 2/6 -> 39
  // so 2,2 recomputing stage 0's two layers wins over moving a layer to the last stage.
  const PipelineProfile p = uniform_profile(4, 2, 4, 1, 2, 100, 10);
  EXPECT_DOUBLE_EQ(simulate_one_f_one_b({3, 1}, {9, 2}, 4), 48.0);
  EXPECT_DOUBLE_EQ(simulate_one_f_one_b({2, 2}, {6, 4}, 4), 36.0);
  EXPECT_DOUBLE_EQ(simulate_one_f_one_b({1, 3}, {2, 6}, 4), 39.0);
  const PipelinePolicy policy = search_pipeline_policy(p, 0.25);
  EXPECT_EQ(policy.memory_limit_bytes, 300);
  EXPECT_EQ(policy.num_layer_list, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(policy.recompute_module_list, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(policy.stage_bytes, (std::vector<int64_t>{130, 200}));
  EXPECT_DOUBLE_EQ(policy.step_seconds, 36.0);
  EXPECT_EQ(policy.candidates, 3);
}

TEST(AutomatedPipelineSearch, NothingFitsTakesTheLeastMemory) {
  // As MemoryLimitForcesRecompute with ratio 0.6 (limit 80): even recomputing everything leaves
  // 110 and 100 bytes; MindSpeed's fallback, the split with the smallest largest stage, all recomputed.
  const PipelinePolicy policy = search_pipeline_policy(uniform_profile(2, 2, 4, 1, 2, 100, 10), 0.6);
  EXPECT_FALSE(policy.feasible);
  EXPECT_EQ(policy.num_layer_list, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(policy.recompute_module_list, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(policy.stage_bytes, (std::vector<int64_t>{110, 100}));
}

TEST(AutomatedPipelineSearch, ManySplitsUseMindSpeedsWindowAndAreDeterministic) {
  // 40 layers on 8 stages: C(39, 7) > kMaxFullSearch splits, so stages hold 5 ± 1 layers
  // (MindSpeed's window for 5-7 layers per stage): Σ_k C(8,k)·C(8−k,k) = 1107 splits.
  PipelineProfile p = uniform_profile(40, 8, 16, 1, 2, 100, 10);
  p.head_forward_s = 2;
  p.head_backward_s = 4;
  const PipelinePolicy a = search_pipeline_policy(p, 0.0);
  EXPECT_EQ(a.candidates, 1107);
  EXPECT_EQ(a.num_layer_list.back(), 4);  // the head's stage gets fewer layers
  const PipelinePolicy b = search_pipeline_policy(p, 0.0);
  EXPECT_EQ(a.num_layer_list, b.num_layer_list);
  EXPECT_EQ(a.recompute_module_list, b.recompute_module_list);
  EXPECT_EQ(a.step_seconds, b.step_seconds);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("gale_autopipe_" + std::to_string(getpid()) + "_" + name)).string();
}

TEST(AutomatedPipelinePolicyFile, AppendsFindsByKeyAndRefusesOtherFiles) {
  const std::string path = temp_path("policy.json");
  std::filesystem::remove(path);
  Arguments args;
  args.model.num_layers = 4;
  args.model.hidden_size = 64;
  args.model.seq_length = 32;
  args.parallel.pipeline_model_parallel_size = 2;
  const nlohmann::json key = automated_pipeline_key(args);
  const PipelineProfile profile = uniform_profile(4, 2, 4, 1, 2, 100, 10);
  const PipelinePolicy policy = search_pipeline_policy(profile, 0.25);

  StatusOr<std::optional<PipelinePolicy>> none = find_pipeline_policy(path, key);
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_FALSE(none.value().has_value());  // no file yet

  ASSERT_TRUE(append_pipeline_policy(path, key, policy, profile).ok());
  Arguments other_args = args;
  other_args.parallel.save_memory_ratio = 0.3;
  const nlohmann::json other = automated_pipeline_key(other_args);
  PipelinePolicy other_policy = policy;
  other_policy.num_layer_list = {1, 3};
  other_policy.recompute_module_list = {0, 0};
  ASSERT_TRUE(append_pipeline_policy(path, other, other_policy, profile).ok());

  StatusOr<std::optional<PipelinePolicy>> found = find_pipeline_policy(path, key);
  ASSERT_TRUE(found.ok()) << found.status().message();
  ASSERT_TRUE(found.value().has_value());
  EXPECT_EQ(found.value()->num_layer_list, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(found.value()->recompute_module_list, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(found.value()->stage_bytes, policy.stage_bytes);
  StatusOr<std::optional<PipelinePolicy>> found2 = find_pipeline_policy(path, other);
  ASSERT_TRUE(found2.ok());
  ASSERT_TRUE(found2.value().has_value());
  EXPECT_EQ(found2.value()->num_layer_list, (std::vector<int64_t>{1, 3}));
  Arguments third = args;
  third.model.num_layers = 6;
  EXPECT_FALSE(find_pipeline_policy(path, automated_pipeline_key(third)).value().has_value());

  // The file: magic, version and the entries.
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["format"], "gale-automated-pipeline");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["policies"].size(), 2u);
  EXPECT_EQ(j["policies"][0]["recompute_type"], 2);
  EXPECT_EQ(j["policies"][0]["profile"]["layer_kept_bytes"].size(), 4u);

  auto write = [&](const std::string& text) {
    std::ofstream out(path, std::ios::trunc);
    out << text;
  };
  write(R"({"format": "something-else", "version": 1, "policies": []})");
  Status s = find_pipeline_policy(path, key).status();
  EXPECT_NE(s.message().find("expected \"format\": \"gale-automated-pipeline\""), std::string::npos) << s.message();
  write(R"({"format": "gale-automated-pipeline", "version": 7, "policies": []})");
  s = find_pipeline_policy(path, key).status();
  EXPECT_NE(s.message().find("expected \"version\": 1, found 7"), std::string::npos) << s.message();
  write("not json");
  EXPECT_FALSE(find_pipeline_policy(path, key).ok());
  EXPECT_FALSE(append_pipeline_policy(path, key, policy, profile).ok());  // never overwrites another file
  nlohmann::json bad = j;
  bad["policies"][0]["num_layer_list"] = {3, 3};  // 6 layers of 4
  write(bad.dump());
  s = find_pipeline_policy(path, key).status();
  EXPECT_NE(s.message().find("summing to 4"), std::string::npos) << s.message();
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace gale
