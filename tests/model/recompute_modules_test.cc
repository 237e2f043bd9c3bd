// Megatron's --recompute-modules mlp, moe_act, shared_experts and moe (RecomputePlan's flags): the
// same tiny dense and MoE models with those activations dropped in forward and recomputed in
// backward give bit-identical losses and gradients over a few AdamW steps (reference and fused
// kernels, fp32 and bf16, alone, together and with the layernorm and full recomputation), hold
// fewer bytes at the peak, and count the MoE auxiliary losses once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "core/threads.h"
#include "kernels/cpu/fused_ops.h"
#include "model_test_batches.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

using testing::TinyTrainingRun;
using testing::three_layers;
constexpr auto train = testing::train_plain;
constexpr auto bf16 = testing::with_bf16;

// The tiny LLaMA with every layer a MoE MLP: 4 SwiGLU experts (odd Fe), top-2, both aux losses, and
// a shared expert (with a gate when `gate`).
ModelConfig tiny_moe(bool gate) {
  ModelConfig c = three_layers(testing::tiny_llama_config());
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.ffn = 30;
  c.moe.aux_loss_coeff = 0.1;
  c.moe.z_loss_coeff = 0.01;
  c.moe.shared_ffn = 22;
  c.moe.shared_gate = gate;
  return c;
}

