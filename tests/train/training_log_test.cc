// Megatron's log line, validation block and FLOPs formula, character for character.
#include "train/training_log.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

// The fields of the example line of megatron.md §5.
TrainingLogFields megatron_example_fields() {
  TrainingLogFields f;
  f.timestamp = "2025-05-20 15:48:49";
  f.iteration = 1;
  f.train_iters = 50;
  f.consumed_samples = 32;
  f.elapsed_ms_per_iteration = 4256.1;
  f.log_throughput = true;
  f.tflops_per_gpu = 123.5;
  f.learning_rate = 3.0e-5;
  f.global_batch_size = 32;
  f.losses = {{"lm loss", 10.83373}};
  f.grad_norm = 5.679;
  return f;
}

TEST(TrainingLog, MatchesMegatronExample) {
  // The example line of megatron.md §5, built from Megatron's own format strings.
  const TrainingLogFields f = megatron_example_fields();
  EXPECT_EQ(format_training_log_line(f),
            " [2025-05-20 15:48:49] iteration        1/      50 | consumed samples:           32 | elapsed time per "
            "iteration (ms): 4256.1 | throughput per GPU (TFLOP/s/GPU): 123.5 | learning rate: 3.000000E-05 | global "
            "batch size:    32 | lm loss: 1.083373E+01 | loss scale: 1.0 | grad norm: 5.679 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |");
}

// --op-cal-tflops: MindSpeed's two fields right after the formula's throughput, only with
// --log-throughput.
TEST(TrainingLog, CountedThroughputsAfterTheFormulas) {
  TrainingLogFields f = megatron_example_fields();
  f.op_cal_tflops = true;
  f.actual_tflops_per_gpu = 110.04;
  f.actual_tflops_with_recompute_per_gpu = 146.66;
  EXPECT_EQ(format_training_log_line(f),
            " [2025-05-20 15:48:49] iteration        1/      50 | consumed samples:           32 | elapsed time per "
            "iteration (ms): 4256.1 | throughput per GPU (TFLOP/s/GPU): 123.5 | actual throughput per GPU "
            "(TFLOP/s/GPU): 110.0 | actual throughput per GPU with recompute (TFLOP/s/GPU): 146.7 | learning rate: "
            "3.000000E-05 | global batch size:    32 | lm loss: 1.083373E+01 | loss scale: 1.0 | grad norm: 5.679 | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |");
  f.log_throughput = false;  // MindSpeed prints all three throughputs under --log-throughput only
  EXPECT_EQ(format_training_log_line(f).find("throughput"), std::string::npos);
}

TEST(TrainingLog, OptionalFields) {
  TrainingLogFields f;
  f.timestamp = "2026-01-01 00:00:00";
  f.iteration = 200;
  f.train_iters = 1000;
  f.consumed_samples = 800;
  f.skipped_samples = 3;
  f.learning_rate = 1e-4;
  f.global_batch_size = 4;
  // no loss entries: nothing between the batch size and the loss scale
  f.num_zeros = 12;
  f.params_norm = 250.125;
  f.skipped_iterations = 1;
  f.nan_iterations = 1;
  std::string line = format_training_log_line(f);
  EXPECT_NE(line.find("| skipped samples:            3 |"), std::string::npos) << line;
  EXPECT_EQ(line.find("throughput"), std::string::npos);
  EXPECT_EQ(line.find("lm loss"), std::string::npos);
  EXPECT_NE(line.find(" global batch size:     4 | loss scale: 1.0 |"), std::string::npos) << line;
  EXPECT_NE(line.find(" num zeros: 12 | params norm: 250.125 |"), std::string::npos) << line;
  EXPECT_NE(line.find(" number of skipped iterations:   1 | number of nan iterations:   1 |"), std::string::npos);
  // Megatron main's training_log: the learning rate, then the global batch size (no decoupled rate).
  EXPECT_NE(line.find(" learning rate: 1.000000E-04 | global batch size:     4 |"), std::string::npos) << line;
  EXPECT_EQ(line.find("decoupled"), std::string::npos) << line;
}

// Megatron's training_log prints every total_loss_dict entry as ' {key}: {avg:.6E} |' when
// `avg >= 0.0`, in the dict's order, after the global batch size and before the loss scale: a zero
// prints, a negative average does not.
TEST(TrainingLog, LossEntriesPrintedWhenAtLeastZero) {
  TrainingLogFields f = megatron_example_fields();
  f.losses = {{"lm loss", 0.0}, {"load_balancing_loss", 0.0}, {"z_loss", -1.0e-3}, {"mtp_1 loss", 2.5},
              {"indexer loss", 1.25e-4}};
  EXPECT_EQ(format_training_log_line(f),
            " [2025-05-20 15:48:49] iteration        1/      50 | consumed samples:           32 | elapsed time per "
            "iteration (ms): 4256.1 | throughput per GPU (TFLOP/s/GPU): 123.5 | learning rate: 3.000000E-05 | global "
            "batch size:    32 | lm loss: 0.000000E+00 | load_balancing_loss: 0.000000E+00 | mtp_1 loss: "
            "2.500000E+00 | indexer loss: 1.250000E-04 | loss scale: 1.0 | grad norm: 5.679 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |");
}

