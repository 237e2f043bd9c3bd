// GPTModel's head logits hook (model/head_logits_hook.h): the hook sees every forward's logits
// (evaluation's too, where only its report_lm_loss counts), its factor scales the cross-entropy's gradient, its logit gradient
// goes through the output layer under the loss scale, and it can zero the reported LM loss.
#include "model/head_logits_hook.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "kernels/cpu/fused_ops.h"
#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

// A hook whose Result is made by `make` from the logits and the micro-batch; counts its calls.
struct TestHook final : HeadLogitsHook {
  std::function<Result(const MicroBatch&, const Tensor&, const std::vector<float>&)> make;
  int calls = 0;
  double lm_seen = -1.0, tokens_seen = -1.0;
  Tensor logits_seen;
  Result training_logits(const MicroBatch& mb, const Tensor& logits, const std::vector<float>& mask,
                         int64_t vocab_offset) override {
    EXPECT_EQ(vocab_offset, 0);
    ++calls;
    logits_seen = logits.clone();
    return make(mb, logits, mask);
  }
  void training_lm_loss(double loss_sum, double tokens) override {
    lm_seen = loss_sum;
    tokens_seen = tokens;
  }
};

struct Trained {
  std::vector<float> grads;
  double loss_sum = 0.0;
};

Trained train_once(GPTModel& model, const MicroBatch& mb, float loss_scale) {
  ParamBuffer& pb = model.params();
  pb.zero_grads();
  GPTModel::LossSums s;
  model.forward(0, mb, Tensor(), true, &s);
  model.backward(0, Tensor(), loss_scale);
  return {std::vector<float>(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel()), s.loss_sum};
}

class HeadLogitsHookTest : public ::testing::Test {
 protected:
  HeadLogitsHookTest() : c_(testing::gradcheck_gpt_config()), ops_(reference_ops()), model_(c_, single_process_partition(c_), &ops_) {
    model_.params().initialize(5);
    mb_ = testing::masked_batch(c_, 2, 21, false);  // B = 2: rows t = s·B + b, some tokens masked
  }
  ModelConfig c_;
  OpTable ops_;
  GPTModel model_;
  MicroBatch mb_;
};

TEST_F(HeadLogitsHookTest, LmFactorScalesTheGradientAndTheLossIsReportedOrZeroed) {
  const float scale = 1.0f / 7.0f;
  const Trained plain = train_once(model_, mb_, scale);
  TestHook hook;
  hook.make = [](const MicroBatch&, const Tensor&, const std::vector<float>&) {
    HeadLogitsHook::Result r;
    r.lm_coef = 0.5;
    return r;
  };
  model_.set_head_logits_hook(&hook);
  const Trained half = train_once(model_, mb_, scale);
  EXPECT_EQ(hook.calls, 1);
  EXPECT_EQ(half.loss_sum, plain.loss_sum);
  EXPECT_EQ(hook.lm_seen, plain.loss_sum);
  double tokens = 0.0;
  for (float m : mb_.loss_mask) tokens += m;
  EXPECT_EQ(hook.tokens_seen, tokens);
  for (size_t i = 0; i < plain.grads.size(); ++i) ASSERT_EQ(half.grads[i], 0.5f * plain.grads[i]) << i;
  // Not differentiated and not reported: no gradient at all, loss 0.
  hook.make = [](const MicroBatch&, const Tensor&, const std::vector<float>&) {
    HeadLogitsHook::Result r;
    r.lm_coef = 0.0;
    r.report_lm_loss = false;
    return r;
  };
  const Trained none = train_once(model_, mb_, scale);
  EXPECT_EQ(none.loss_sum, 0.0);
  EXPECT_EQ(hook.lm_seen, plain.loss_sum);  // the hook still sees the LM loss
  for (float g : none.grads) ASSERT_EQ(g, 0.0f);
  // Evaluation forwards call the hook too; only report_lm_loss counts there (nothing is kept).
  GPTModel::LossSums s;
  model_.forward(1, mb_, Tensor(), false, &s);
  EXPECT_EQ(hook.calls, 3);
  EXPECT_EQ(s.loss_sum, 0.0);
  EXPECT_EQ(model_.in_flight(), 0u);
}

// The hook's logit gradient of the cross-entropy itself, mask·(softmax − one-hot), with the LM
// term off: the plain run's gradients (the logits it saw are the model's, rows in [S, B] order).
TEST_F(HeadLogitsHookTest, LogitGradientGoesThroughTheOutputLayerUnderTheLossScale) {
  const float scale = 1.0f / 7.0f;
  const Trained plain = train_once(model_, mb_, scale);
  TestHook hook;
  hook.make = [](const MicroBatch& mb, const Tensor& logits, const std::vector<float>& mask) {
    const int64_t T = logits.size(0), V = logits.size(1), B = mb.B, S = mb.S;
    HeadLogitsHook::Result r;
    r.lm_coef = 0.0;
    r.logit_grad = Tensor::empty({T, V});
    for (int64_t t = 0; t < T; ++t) {
      const float* z = logits.data<float>() + t * V;
      double m = -INFINITY, sum = 0.0;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(z[v]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - m);
      const int64_t b = t % B, s = t / B;
      const int32_t label = mb.labels[static_cast<size_t>(b * S + s)];
      for (int64_t v = 0; v < V; ++v)
        r.logit_grad.data<float>()[t * V + v] =
            static_cast<float>(mask[static_cast<size_t>(t)] * (std::exp(z[v] - m) / sum - (v == label ? 1.0 : 0.0)));
    }
    return r;
  };
  model_.set_head_logits_hook(&hook);
  const Trained hooked = train_once(model_, mb_, scale);
  EXPECT_EQ(hooked.loss_sum, plain.loss_sum);
  double norm = 0.0;
  for (float g : plain.grads) norm = std::max(norm, static_cast<double>(std::fabs(g)));
  ASSERT_GT(norm, 0.0);
  for (size_t i = 0; i < plain.grads.size(); ++i) ASSERT_NEAR(hooked.grads[i], plain.grads[i], 1e-5 * norm) << i;
  // The logits handed over are the evaluation logits ([B, S, V] sample-major there).
  const Tensor eval = model_.forward_logits(mb_, Tensor());
  const int64_t V = c_.vocab;
  for (int64_t s = 0; s < mb_.S; ++s)
    for (int64_t b = 0; b < mb_.B; ++b)
      for (int64_t v = 0; v < V; ++v)
        ASSERT_NEAR(hook.logits_seen.data<float>()[(s * mb_.B + b) * V + v], eval.data<float>()[(b * mb_.S + s) * V + v],
                    1e-5f);
}

}  // namespace
}  // namespace gale