struct Case {
  const char* name;
  ModelConfig config;
  bool fused;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

OpTable case_ops(const Case& c) {
  OpTable ops = reference_ops();
  if (c.fused) GALE_CHECK_OK(install_all_fused_kernels(ops, detected_isa()));
  return ops;
}

class RecomputeMlp : public ::testing::TestWithParam<Case> {};

// --recompute-modules mlp: the dense MLP keeps only its input; fc1's output and the activation's
// output (and with layernorm the norm's output) are rebuilt in backward.
TEST_P(RecomputeMlp, SameLossesAndGradientsWithLessMemory) {
  const Case& c = GetParam();
  const OpTable ops = case_ops(c);
  const int steps = 3;
  const TinyTrainingRun stored = train(c.config, ops, steps);
  const int64_t T = 2 * c.config.seq_length, L = c.config.num_layers;
  const int64_t elem = c.config.bf16 ? 2 : 4;  // act is kept as a GEMM input: bf16 with --bf16
  const int64_t mlp_bytes = T * c.config.fc1_out() * 4 + T * c.config.ffn * elem;  // fc1_out (f32) + act
  struct Plan {
    const char* what;
    RecomputePlan plan;
    int64_t saved_per_layer;
  };
  RecomputePlan mlp;
  mlp.mlp = true;
  RecomputePlan with_norms = mlp;
  with_norms.norm_layers = RecomputePlan::kAllLayers;
  RecomputePlan with_activation = mlp;
  with_activation.activation_layers = 1;
  const Plan plans[] = {{"mlp", mlp, mlp_bytes},
                        {"mlp and layernorm", with_norms, mlp_bytes + 2 * T * c.config.hidden * elem},
                        {"mlp and the activation function in the first layer", with_activation, mlp_bytes}};
  for (const Plan& p : plans) {
    ModelConfig config = c.config;
    config.recompute = p.plan;
    const TinyTrainingRun rc = train(config, ops, steps);
    testing::expect_identical_runs(stored, rc, p.what);
    // The last layer's backward comes first and recomputes at once: the others' bytes are saved.
    EXPECT_LE(rc.first_step_peak_bytes, stored.first_step_peak_bytes - (L - 1) * p.saved_per_layer)
        << p.what << ": peak " << rc.first_step_peak_bytes << " vs " << stored.first_step_peak_bytes;
  }
  // Inside Megatron's full recomputation (the rerun forward keeps only the MLP's input again).
  ModelConfig full = c.config;
  full.recompute = mlp;
  full.full_recompute = {FullRecompute::Method::kUniform, 2};
  testing::expect_identical_runs(stored, train(full, ops, steps), "mlp inside uniform 2");
}

INSTANTIATE_TEST_SUITE_P(Models, RecomputeMlp,
                         ::testing::Values(Case{"gpt_reference", three_layers(testing::tiny_gpt_config()), false},
                                           Case{"gpt_fused", three_layers(testing::tiny_gpt_config()), true},
                                           Case{"llama_fused", three_layers(testing::tiny_llama_config()), true},
                                           Case{"gpt_bf16_fused", bf16(three_layers(testing::tiny_gpt_config())), true},
                                           Case{"llama_bf16_reference", bf16(three_layers(testing::tiny_llama_config())),
                                                false}),
                         [](const auto& info) { return std::string(info.param.name); });

class RecomputeMoe : public ::testing::TestWithParam<Case> {};

// --recompute-modules moe_act, shared_experts and moe on a model whose every layer is MoE.
TEST_P(RecomputeMoe, SameLossesAndGradientsWithLessMemory) {
  // The experts run concurrently, one per thread (model/moe_layer.cc), so with several threads two
  // experts' temporaries overlap in an order the dynamic schedule decides and the peak moves by a
  // few KB from run to run; the saving below is exact for one thread, so this test runs on one.
  const int threads_before = num_threads();
  set_num_threads(1);
  struct Restore {
    int n;
    ~Restore() { set_num_threads(n); }
  } restore{threads_before};
  const Case& c = GetParam();
  const OpTable ops = case_ops(c);
  const int steps = 3;
  const TinyTrainingRun stored = train(c.config, ops, steps);
  const ModelConfig& m = c.config;
  const int64_t T = 2 * m.seq_length, L = m.num_layers, k = m.moe.topk;
  const int64_t elem = m.bf16 ? 2 : 4;
  const int64_t act_bytes = T * k * m.moe.ffn * elem;  // dropless: T·k expert rows, their activations
  const int64_t shared_bytes = T * 2 * m.moe.shared_ffn * 4 + T * m.moe.shared_ffn * elem;  // fc1_out + act
  const int64_t fc1_bytes = T * k * 2 * m.moe.ffn * 4;  // the experts' fc1 outputs
  struct Plan {
    const char* what;
    bool moe_act, shared_experts, moe;
    int64_t saved_per_layer;
  };
  const Plan plans[] = {{"moe_act", true, false, false, act_bytes},
                        {"shared_experts", false, true, false, shared_bytes},
                        {"moe_act and shared_experts", true, true, false, act_bytes + shared_bytes},
                        {"moe", false, false, true, act_bytes + shared_bytes + fc1_bytes},
                        {"moe with moe_act and shared_experts", true, true, true, act_bytes + shared_bytes + fc1_bytes}};
  for (const Plan& p : plans) {
    ModelConfig config = m;
    config.recompute.moe_act = p.moe_act;
    config.recompute.shared_experts = p.shared_experts;
    config.recompute.moe = p.moe;
    const TinyTrainingRun rc = train(config, ops, steps);
    testing::expect_identical_runs(stored, rc, p.what);
    EXPECT_LE(rc.first_step_peak_bytes, stored.first_step_peak_bytes - (L - 1) * p.saved_per_layer)
        << p.what << ": peak " << rc.first_step_peak_bytes << " vs " << stored.first_step_peak_bytes;
  }
  ModelConfig all = m;  // with the norms, the dense plan (no dense layer here) and full recomputation
  all.recompute.moe_act = all.recompute.shared_experts = all.recompute.moe = all.recompute.mlp = true;
  all.recompute.norm_layers = RecomputePlan::kAllLayers;
  all.full_recompute = {FullRecompute::Method::kBlock, 2};
  testing::expect_identical_runs(stored, train(all, ops, steps), "everything inside block 2");
}

INSTANTIATE_TEST_SUITE_P(Models, RecomputeMoe,
                         ::testing::Values(Case{"moe_reference", tiny_moe(false), false},
                                           Case{"moe_gated_fused", tiny_moe(true), true},
                                           Case{"moe_bf16_fused", bf16(tiny_moe(false)), true}),
                         [](const auto& info) { return std::string(info.param.name); });

// --recompute-modules mla_up_proj: multi-latent attention drops its packed q/k/v rows after
// attention and rebuilds them from the kept latents (a query latent with its norm, or the direct
// query projection of x).
ModelConfig tiny_mla(int64_t q_lora_rank, bool bf16_gemms) {
  ModelConfig c = three_layers(testing::tiny_llama_config());
  c.mla.enabled = true;
  c.mla.q_lora_rank = q_lora_rank;
  c.mla.kv_lora_rank = 10;
  c.kv_heads = c.heads;  // MLA: every head its own keys and values
  c.mla.qk_head_dim = 6;
  c.mla.qk_pos_emb_head_dim = 4;
  c.mla.v_head_dim = 5;
  c.mla.qk_layernorm = q_lora_rank > 0;
  c.bf16 = bf16_gemms;
  return c;
}

TEST(RecomputeModules, MlaUpProjectionsGiveTheSameLossesAndGradientsWithLessMemory) {
  for (const bool fused : {false, true})
    for (const ModelConfig& c : {tiny_mla(7, false), tiny_mla(0, false), tiny_mla(7, true)}) {
      OpTable ops = reference_ops();
      if (fused) GALE_CHECK_OK(install_all_fused_kernels(ops, detected_isa()));
      const std::string what = str_cat("q_lora_rank ", c.mla.q_lora_rank, c.bf16 ? ", bf16" : "",
                                       fused ? ", fused" : ", reference");
      const TinyTrainingRun stored = train(c, ops, 3);
      ModelConfig rc = c;
      rc.recompute.mla_up_proj = true;
      const TinyTrainingRun recomputed = train(rc, ops, 3);
      testing::expect_identical_runs(stored, recomputed, what);
      const int64_t T = 2 * c.seq_length, L = c.num_layers, R = c.mla.qk_pos_emb_head_dim;
      const int64_t saved = T * c.heads * 3 * c.mla.attention_head_dim() * 4 - T * R * 4;  // packed rows - k_pe
      EXPECT_LE(recomputed.first_step_peak_bytes, stored.first_step_peak_bytes - (L - 1) * saved)
          << what << ": peak " << recomputed.first_step_peak_bytes << " vs " << stored.first_step_peak_bytes;
      rc.recompute.norm_layers = RecomputePlan::kAllLayers;  // with layernorm and full recomputation
      rc.full_recompute = {FullRecompute::Method::kUniform, 2};
      testing::expect_identical_runs(stored, train(rc, ops, 3), what + ", with layernorm inside uniform 2");
    }
}

// The rerun MoE forward neither adds its aux losses nor its expert-bias counts a second time; a
// Mixtral-like model with a dense layer between MoE layers (mlp and moe recompute side by side),
// shared experts under --moe-shared-expert-overlap (the rerun runs it without the overlap).
TEST(RecomputeModules, MoeAuxLossesAndExpertBiasCountsAreCountedOnce) {
  ModelConfig c = three_layers(testing::tiny_llama_config());
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.ffn = 10;
  c.moe.aux_loss_coeff = 0.1;
  c.moe.z_loss_coeff = 0.01;
  c.moe.pattern = {1, 0, 1};
  c.moe.sigmoid = true;
  c.moe.expert_bias = true;
  c.moe.shared_ffn = 12;
  c.moe.shared_overlap = true;
  OpTable ops = reference_ops();
  struct Out {
    std::vector<float> grads;
    MoeAuxLosses aux;
    std::map<int64_t, std::vector<int64_t>> counts;
  };
  auto run = [&](const ModelConfig& cfg) {
    GPTModel model(cfg, single_process_partition(cfg), &ops);
    model.params().initialize(6);
    const MicroBatch mb = testing::full_batch(cfg, 2, 23);
    GPTModel::LossSums sums;
    model.forward(0, mb, Tensor(), true, &sums);
    model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
    Out out;
    out.aux = model.take_moe_losses();
    out.counts = model.take_moe_token_counts();
    const float* g = model.params().flat_grads().data<float>();
    out.grads.assign(g, g + model.params().numel());
    return out;
  };
  const Out kept = run(c);
  ModelConfig rc = c;
  rc.recompute.moe = rc.recompute.mlp = rc.recompute.moe_act = true;
  const Out recomputed = run(rc);
  EXPECT_EQ(kept.grads, recomputed.grads);
  EXPECT_GT(kept.aux.load_balancing, 0.0);
  EXPECT_EQ(kept.aux.load_balancing, recomputed.aux.load_balancing);
  EXPECT_EQ(kept.aux.z, recomputed.aux.z);
  ASSERT_EQ(kept.counts.size(), 2u);
  EXPECT_EQ(kept.counts, recomputed.counts);
}

}  // namespace
}  // namespace gale
