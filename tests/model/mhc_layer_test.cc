// --recompute-modules mhc (RecomputePlan::mhc, model/mhc_layer.h): mHC models that drop the modules'
// n-stream inputs, the aggregated sub-block inputs and the norms' outputs in forward and rebuild
// them per recompute block in backward give bit-identical losses and gradients over a few AdamW steps
// (GPT and LLaMA, reference and fused kernels, fp32 and bf16, MLA, hidden dropout; alone, with
// --mhc-recompute-layer-num, with layernorm, the activation function and mla_up_proj), and keep exactly the
// dropped bytes fewer after forward (the allocator's byte accounting).
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "core/allocator.h"
#include "core/threads.h"
#include "kernels/cpu/fused_ops.h"
#include "model/mhc_layer.h"
#include "model_test_batches.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

using testing::TinyTrainingRun;

// `c` (3 layers) with 3 residual streams, mappings away from their start, hidden dropout (the
// modules' masks are drawn again by the rerun merges).
ModelConfig with_mhc(ModelConfig c) {
  c.num_layers = 3;
  c.hidden_dropout = 0.1f;
  c.mhc.enabled = true;
  c.mhc.streams = 3;
  c.mhc.sinkhorn_iterations = 4;
  c.mhc.init_gating_factor = 0.5f;
  return c;
}

ModelConfig tiny_mla(ModelConfig c) {
  c.mla.enabled = true;
  c.mla.q_lora_rank = 7;
  c.mla.kv_lora_rank = 10;
  c.kv_heads = c.heads;
  c.mla.qk_head_dim = 6;
  c.mla.qk_pos_emb_head_dim = 4;
  c.mla.v_head_dim = 5;
  c.mla.qk_layernorm = true;
  return c;
}

struct Case {
  const char* name;
  ModelConfig config;
  bool fused;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The bytes one training forward leaves allocated for backward (what the model keeps in flight),
// on the first micro-batch train_plain uses.
int64_t saved_bytes_after_forward(const ModelConfig& c, const OpTable& ops) {
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(7);
  const MicroBatch mb = testing::tiny_batch(c, 2, 101, /*documents=*/false);
  GPTModel::LossSums sums;
  model.params().zero_grads();
  const int64_t before = host_allocator().current_bytes();
  model.forward(0, mb, Tensor(), /*training=*/true, &sums);
  const int64_t saved = host_allocator().current_bytes() - before;
  model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  return saved;
}

class MhcRecompute : public ::testing::TestWithParam<Case> {};

TEST_P(MhcRecompute, SameLossesAndGradientsWithFewerSavedBytes) {
  const Case& k = GetParam();
  OpTable ops = reference_ops();
  if (k.fused) GALE_CHECK_OK(install_all_fused_kernels(ops, detected_isa()));
  const ModelConfig& c = k.config;
  const int steps = 3;
  const TinyTrainingRun stored = testing::train_plain(c, ops, steps);
  const int64_t stored_saved = saved_bytes_after_forward(c, ops);
  const int64_t T = 2 * c.seq_length, H = c.hidden, n = c.mhc.streams, L = c.num_layers;
  const int64_t elem = c.bf16 ? 2 : 4;  // the norms' outputs are kept as GEMM inputs
  // Per layer: both modules' inputs X (f32 [T, n·H]), both aggregated inputs a (f32 [T, H]) and the
  // norms' outputs (MLA keeps its own input rows instead of input_layernorm's output).
  const int64_t norms = (c.mla.enabled ? 1 : 2) * T * H * elem;
  const int64_t per_layer = 2 * T * n * H * 4 + 2 * T * H * 4 + norms;
  const int64_t block_input = T * n * H * 4;  // a recompute block's first layer keeps its input streams
  struct Plan {
    const char* what;
    int64_t layer_num;       // --mhc-recompute-layer-num (0: unset)
    bool layernorm, activation;
    int64_t blocks;
  };
  const Plan plans[] = {{"mhc", 0, false, false, 1},
                        {"mhc, 1 layer per block", 1, false, false, 3},
                        {"mhc, 2 layers per block", 2, false, false, 2},
                        {"mhc with layernorm, the activation function (MLA: and mla_up_proj)", 0, true, true, 1}};
  for (const Plan& p : plans) {
    ModelConfig rc = c;
    rc.recompute.mhc = true;
    rc.recompute.mhc_layer_num = p.layer_num;
    if (p.layernorm) rc.recompute.norm_layers = RecomputePlan::kAllLayers;
    if (p.activation) rc.recompute.activation_layers = RecomputePlan::kAllLayers;
    rc.recompute.mla_up_proj = p.layernorm && c.mla.enabled;  // MLA: with mla_up_proj as well
    const TinyTrainingRun recomputed = testing::train_plain(rc, ops, steps);
    testing::expect_identical_runs(stored, recomputed, p.what);
    if (p.layernorm) continue;  // the norms' outputs are dropped by both plans
    EXPECT_EQ(saved_bytes_after_forward(rc, ops), stored_saved - L * per_layer + p.blocks * block_input) << p.what;
    if (p.layer_num == 1)  // one layer rebuilt at a time: the step's peak is lower too
      EXPECT_LT(recomputed.first_step_peak_bytes, stored.first_step_peak_bytes) << p.what;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, MhcRecompute,
    ::testing::Values(Case{"gpt_reference", with_mhc(testing::tiny_gpt_config()), false},
                      Case{"gpt_fused", with_mhc(testing::tiny_gpt_config()), true},
                      Case{"llama_fused", with_mhc(testing::tiny_llama_config()), true},
                      Case{"llama_bf16_fused", testing::with_bf16(with_mhc(testing::tiny_llama_config())), true},
                      Case{"llama_mla_reference", with_mhc(tiny_mla(testing::tiny_llama_config())), false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(MhcRecompute, BlocksFollowMhcRecomputeLayerNum) {
  RecomputePlan plan;
  plan.mhc = true;
  EXPECT_EQ(mhc_recompute_block(plan, 0, 5), (std::pair<int64_t, int64_t>{0, 5}));
  EXPECT_EQ(mhc_recompute_block(plan, 4, 5), (std::pair<int64_t, int64_t>{0, 5}));
  plan.mhc_layer_num = 2;  // Megatron: the last layer of a block is layer_number % 2 == 0 or the block's last
  EXPECT_EQ(mhc_recompute_block(plan, 0, 5), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(mhc_recompute_block(plan, 3, 5), (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_EQ(mhc_recompute_block(plan, 4, 5), (std::pair<int64_t, int64_t>{4, 5}));
}

}  // namespace
}  // namespace gale
