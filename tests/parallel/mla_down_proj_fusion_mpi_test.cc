// --mla-down-proj-fusion under tensor (and sequence) parallelism reproduces the single-process run
// with the flag: losses and grad norms within 1e-5 relative, parameters 1e-3, gradients 3e-5 (as
// tests/parallel/mla_invariance_mpi_test.cc). Gale keeps the fused [q_down; kv_down] projection and
// the input norm replicated over TP (each rank its own tokens under SP, gradients summed over TP);
// Megatron splits the fused projection column-parallel, which gives the same values. The
// single-process fused run is also checked against the unfused one (same tolerances).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::TestRun;

const std::vector<std::string> kModel = {
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--multi-latent-attention", "--kv-lora-rank", "12",
    "--qk-head-dim", "6", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "5", "--q-lora-rank", "10", "--qk-layernorm",
    "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear",
    "--untie-embeddings-and-output-weights", "--mla-down-proj-fusion"};

OpTable fused_ops() {
  OpTable ops = reference_ops();
  ops.mla_down_proj_fusion = true;
  return ops;
}

const TestRun& single_process_fused() {
  static std::unique_ptr<TestRun> run;
  if (!run) {
    run = std::make_unique<TestRun>(kModel, make_self_communicator("world"), testing::kTinyVocab, EngineOptions{},
                                    fused_ops());
    run->train(5);
  }
  return *run;
}

TEST(MlaDownProjFusion, SingleProcessFusedEqualsUnfused) {
  // The same flags with the reference ops (what --optimization-level 0 runs): the unfused path.
  TestRun unfused(kModel, make_self_communicator("world"), testing::kTinyVocab, EngineOptions{}, reference_ops());
  unfused.train(5);
  EXPECT_GT(testing::expect_matches_reference(single_process_fused(), unfused, 5, 3e-5, "linear_kv_down_proj"), 0);
}

class MlaDownProjFusionTp : public ::testing::TestWithParam<bool> {};

TEST_P(MlaDownProjFusionTp, MatchesSingleProcess) {
  if (test::world()->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<std::string> flags = kModel;
  flags.insert(flags.end(), {"--tensor-model-parallel-size", "2"});
  if (GetParam()) flags.push_back("--sequence-parallel");
  TestRun run(flags, test::world(), testing::kTinyVocab, EngineOptions{}, fused_ops());
  run.train(5);
  finish_param_sync(*run.engine);
  EXPECT_GT(testing::expect_matches_reference(run, single_process_fused(), 5, 3e-5, "linear_q_down_proj"), 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MlaDownProjFusionTp, ::testing::Bool(),
                         [](const auto& info) { return std::string(info.param ? "tp2_sp" : "tp2"); });

}  // namespace
}  // namespace gale
