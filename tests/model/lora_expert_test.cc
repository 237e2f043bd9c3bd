// LoRA on MoE models (model/lora_expert.h): adapters on every routed expert's linear_fc1 (SwiGLU's
// [gate; up] as one) and linear_fc2 beside the dense layers' and attention's, with peft's names;
// every adapter gradient by finite differences; the adapted model starts at the base and equals
// the base with W += (alpha / r)·B·A merged into each expert.
#include "model/lora_expert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "model/gpt_model.h"
#include "model/lora_modules.h"
#include "model/lora_merge_check.h"
#include "model_test_batches.h"
#include "testing.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

using testing::directional_derivative;
using testing::dot;
using testing::fill_random;
using testing::random_vector;
using testing::rel_diff;

ModelConfig lora_moe_config() {
  ModelConfig c = testing::tiny_moe_config();  // layers 0 and 2 MoE (4 SwiGLU experts, top-2), layer 1 dense
  // No load-balancing loss: testing::mean_loss returns the LM loss only, while backward would add
  // the aux loss's gradient (through the routers into the earlier layers), which the finite
  // differences would not see.
  c.moe.aux_loss_coeff = 0.0;
  c.lora.r = 3;
  c.lora.alpha = 6.0;
  c.lora.qkv = c.lora.fc1 = c.lora.fc2 = true;
  return c;
}

TEST(LoraExperts, EveryRoutedExpertGetsAdaptersWithPeftNames) {
  const ModelConfig c = lora_moe_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  const int64_t r = 3, H = c.hidden, Fe = c.moe.ffn;
  for (int64_t e = 0; e < c.moe.num_experts; ++e)
    for (int layer : {0, 2}) {
      const std::string p = str_cat("decoder.layers.", layer, ".mlp.experts.local_experts.", e, ".");
      const int a1 = pb.find(p + "linear_fc1.lora_A.default.weight"), b1 = pb.find(p + "linear_fc1.lora_B.default.weight");
      const int a2 = pb.find(p + "linear_fc2.lora_A.default.weight"), b2 = pb.find(p + "linear_fc2.lora_B.default.weight");
      ASSERT_TRUE(a1 >= 0 && b1 >= 0 && a2 >= 0 && b2 >= 0) << p;
      EXPECT_EQ(pb.spec(a1).global_shape, (Shape{r, H}));
      EXPECT_EQ(pb.spec(b1).global_shape, (Shape{2 * Fe, r}));  // SwiGLU: the whole [gate; up]
      EXPECT_EQ(pb.spec(a2).global_shape, (Shape{r, Fe}));
      EXPECT_EQ(pb.spec(b2).global_shape, (Shape{H, r}));
    }
  EXPECT_GE(pb.find("decoder.layers.1.mlp.linear_fc1.lora_A.default.weight"), 0);  // the dense layer's
  int adapters = 0;
  for (const ParamSpec& s : pb.specs()) {
    EXPECT_EQ(s.trainable, is_lora_adapter(s.name)) << s.name;  // router and experts frozen
    EXPECT_EQ(s.name.find("router.lora"), std::string::npos) << s.name;
    adapters += is_lora_adapter(s.name);
  }
  // linear_qkv (3 layers) + dense fc1, fc2 (1 layer) + 4 experts' fc1, fc2 (2 layers), A and B each.
  EXPECT_EQ(adapters, 2 * (3 + 2 + 2 * 4 * 2));
}

TEST(LoraExperts, AdapterGradientsMatchFiniteDifferences) {
  const ModelConfig c = lora_moe_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  ParamBuffer& pb = model.params();
  pb.initialize(42);
  testing::randomise_lora_b(pb, 77);
  MicroBatch mb = testing::tiny_batch(c, 2, 7, /*documents=*/false);
  testing::mean_loss(model, mb, true);
  std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.trainable_numel());
  auto loss = [&] { return testing::mean_loss(model, mb, false); };
  int checked = 0;
  for (int id = 0; id < pb.size(); ++id) {
    if (!pb.spec(id).trainable) continue;
    const int64_t n = pb.spec(id).local_numel();
    auto dir = random_vector(n, 100 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative(loss, pb.param_data(id), dir.data(), n, 1e-3);
    // Relative, or absolute below 1e-2 (float32 losses: differences of ~1e-5 at eps 1e-3).
    EXPECT_LT(rel_diff(analytic, numeric, 1e-2), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
    checked += pb.spec(id).name.find("local_experts") != std::string::npos && std::fabs(analytic) > 1e-6;
  }
  EXPECT_GE(checked, 16) << "most expert adapters get a gradient";
}

TEST(LoraExperts, StartsAtTheBaseAndMergesIntoTheExperts) {
  const ModelConfig lc = lora_moe_config();
  ModelConfig bc = testing::tiny_moe_config();
  OpTable ops = reference_ops();
  GPTModel lora(lc, single_process_partition(lc), &ops), base(bc, single_process_partition(bc), &ops);
  lora.params().initialize(5);
  base.params().initialize(5);
  MicroBatch mb = testing::tiny_batch(lc, 2, 9, /*documents=*/false);
  testing::expect_lora_starts_at_base_and_merges(lora, base, lc, mb, 3 + 2 + 2 * 4 * 2, 1e-5, 1e-3);
}

// The split backward equals lora_backward (model/lora.h) term by term.
TEST(LoraExperts, SplitBackwardEqualsTheWholeOne) {
  const int64_t M = 5, in = 6, out = 7, r = 3;
  auto a = random_vector(r * in, 1), b = random_vector(out * r, 2), x = random_vector(M * in, 3), dy = random_vector(M * out, 4);
  std::vector<float> ga1(a.size(), 0.f), gb1(b.size(), 0.f), ga2(a.size(), 0.f), gb2(b.size(), 0.f);
  LoraWeights l1{a.data(), b.data(), ga1.data(), gb1.data(), r, out, in, 2.5f, sgemm};
  LoraWeights l2{a.data(), b.data(), ga2.data(), gb2.data(), r, out, in, 2.5f, sgemm};
  Tensor xt = Tensor::from_blob(x.data(), {M, in}, DType::kF32), dyt = Tensor::from_blob(dy.data(), {M, out}, DType::kF32);
  Tensor y = Tensor::zeros({M, out});
  Tensor u = lora_forward(xt, l1, y);
  Tensor dx1 = Tensor::zeros({M, in}), dx2 = Tensor::zeros({M, in});
  lora_backward(dyt, xt, u, l1, dx1);
  lora_backward_input(dyt, l2, dx2);
  lora_backward_weights(dyt, xt, l2);
  for (int64_t i = 0; i < dx1.numel(); ++i) EXPECT_FLOAT_EQ(dx1.data<float>()[i], dx2.data<float>()[i]);
  for (size_t i = 0; i < ga1.size(); ++i) EXPECT_FLOAT_EQ(ga1[i], ga2[i]);
  for (size_t i = 0; i < gb1.size(); ++i) EXPECT_FLOAT_EQ(gb1[i], gb2[i]);
}

}  // namespace
}  // namespace gale
