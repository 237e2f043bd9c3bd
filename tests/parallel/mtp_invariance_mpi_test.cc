// Parallel invariance of multi-token prediction (--mtp-num-layers 2): tensor parallelism (eh_proj
// column-parallel with its output gathered, the shared vocabulary-parallel embedding and output
// layer), with sequence parallelism (MTP norms' gradients summed over TP), data parallelism with
// the distributed optimizer and overlapped gradient reduction (the MTP parameters join the head's
// bucket group), and full recomputation of the decoder reproduce the single-process run: losses,
// MTP losses and grad norms within 1e-5 relative, final parameters 1e-3 and final gradients 1e-5
// (as tests/parallel/invariance_mpi_test.cc; a missing reduction is off by O(1)). A DeepSeek-V3-like
// MoE model (the last decoder layer and so the MTP layers MoE, sigmoid scores with expert bias, a
// shared expert) under TP2+SP and DP2: the MTP layers' router, experts and expert bias too.
// Pipeline parallelism (np 2 and 4): the MTP layers on the last stage (the last virtual chunk with
// VPP) with its copy of the first stage's embedding, tied (GPT, whose learned position embedding is
// copied too) and untied (LLaMA), the copies' gradients summed over the embedding group (with the
// distributed optimizer in a bucket of their own), with TP2 and SP, and the MoE model at PP2; with
// explicit splits (--num-layer-list, --pipeline-num-transformer-layers), also a last stage (chunk)
// without decoder layers; under DualPipeV on rank 0's second chunk, beside the embedding.
#include <gtest/gtest.h>

#include <cmath>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"dp2_distopt_overlap", 2, {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"}},
      {"tp2_sp_full_recompute", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--recompute-granularity", "full", "--recompute-method", "uniform",
                                    "--recompute-num-layers", "2"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"pp2_vpp2", 2, {"--pipeline-model-parallel-size", "2", "--num-layers", "4",
                       "--num-layers-per-virtual-pipeline-stage", "1"}},
      // Explicit splits (--num-layer-list, --pipeline-num-transformer-layers): the MTP layers follow
      // the last stage's (last chunk's) decoder layers, also when that holds none.
      {"pp2_num_layer_list", 2, {"--pipeline-model-parallel-size", "2", "--num-layers", "3", "--num-layer-list",
                                 "2,1"}},
      {"pp2_num_layer_list_empty_last", 2, {"--pipeline-model-parallel-size", "2", "--num-layer-list", "2,0"}},
      {"pp2_vpp2_unaligned", 2, {"--pipeline-model-parallel-size", "2", "--num-layers", "3",
                                 "--num-virtual-stages-per-pipeline-rank", "2", "--pipeline-num-transformer-layers",
                                 "[[1,1],[1,0]]"}},
      {"tp2_pp2_sp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--sequence-parallel"}},
      // DualPipeV: the MTP layers on rank 0's second chunk, beside the embedding they copy.
      {"pp2_dualpipev", 2, {"--pipeline-model-parallel-size", "2", "--num-layers", "4", "--schedules-method",
                            "dualpipev"}},
      {"tp2_pp2_sp_dualpipev", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                   "--num-layers", "4", "--sequence-parallel", "--schedules-method", "dualpipev"}},
      {"pp2_dp2_distopt_overlap", 4, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer",
                                      "--overlap-grad-reduce", "--overlap-param-gather"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "2", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "4", "--lr", "2e-3",
    "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
    "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
    "--clip-grad", "0.5", "--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3"};

class MtpInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(MtpInvariance, MatchesSingleProcess) {
  const auto& [name, llama] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr);
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  testing::LayoutAndReference t =
      testing::train_layout_and_reference(
      testing::join({kCommon, llama ? testing::kTinyLlama : testing::kTinyGpt}), *layout, 4);
  const testing::TestRun &run = *t.run, &reference = *t.reference;
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(run.mtp_losses[i].size(), 2u);
    ASSERT_EQ(reference.mtp_losses[i].size(), 2u);
    for (int k = 0; k < 2; ++k)
      EXPECT_NEAR(run.mtp_losses[i][k], reference.mtp_losses[i][k], 1e-5 * reference.mtp_losses[i][k])
          << "mtp_" << k + 1 << " loss of iteration " << i + 1;
  }
  const int named = testing::expect_matches_reference(run, reference, 4, 1e-5, "mtp.layers.1.eh_proj");
  if (run.engine->chunks.back()->partition().post_process) EXPECT_GT(named, 0);  // the MTP layers' stage
}

INSTANTIATE_TEST_SUITE_P(Layouts, MtpInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

const std::vector<std::string> kMoe = {
    "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--moe-layer-freq", "[0,1]",
    "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-aux-loss-coeff", "0.01",
    "--moe-shared-expert-intermediate-size", "32"};

class MtpMoeInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpMoeInvariance, MatchesSingleProcess) {
  const Layout* layout = testing::find_layout(layouts(), GetParam());
  ASSERT_NE(layout, nullptr);
  if (layout->world != test::world()->size()) GTEST_SKIP() << GetParam() << " needs " << layout->world << " ranks";
  testing::LayoutAndReference t =
      testing::train_layout_and_reference(testing::join({kCommon, testing::kTinyLlama, kMoe}), *layout, 4);
  testing::TestRun& run = *t.run;
  const testing::TestRun* reference = t.reference;
  for (int i = 0; i < 4; ++i) {
    for (int k = 0; k < 2; ++k)
      EXPECT_NEAR(run.mtp_losses[i][k], reference->mtp_losses[i][k], 1e-5 * reference->mtp_losses[i][k])
          << "mtp_" << k + 1 << " loss of iteration " << i + 1;
    EXPECT_NEAR(run.load_balancing_losses[i], reference->load_balancing_losses[i],
                1e-5 * reference->load_balancing_losses[i]);
  }
  const int named =
      testing::expect_matches_reference(run, *reference, 4, 1e-5, "mtp.layers.1.transformer_layer.mlp.router");
  if (!run.engine->chunks.back()->partition().post_process) return;  // the MTP layers are on the last stage
  EXPECT_GT(named, 0);
  // The MTP layers' expert bias moved (buffers are compared with the parameters above).
  const ParamBuffer& pb = run.engine->chunks.back()->params();
  const int bias = pb.find("mtp.layers.1.transformer_layer.mlp.router.expert_bias");
  ASSERT_GE(bias, 0);
  float moved = 0.0f;
  for (int64_t e = 0; e < 4; ++e) moved += std::fabs(pb.param_data(bias)[e]);
  EXPECT_GT(moved, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MtpMoeInvariance, ::testing::Values("tp2_sp", "dp2_distopt_overlap", "pp2"));

}  // namespace
}  // namespace gale
