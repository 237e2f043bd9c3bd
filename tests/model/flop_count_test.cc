// --op-cal-tflops (kernels/flop_counter.h) on whole models: the FLOPs the counting op table sees in
// one training micro-batch equal the products written out by hand, for the reference and the fused
// kernels (flash attention: the whole causal score matrix counts), in fp32 and bf16, and
// recomputation (full, --recompute-modules mlp, the fused LM head's logits) adds exactly the forward
// work it reruns to the "with recompute" count only.
#include <gtest/gtest.h>

#include "kernels/cpu/fused_ops.h"
#include "kernels/flop_counter.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

using testing::tiny_batch;
using testing::tiny_gpt_config;
using testing::tiny_llama_config;

// The FLOPs of one layer's forward, written out: each linear layer's product 2·T·in·out, and the
// attention's QKᵀ and PV over every query head and the whole S×S score matrix (the causal mask
// hides half of it; the count, as MindSpeed's, does not care).
struct LayerForward {
  int64_t gemm = 0, attention = 0;
};
LayerForward layer_forward(const ModelConfig& c, int64_t B) {
  const int64_t S = c.seq_length, T = B * S, H = c.hidden, F = c.ffn, NH = c.heads, KV = c.kv_heads, HD = c.head_dim;
  const int64_t qkv = 2 * T * H * (NH + 2 * KV) * HD;  // [T, H] x [H, (NH + 2KV)·HD]
  const int64_t proj = 2 * T * (NH * HD) * H;
  const int64_t fc1 = 2 * T * H * (c.swiglu ? 2 * F : F);
  const int64_t fc2 = 2 * T * F * H;
  const int64_t scores = 2 * B * NH * S * S * HD;  // QKᵀ
  const int64_t context = 2 * B * NH * S * S * HD;  // PV
  return {qkv + proj + fc1 + fc2, scores + context};
}

// The output layer's forward product [T, H] x [H, V].
int64_t head_forward(const ModelConfig& c, int64_t B) { return 2 * B * c.seq_length * c.hidden * c.vocab; }

// Forward and backward of one micro-batch of B samples: a linear layer's backward is two products
// of its forward's size (dX and dW), attention's backward four (dV, dP, dQ, dK) to forward's two.
int64_t training_step(const ModelConfig& c, int64_t B) {
  const LayerForward l = layer_forward(c, B);
  return c.num_layers * (3 * l.gemm + 3 * l.attention) + 3 * head_forward(c, B);
}

// Counts one forward + backward of `mb` on `ops` (which must count).
FlopCounts count_step(const ModelConfig& c, const OpTable& ops, const MicroBatch& mb) {
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(7);
  GPTModel::LossSums sums;
  flop_counter_start();
  model.forward(0, mb, Tensor(), /*training=*/true, &sums);
  model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  flop_counter_stop();
  return flop_counter_counts();
}

OpTable counting(OpTable ops) {
  install_flop_counting(&ops);
  return ops;
}

OpTable fused_ops() {
  OpTable ops = reference_ops();
  GALE_CHECK_OK(install_all_fused_kernels(ops, detected_isa()));
  return ops;
}

TEST(FlopCounter, CountsGemmsAndAttentionByTheirShapes) {
  EXPECT_EQ(gemm_flops(3, 5, 7), 210);
  AttentionProblem p;
  p.B = 2;
  p.Sq = 3;
  p.Sk = 5;
  p.NH = 4;
  p.KV = 2;  // GQA counts the query heads
  p.HD = 8;
  EXPECT_EQ(attention_forward_flops(p), 4 * 2 * 4 * 3 * 5 * 8);
  EXPECT_EQ(attention_backward_flops(p), 8 * 2 * 4 * 3 * 5 * 8);
}

TEST(FlopCounter, CountsOnlyBetweenStartAndStopAndRecomputationApart) {
  const OpTable ops = counting(reference_ops());
  EXPECT_TRUE(counts_flops(ops));
  EXPECT_FALSE(counts_flops(reference_ops()));
  std::vector<float> a(6, 1.0f), b(6, 1.0f), c(4, 0.0f);
  ops.gemm(false, false, 2, 2, 3, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2);  // not counting yet
  flop_counter_start();
  EXPECT_EQ(flop_counter_counts().with_recompute, 0);
  ops.gemm(false, false, 2, 2, 3, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2);
  EXPECT_EQ(c[0], 3.0f);  // the wrapped GEMM ran
  {
    FlopCountRecompute recompute;
    ops.gemm(false, false, 2, 2, 3, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2);
  }
  flop_counter_stop();
  ops.gemm(false, false, 2, 2, 3, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2);
  EXPECT_EQ(flop_counter_counts().model, 24);
  EXPECT_EQ(flop_counter_counts().with_recompute, 48);
  OpTable twice = ops;
  install_flop_counting(&twice);  // already counting: unchanged, nothing counted twice
  EXPECT_EQ(twice.gemm, ops.gemm);
}

