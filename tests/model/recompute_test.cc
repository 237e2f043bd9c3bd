// Activation recomputation (RecomputePlan: --recompute-activation-function, --recompute-norm; and
// FullRecompute: Megatron's --recompute-granularity full): the same tiny models with activations
// dropped in forward and recomputed in backward give bit-identical losses and gradients over a few
// AdamW steps, with the reference and the fused kernels, in fp32 and bf16, and hold fewer bytes at
// the peak.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/cpu/fused_ops.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

using testing::TinyTrainingRun;
using testing::three_layers;
constexpr auto train = testing::train_plain;
constexpr auto bf16 = testing::with_bf16;

struct Case {
  const char* name;
  ModelConfig config;
  bool fused;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Recompute : public ::testing::TestWithParam<Case> {};

OpTable case_ops(const Case& c) {
  OpTable ops = reference_ops();
  if (c.fused) GALE_CHECK_OK(install_all_fused_kernels(ops, detected_isa()));
  return ops;
}

TEST_P(Recompute, SameLossesAndGradientsWithLessMemory) {
  const Case& c = GetParam();
  const OpTable ops = case_ops(c);
  const int steps = 3;
  const TinyTrainingRun stored = train(c.config, ops, steps);
  const int64_t T = 2 * c.config.seq_length, L = c.config.num_layers;
  const int64_t elem = c.config.bf16 ? 2 : 4;  // kept as GEMM inputs: bf16 with --bf16
  const int64_t act_bytes = T * c.config.ffn * elem, norm_bytes = 2 * T * c.config.hidden * elem;

  struct Plan {
    const char* what;
    int64_t activation_layers, norm_layers;
  };
  const Plan plans[] = {{"activation, every layer", RecomputePlan::kAllLayers, 0},
                        {"norms, every layer", 0, RecomputePlan::kAllLayers},
                        {"both, every layer", RecomputePlan::kAllLayers, RecomputePlan::kAllLayers},
                        {"activation in the first layer, norms in the first two", 1, 2}};
  for (const Plan& p : plans) {
    ModelConfig config = c.config;
    config.recompute = {p.activation_layers, p.norm_layers};
    const TinyTrainingRun rc = train(config, ops, steps);
    testing::expect_identical_runs(stored, rc, p.what);
    // The peak (end of forward) lacks what the plan drops, except in the last layer, whose backward
    // comes first and recomputes at once.
    const int64_t act_layers = std::min<int64_t>(p.activation_layers, L - 1);
    const int64_t norm_layers = std::min<int64_t>(p.norm_layers, L - 1);
    const int64_t saved = act_layers * act_bytes + norm_layers * norm_bytes;
    EXPECT_LE(rc.first_step_peak_bytes, stored.first_step_peak_bytes - saved)
        << p.what << ": peak " << rc.first_step_peak_bytes << " vs " << stored.first_step_peak_bytes;
  }
}

// Megatron's --recompute-granularity full: groups of layers keep only their input and rerun their
// forward in backward; the same losses and gradients, bit for bit, and a lower peak.
TEST_P(Recompute, FullRecomputeOfLayerGroups) {
  const Case& c = GetParam();
  const OpTable ops = case_ops(c);
  const int steps = 2;
  const TinyTrainingRun stored = train(c.config, ops, steps);
  struct Plan {
    const char* what;
    FullRecompute::Method method;
    int64_t num_layers;
  };
  const Plan plans[] = {{"uniform, groups of 1", FullRecompute::Method::kUniform, 1},
                        {"uniform, groups of 2 (the last group is 1 layer)", FullRecompute::Method::kUniform, 2},
                        {"block, the first 2 layers", FullRecompute::Method::kBlock, 2},
                        {"block, more layers than the model has", FullRecompute::Method::kBlock, 5}};
  for (const Plan& p : plans) {
    ModelConfig config = c.config;
    config.full_recompute = {p.method, p.num_layers};
    const TinyTrainingRun rc = train(config, ops, steps);
    testing::expect_identical_runs(stored, rc, p.what);
    EXPECT_LT(rc.first_step_peak_bytes, stored.first_step_peak_bytes) << p.what;
  }
  // With the activation and norm plans on top (inside the rerun forward they still apply).
  ModelConfig both = c.config;
  both.full_recompute = {FullRecompute::Method::kUniform, 2};
  both.recompute = {RecomputePlan::kAllLayers, RecomputePlan::kAllLayers};
  testing::expect_identical_runs(stored, train(both, ops, steps), "uniform 2 with the activation and norm plans");
}

TEST(FullRecompute, Groups) {
  const FullRecompute uniform{FullRecompute::Method::kUniform, 2}, block{FullRecompute::Method::kBlock, 2}, none;
  EXPECT_EQ(uniform.group(0, 5), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(uniform.group(3, 5), (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_EQ(uniform.group(4, 5), (std::pair<int64_t, int64_t>{4, 5}));
  EXPECT_EQ(block.group(1, 5), (std::pair<int64_t, int64_t>{1, 2}));
  EXPECT_EQ(block.group(2, 5), (std::pair<int64_t, int64_t>{2, 2}));
  EXPECT_EQ(none.group(0, 5), (std::pair<int64_t, int64_t>{0, 0}));
}

// --enable-recompute-layers-per-pp-rank: block's count covers the rank's V chunks, layer l of chunk
// v recomputing when l·V + v < N (MindSpeed's priority). N = 3, V = 2, 3 layers per chunk: layers 0
// and 1 of chunk 0, layer 0 of chunk 1.
TEST(FullRecompute, PerPipelineRank) {
  auto recomputed = [](int64_t chunk, int64_t chunks, int64_t n) {
    FullRecompute f{FullRecompute::Method::kBlock, n};
    f.per_pp_rank = true;
    f.chunk = chunk;
    f.rank_chunks = chunks;
    std::vector<int64_t> layers;
    for (int64_t i = 0; i < 3; ++i)
      if (const auto [first, end] = f.group(i, 3); first < end) {
        EXPECT_EQ(end, first + 1);
        layers.push_back(i);
      }
    return layers;
  };
  EXPECT_EQ(recomputed(0, 2, 3), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(recomputed(1, 2, 3), (std::vector<int64_t>{0}));
  EXPECT_EQ(recomputed(0, 2, 1), (std::vector<int64_t>{0}));
  EXPECT_EQ(recomputed(1, 2, 1), (std::vector<int64_t>{}));
  EXPECT_EQ(recomputed(1, 2, 6), (std::vector<int64_t>{0, 1, 2}));  // the whole rank
  EXPECT_EQ(recomputed(2, 3, 4), (std::vector<int64_t>{0}));         // priorities 2, 5, 8
  EXPECT_EQ(recomputed(0, 3, 4), (std::vector<int64_t>{0, 1}));      // priorities 0, 3
  // Without the flag the count is per chunk, whatever the chunk.
  FullRecompute per_chunk{FullRecompute::Method::kBlock, 1};
  per_chunk.chunk = 1;
  per_chunk.rank_chunks = 2;
  EXPECT_EQ(per_chunk.group(0, 3), (std::pair<int64_t, int64_t>{0, 1}));
}

INSTANTIATE_TEST_SUITE_P(Models, Recompute,
                         ::testing::Values(Case{"gpt_reference", three_layers(testing::tiny_gpt_config()), false},
                                           Case{"gpt_fused", three_layers(testing::tiny_gpt_config()), true},
                                           Case{"llama_reference", three_layers(testing::tiny_llama_config()), false},
                                           Case{"llama_fused", three_layers(testing::tiny_llama_config()), true},
                                           Case{"gpt_bf16_fused", bf16(three_layers(testing::tiny_gpt_config())), true},
                                           Case{"llama_bf16_reference", bf16(three_layers(testing::tiny_llama_config())),
                                                false}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace gale
