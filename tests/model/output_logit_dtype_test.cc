// --output-logit-dtype bf16 through GPTModel (ModelConfig::bf16_logits): the training and evaluation
// loss is the float64 cross entropy of the bf16 logits forward_logits returns (every one a bf16
// value), with the reference and the fused LM head; without the flag, of the f32 logits, bit for bit
// the same model as before; the flag changes the loss and the output layer's gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/fused_ops.h"
#include "kernels/cpu/isa.h"
#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

// Σ mask · (lse − logit[label]) in float64 of logits [B, S, V] (sample-major, as MicroBatch's labels).
double cross_entropy_sum(const Tensor& logits, const MicroBatch& mb, int64_t V) {
  const float* l = logits.data<float>();
  double sum = 0.0;
  for (int64_t i = 0; i < mb.B * mb.S; ++i) {
    if (mb.loss_mask[i] == 0.0f) continue;
    const float* row = l + i * V;
    double m = -1e300, se = 0.0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(row[v]));
    for (int64_t v = 0; v < V; ++v) se += std::exp(row[v] - m);
    sum += mb.loss_mask[i] * (m + std::log(se) - row[mb.labels[i]]);
  }
  return sum;
}

struct Result {
  double train_loss = 0.0, eval_loss = 0.0, logits_loss = 0.0;
  bool all_bf16 = true;
  std::vector<float> grads;
};

Result run(bool bf16_logits, bool fused) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.bf16_logits = bf16_logits;
  OpTable ops = reference_ops();
  if (fused) GALE_CHECK(install_all_fused_kernels(ops, detected_isa()).ok());
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(5);
  const MicroBatch mb = testing::masked_batch(c, 2, 13, false);
  Result r;
  GPTModel::LossSums train, eval;
  model.forward(0, mb, Tensor(), /*training=*/true, &train);
  model.params().zero_grads();
  model.backward(0, Tensor(), static_cast<float>(1.0 / train.tokens));
  model.forward(0, mb, Tensor(), /*training=*/false, &eval);
  r.train_loss = train.loss_sum;
  r.eval_loss = eval.loss_sum;
  const Tensor logits = model.forward_logits(mb, Tensor());
  r.logits_loss = cross_entropy_sum(logits, mb, c.vocab);
  for (int64_t i = 0; i < logits.numel(); ++i) {
    const float v = logits.data<float>()[i];
    r.all_bf16 = r.all_bf16 && v == bf16_to_float(float_to_bf16(v));
  }
  const ParamBuffer& pb = model.params();
  r.grads.assign(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  return r;
}

TEST(OutputLogitDtype, LossIsTheCrossEntropyOfTheBf16Logits) {
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused LM head" : "reference LM head");
    const Result bf16 = run(true, fused), f32 = run(false, fused);
    EXPECT_TRUE(bf16.all_bf16);
    EXPECT_FALSE(f32.all_bf16);
    EXPECT_NEAR(bf16.train_loss, bf16.logits_loss, 1e-5 * std::fabs(bf16.logits_loss));
    EXPECT_NEAR(bf16.eval_loss, bf16.logits_loss, 1e-5 * std::fabs(bf16.logits_loss));
    EXPECT_NEAR(f32.train_loss, f32.logits_loss, 1e-5 * std::fabs(f32.logits_loss));
    EXPECT_GT(std::fabs(bf16.train_loss - f32.train_loss), 3e-5 * std::fabs(f32.train_loss));  // 7e-5 here
    EXPECT_NE(bf16.grads, f32.grads);
  }
}

// fp32 (and the default) is the model without the flag: ModelConfig's default is f32 logits.
TEST(OutputLogitDtype, DefaultIsF32Logits) { EXPECT_FALSE(ModelConfig().bf16_logits); }

}  // namespace
}  // namespace gale