TEST(TrainingLog, ValidationBlock) {
  // Layout of a real Megatron log (its loss had more digits, so its PPL differs in the last place).
  std::string b = format_validation_block("iteration 19000", 1.280714);
  std::string line = " validation loss at iteration 19000 | lm loss value: 1.280714E+00 | lm loss PPL: 3.599209E+00 | ";
  std::string rule(line.size() + 1, '-');
  EXPECT_EQ(b, rule + "\n" + line + "\n" + rule);
  // PPL saturates at exp(20).
  EXPECT_NE(format_validation_block("iteration 1 on test set", 30.0).find("lm loss PPL: 4.851652E+08 |"), std::string::npos);
}

// --stage dpo: every key of the loss dict in its order (MindSpeed-LLM's DPO loss function returns
// rewards/accuracies, then lm loss), value and PPL each, as Megatron's evaluate_and_print_results.
TEST(TrainingLog, ValidationBlockOfEveryLossDictKey) {
  std::string b = format_validation_block("iteration 4", LossDict{{"rewards/accuracies", 0.5}, {"lm loss", 0.25}});
  std::string line =
      " validation loss at iteration 4 | rewards/accuracies value: 5.000000E-01 | rewards/accuracies PPL: "
      "1.648721E+00 | lm loss value: 2.500000E-01 | lm loss PPL: 1.284025E+00 | ";
  std::string rule(line.size() + 1, '-');
  EXPECT_EQ(b, rule + "\n" + line + "\n" + rule);
}

TEST(Flops, Gpt2SmallByHand) {
  FlopsModel m;
  m.seq_length = 256;
  m.num_layers = 12;
  m.hidden = 768;
  m.heads = 12;
  m.query_groups = 12;
  m.kv_channels = 64;
  m.ffn = 3072;
  m.padded_vocab = 50304;
  // Per token: 12·L·h·ffn + 12·L·h²·(2 + s/(2h)) + 6·h·V
  double per_token = 12.0 * 12 * 768 * 3072 + 12.0 * 12 * 768 * 768 * (2.0 + 256.0 / 1536.0) + 6.0 * 768 * 50304;
  EXPECT_NEAR(num_floating_point_operations(m, 4), 4 * 256 * per_token, 1e-6 * 4 * 256 * per_token);
  // SwiGLU multiplies the MLP term by 1.5; GQA with 4 groups shrinks the KV term.
  m.swiglu = true;
  m.ffn = 2048;
  m.query_groups = 4;
  per_token = 12.0 * 12 * 768 * 2048 * 1.5 + 12.0 * 12 * 768 * 768 * (1.0 + 4.0 / 12.0 + 256.0 / 1536.0) + 6.0 * 768 * 50304;
  EXPECT_NEAR(num_floating_point_operations(m, 1), 256 * per_token, 1e-6 * 256 * per_token);
  // --attention-output-gate: Megatron-Core main's gate_projection_size adds 6·h·(NH·HD) per layer.
  m.attention_output_gate = true;
  per_token += 6.0 * 12 * 768 * 768;
  EXPECT_NEAR(num_floating_point_operations(m, 1), 256 * per_token, 1e-6 * 256 * per_token);
}

// MoE (Megatron's formula): half the layers with 8 experts of FFN 512, top-2, and a shared expert
// of FFN 1024; each MoE layer's MLP term is (topk·moe_ffn + shared_ffn)·1.5 (SwiGLU).
TEST(Flops, MoeWithASharedExpertByHand) {
  FlopsModel m;
  m.seq_length = 256;
  m.num_layers = 12;
  m.hidden = 768;
  m.heads = 12;
  m.query_groups = 12;
  m.kv_channels = 64;
  m.ffn = 2048;
  m.padded_vocab = 50304;
  m.swiglu = true;
  m.num_moe_layers = 6;
  m.moe_ffn = 512;
  m.moe_topk = 2;
  m.moe_shared_ffn = 1024;
  const double mlp = 12.0 * 768 * 1.5 * (6 * 2048 + 6 * (2 * 512 + 1024));
  const double per_token = mlp + 12.0 * 12 * 768 * 768 * (2.0 + 256.0 / 1536.0) + 6.0 * 768 * 50304;
  EXPECT_NEAR(num_floating_point_operations(m, 1), 256 * per_token, 1e-6 * 256 * per_token);
}

}  // namespace
}  // namespace gale