TEST(FlopCount, DenseGptStepIsTheWrittenOutCount) {
  const ModelConfig c = tiny_gpt_config();
  const int64_t B = 2;
  // 2 layers, B = 2, S = 70 (T = 140), H = 48, F = 100, NH = KV = 3, HD = 16, V = 97: per layer
  // 5,268,480 GEMM and 1,881,600 attention FLOPs forward; the head 1,303,680.
  EXPECT_EQ(layer_forward(c, B).gemm, 5268480);
  EXPECT_EQ(layer_forward(c, B).attention, 1881600);
  EXPECT_EQ(head_forward(c, B), 1303680);
  const int64_t expected = 2 * 3 * (5268480 + 1881600) + 3 * 1303680;  // 46,811,520
  EXPECT_EQ(expected, 46811520);
  EXPECT_EQ(training_step(c, B), expected);
  const FlopCounts n = count_step(c, counting(reference_ops()), tiny_batch(c, B, 11, false));
  EXPECT_EQ(n.model, expected);
  EXPECT_EQ(n.with_recompute, expected);  // nothing recomputed
}

TEST(FlopCount, FusedKernelsAndFlashAttentionCountTheSame) {
  // Flash attention skips the tiles the causal (and here document) mask hides; the count is that of
  // the whole score matrix all the same, as MindSpeed counts npu_fusion_attention from its shapes.
  const OpTable ops = counting(fused_ops());
  for (const ModelConfig& c : {tiny_gpt_config(), tiny_llama_config()}) {  // LLaMA: GQA, SwiGLU, untied head
    const FlopCounts n = count_step(c, ops, tiny_batch(c, 2, 12, /*documents=*/true));
    EXPECT_EQ(n.model, training_step(c, 2)) << (c.swiglu ? "llama" : "gpt");
    // The fused LM head keeps no logits when the loss gradient is not known in forward (here:
    // backward gets it): its backward recomputes them, one more head product, with recompute only.
    EXPECT_EQ(n.with_recompute - n.model, head_forward(c, 2)) << (c.swiglu ? "llama" : "gpt");
  }
}

TEST(FlopCount, Bf16GemmsAreCounted) {
  ModelConfig c = tiny_gpt_config();
  c.bf16 = true;  // the linear layers run OpTable::bf16_gemm
  const FlopCounts n = count_step(c, counting(reference_ops()), tiny_batch(c, 2, 13, false));
  EXPECT_EQ(n.model, training_step(c, 2));
}

TEST(FlopCount, FullRecomputeAddsOneForwardToTheCountWithRecompute) {
  ModelConfig c = tiny_gpt_config();
  c.full_recompute.method = FullRecompute::Method::kUniform;
  c.full_recompute.num_layers = 1;  // every layer reruns its forward in backward
  const FlopCounts n = count_step(c, counting(reference_ops()), tiny_batch(c, 2, 14, false));
  const LayerForward l = layer_forward(c, 2);
  EXPECT_EQ(n.model, training_step(c, 2));  // what the model needs: the same as without recompute
  EXPECT_EQ(n.with_recompute - n.model, c.num_layers * (l.gemm + l.attention));  // the layers' forward, once more
}

TEST(FlopCount, RecomputedMlpAddsItsFirstLinearLayer) {
  ModelConfig c = tiny_gpt_config();
  c.recompute.mlp = true;  // --recompute-modules mlp: backward reruns fc1 (and the activation)
  const FlopCounts n = count_step(c, counting(reference_ops()), tiny_batch(c, 2, 15, false));
  EXPECT_EQ(n.model, training_step(c, 2));
  EXPECT_EQ(n.with_recompute - n.model, c.num_layers * 2 * 2 * c.seq_length * c.hidden * c.ffn);
}

}  // namespace
}  // namespace gale
