// --dualpipev-dw-detach against plain DualPipeV on the same ranks: deferring the linears' weight
// gradients to the schedule's W steps changes when they are computed, not their sums (each weight
// still accumulates its micro-batches in order), so the losses, gradient norms, gradients and
// parameters of 4 iterations are bitwise equal, at PP2 and PP4, with TP2 + sequence parallelism
// (whose column-parallel weight gradient runs on the gathered input), plain, chunked (CoC) or with
// MC2's re-gathered inputs, under --bf16 (dy kept as bf16) and with full or MLP recomputation (the
// inputs recomputed in backward are what the deferred GEMMs keep), with MoE layers (experts and a
// shared expert; EP 1 all-gather, EP 2 all-to-all) and with multi-latent attention, for the GPT
// (tied embedding) and the LLaMA-like model.
#include <gtest/gtest.h>

#include <cstring>

#include "layouts.h"
#include "mpi_test_env.h"
#include "testing_bitwise.h"
#include "testing_run.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<std::string> kV = {"--schedules-method", "dualpipev"};
// 4 experts of which each token picks 2, plus a shared expert (which, as in Megatron, has no biases).
const std::vector<std::string> kMoe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
                                       "--moe-aux-loss-coeff", "0.1", "--moe-shared-expert-intermediate-size", "32",
                                       "--disable-bias-linear"};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"pp2", 2, testing::join({{"--pipeline-model-parallel-size", "2"}, kV})},
      {"pp2_bf16", 2, testing::join({{"--pipeline-model-parallel-size", "2", "--bf16"}, kV})},
      {"pp2_recompute_full", 2,
       testing::join({{"--pipeline-model-parallel-size", "2", "--recompute-granularity", "full", "--recompute-method",
                       "uniform", "--recompute-num-layers", "1"},
                      kV})},
      {"pp2_recompute_mlp", 2,
       testing::join({{"--pipeline-model-parallel-size", "2", "--recompute-granularity", "selective",
                       "--recompute-modules", "mlp"},
                      kV})},
      {"pp4", 4, testing::join({{"--pipeline-model-parallel-size", "4", "--num-layers", "8"}, kV})},
      {"tp2_pp2_sp", 4,
       testing::join({{"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"},
                      kV})},
      // The op table's chunked TP linears (what --use-ascend-coc installs: the weight gradient runs
      // while the last chunks' collectives travel) and --use-ascend-mc2's re-gathered inputs.
      {"tp2_pp2_sp_coc2", 4,
       testing::join({{"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"},
                      kV})},
      {"tp2_pp2_sp_mc2", 4,
       testing::join({{"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"},
                      kV})},
      // MoE layers: the experts' weight gradients deferred as expert batches (run one expert per
      // thread, as at once), the shared expert's linears like the dense ones; all-gather dispatcher
      // at EP 1, all-to-all at EP 2 (with DP 2).
      {"pp2_moe", 2, testing::join({{"--pipeline-model-parallel-size", "2"}, kMoe, kV})},
      {"pp2_dp2_ep2_alltoall", 4,
       testing::join({{"--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "2",
                       "--moe-token-dispatcher-type", "alltoall"},
                      kMoe,
                      kV})},
      // Multi-latent attention's five linears (GPT variant only: MLA has no query groups).
      {"pp2_mla", 2,
       testing::join({{"--pipeline-model-parallel-size", "2", "--multi-latent-attention", "--kv-lora-rank", "12",
                       "--q-lora-rank", "10", "--qk-head-dim", "6", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "5",
                       "--position-embedding-type", "rope"},
                      kV})},
  };
  return all;
}

// The reference op table, with the layout's TP communication.
OpTable layout_ops(const std::string& name) {
  OpTable ops = reference_ops();
  if (name == "tp2_pp2_sp_coc2") ops.tp_comm_chunks = 2;
  if (name == "tp2_pp2_sp_mc2") {
    ops.tp_comm_chunks = 2;
    ops.tp_regather_input = true;
  }
  return ops;
}

// 4 layers (8 with PP4), 8 micro-batches of 2 (2·PP with PP4).
const std::vector<std::string>& kCommon = testing::kPipelineTestFlags;

class DualPipeVDwDetach : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(DualPipeVDwDetach, BitwiseEqualToDualPipeV) {
  const auto& [name, llama] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr) << name;
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  if (llama && name == "pp2_mla") GTEST_SKIP() << "MLA has no query groups (the LLaMA-like model has 4)";
  const std::vector<std::string> flags =
      testing::join({kCommon, llama ? testing::kTinyLlama : testing::kTinyGpt, layout->flags});
  const OpTable ops = layout_ops(name);
  testing::TestRun plain(flags, test::world(), testing::kTinyVocab, EngineOptions{}, ops);
  testing::TestRun detached(testing::join({flags, {"--dualpipev-dw-detach"}}), test::world(), testing::kTinyVocab,
                            EngineOptions{}, ops);
  ASSERT_FALSE(plain.engine->dualpipev_dw_detach);
  ASSERT_TRUE(detached.engine->dualpipev_dw_detach);
  constexpr int kIterations = 4;
  plain.train(kIterations);
  detached.train(kIterations);
  ASSERT_EQ(detached.engine->chunks.size(), 2u);
  const int compared = testing::expect_chunks_bit_identical(detached, plain, kIterations, "linear_fc1.weight");
  EXPECT_GT(compared, 0) << "no deferred linear among the compared gradients";
}

INSTANTIATE_TEST_SUITE_P(Layouts, DualPipeVDwDetach,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

}  // namespace
}  // namespace gale