namespace gale {
namespace {

// The first hybrid model of the tests below: 32 tokens, hidden 64, "M*-M" (state 16, heads of 16,
// 2 groups), 4 heads of 16 without GQA, FFN 256, vocabulary 4224.
FlopsModel small_hybrid_flops_model() {
  FlopsModel m;
  m.hybrid = true;
  m.seq_length = 32;
  m.hidden = 64;
  m.heads = 4;
  m.query_groups = 4;
  m.kv_channels = 16;
  m.ffn = 256;
  m.padded_vocab = 4224;
  m.attention_layers = 1;
  m.mamba_layers = 2;
  m.mlp_layers = 1;
  m.mamba_state_dim = 16;
  m.mamba_head_dim = 16;
  m.mamba_num_groups = 2;
  return m;
}

// --is-hybrid-model: Megatron's hybrid_flops, values from its training.py (core_v0.12.1) functions
// run standalone: 2 × 32 tokens, hidden 64, "M*-M" (state 16, heads of 16, 2 groups), 4 heads of
// 16 without GQA, FFN 256, vocabulary 4224; and 3 × 128 tokens, hidden 256, 2 attention, 5 Mamba
// (Megatron's default sizes) and 1 MLP layer, 8 heads of 32 in 2 groups, SwiGLU FFN 704, vocab 32000.
TEST(TrainingLog, HybridFlopsAreMegatrons) {
  FlopsModel m = small_hybrid_flops_model();
  EXPECT_DOUBLE_EQ(num_floating_point_operations(m, 2), 151388160.0);
  m.seq_length = 128;
  m.hidden = 256;
  m.heads = 8;
  m.gqa = true;
  m.query_groups = 2;
  m.kv_channels = 32;
  m.ffn = 704;
  m.swiglu = true;
  m.padded_vocab = 32000;
  m.attention_layers = 2;
  m.mamba_layers = 5;
  m.mlp_layers = 1;
  m.mamba_state_dim = 128;
  m.mamba_head_dim = 64;
  m.mamba_num_groups = 8;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(m, 3), 34261696512.0);
}

// Megatron-Core main's hybrid_flops adds num_moe_layers × moe_layer_flops (4·tokens·H·(Fe·k + Fs),
// × 3/2 with SwiGLU) to the forward: the first model above with two 'E' layers of top-2 experts
// of FFN 32 and a shared expert of 32 adds 3 × 2 × 4·64·64·96 = 9437184.
TEST(TrainingLog, HybridFlopsCountTheMoeLayers) {
  FlopsModel m = small_hybrid_flops_model();
  m.num_moe_layers = 2;
  m.moe_ffn = 32;
  m.moe_topk = 2;
  m.moe_shared_ffn = 32;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(m, 2), 151388160.0 + 9437184.0);
  m.swiglu = true;  // the MLP layer's and the MoE layers' GEMMs × 3/2
  const double mlp = 4.0 * 4.0 * 64 * 64 * 64, moe = 9437184.0 / 3.0;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(m, 2), 151388160.0 + 9437184.0 + 3.0 * 0.5 * (mlp + moe));
}

// Megatron-Core main's hybrid_flops adds num_gdn_layers × gdn_layer_flops (2·tokens·(H·(2·qk + 2·v + 2·NV)
// + K·(2·qk + v) + 4·NV·DV² + H·v)), its value from Megatron's function run standalone: the first model
// above with two 'G' layers of 2 key heads of 8 and 4 value heads of 8, convolution width 4, adds 7667712.
TEST(TrainingLog, HybridFlopsCountTheGatedDeltaNetLayers) {
  FlopsModel m = small_hybrid_flops_model();
  m.gdn_layers = 2;
  m.gdn_key_head_dim = 8;
  m.gdn_value_head_dim = 8;
  m.gdn_num_key_heads = 2;
  m.gdn_num_value_heads = 4;
  m.gdn_conv_kernel = 4;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(m, 2), 151388160.0 + 7667712.0);
}

// With use_gdn2 (--experimental-attention-variant gdn2) Megatron's gdn_layer_flops sizes in_proj as
// 4·qk + 3·v = 160 rows instead of 2·qk + 2·v + 2·NV = 104: the same two layers add 10420224.
TEST(TrainingLog, HybridFlopsCountTheGatedDeltaNet2Layers) {
  FlopsModel m = small_hybrid_flops_model();
  m.gdn_layers = 2;
  m.gdn_key_head_dim = 8;
  m.gdn_value_head_dim = 8;
  m.gdn_num_key_heads = 2;
  m.gdn_num_value_heads = 4;
  m.gdn_conv_kernel = 4;
  m.gdn_use_gdn2 = true;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(m, 2), 151388160.0 + 10420224.0);
}

// Megatron-Core main's hybrid_flops with MTP: the logit GEMM (2·tokens·H·V) once per MTP depth more,
// the depths' layers in the layer counts (the trainer adds the pattern's MTP layers, as Megatron's
// get_hybrid_layer_counts): 2 depths of the first model above add 3 × 2 × 2·64·64·4224.
TEST(TrainingLog, HybridFlopsCountTheMtpLogits) {
  FlopsModel m = small_hybrid_flops_model();
  m.mtp_num_layers = 2;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(m, 2), 151388160.0 + 3.0 * 2.0 * 2.0 * 64 * 64 * 4224);
}

}  // namespace
}  // namespace gale
