// LoRA on MoE models (model/lora_expert.h): adapters on every routed expert's linear_fc1 (SwiGLU's
// [gate; up] as one) and linear_fc2, and on the shared experts', beside the dense layers' and
// attention's, with peft's names; every adapter gradient by finite differences; the adapted model
// starts at the base and equals the base with W += (alpha / r)·B·A merged into each expert; under
// expert TP the adapters are split as the experts.
#include "model/lora_expert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "model/gpt_model.h"
#include "model/lora_modules.h"
#include "model/lora_merge_check.h"
#include "model/moe_layer.h"
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

// lora_moe_config with a gated SwiGLU shared expert in each MoE layer.
ModelConfig lora_shared_config() {
  ModelConfig c = lora_moe_config();
  c.moe.shared_ffn = 10;
  c.moe.shared_gate = true;
  return c;
}

// Every trainable parameter's gradient (the adapters') against central differences of the loss on
// one batch; returns how many adapters whose name holds `part` got a gradient.
int expect_adapter_gradients_match(GPTModel& model, const ModelConfig& c, const std::string& part) {
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
    checked += pb.spec(id).name.find(part) != std::string::npos && std::fabs(analytic) > 1e-6;
  }
  return checked;
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
  EXPECT_GE(expect_adapter_gradients_match(model, c, "local_experts"), 16) << "most expert adapters get a gradient";
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

TEST(LoraExperts, SharedExpertsGetAdaptersWithPeftNames) {
  const ModelConfig c = lora_shared_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  const int64_t r = 3, H = c.hidden, Fs = c.moe.shared_ffn;
  for (int layer : {0, 2}) {
    const std::string p = str_cat("decoder.layers.", layer, ".mlp.shared_experts.");
    const int a1 = pb.find(p + "linear_fc1.lora_A.default.weight"), b1 = pb.find(p + "linear_fc1.lora_B.default.weight");
    const int a2 = pb.find(p + "linear_fc2.lora_A.default.weight"), b2 = pb.find(p + "linear_fc2.lora_B.default.weight");
    ASSERT_TRUE(a1 >= 0 && b1 >= 0 && a2 >= 0 && b2 >= 0) << p;
    EXPECT_EQ(pb.spec(a1).global_shape, (Shape{r, H}));
    EXPECT_EQ(pb.spec(b1).global_shape, (Shape{2 * Fs, r}));
    EXPECT_EQ(pb.spec(a2).global_shape, (Shape{r, Fs}));
    EXPECT_EQ(pb.spec(b2).global_shape, (Shape{H, r}));
    EXPECT_LT(pb.find(p + "gate_weight.lora_A.default.weight"), 0) << "the gate is not a target";
  }
  int adapters = 0;
  for (const ParamSpec& s : pb.specs()) {
    EXPECT_EQ(s.trainable, is_lora_adapter(s.name)) << s.name;  // the shared experts and their gate frozen
    adapters += is_lora_adapter(s.name);
  }
  EXPECT_EQ(adapters, 2 * (3 + 2 + 2 * 4 * 2 + 2 * 2));
}

TEST(LoraExperts, SharedExpertAdapterGradientsMatchFiniteDifferences) {
  const ModelConfig c = lora_shared_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  EXPECT_EQ(expect_adapter_gradients_match(model, c, "shared_experts"), 8) << "every shared-expert factor";
}

TEST(LoraExperts, SharedExpertAdaptersStartAtTheBaseAndMerge) {
  const ModelConfig lc = lora_shared_config();
  ModelConfig bc = testing::tiny_moe_config();
  bc.moe.shared_ffn = lc.moe.shared_ffn;
  bc.moe.shared_gate = true;
  OpTable ops = reference_ops();
  GPTModel lora(lc, single_process_partition(lc), &ops), base(bc, single_process_partition(bc), &ops);
  lora.params().initialize(5);
  base.params().initialize(5);
  MicroBatch mb = testing::tiny_batch(lc, 2, 9, /*documents=*/false);
  testing::expect_lora_starts_at_base_and_merges(lora, base, lc, mb, 3 + 2 + 2 * 4 * 2 + 2 * 2, 1e-5, 1e-3);
}

// Expert TP 2 (rank 1 of 2): fc1's lora_B split on its rows as fc1 (each of SwiGLU's [gate; up]
// halves) with lora_A whole, fc2's lora_A split on its columns as fc2 with lora_B whole; the whole
// factor's gradient is partial over the group (marked sequence_parallel: all-reduced over TP = ETP).
TEST(LoraExperts, ExpertTensorParallelismSplitsTheAdaptersAsTheExperts) {
  const ModelConfig c = lora_moe_config();
  ParamBuffer pb;
  register_moe_params(pb, c, 0, /*ep_size=*/2, /*ep_rank=*/1, /*etp_size=*/2, /*etp_rank=*/1);
  const int64_t r = 3, H = c.hidden, Fe = c.moe.ffn;
  const std::string p = "decoder.layers.0.mlp.experts.local_experts.1.";
  const ParamSpec& fc1 = pb.spec(pb.find(p + "linear_fc1.weight"));
  const ParamSpec& a1 = pb.spec(pb.find(p + "linear_fc1.lora_A.default.weight"));
  const ParamSpec& b1 = pb.spec(pb.find(p + "linear_fc1.lora_B.default.weight"));
  const ParamSpec& a2 = pb.spec(pb.find(p + "linear_fc2.lora_A.default.weight"));
  const ParamSpec& b2 = pb.spec(pb.find(p + "linear_fc2.lora_B.default.weight"));
  EXPECT_EQ(fc1.local_shape(), (Shape{Fe, H}));  // 2Fe rows over 2 ranks
  EXPECT_EQ(a1.local_shape(), (Shape{r, H}));
  EXPECT_EQ(b1.local_shape(), (Shape{Fe, r}));
  EXPECT_EQ(b1.split_dim, 0);
  EXPECT_EQ(b1.split_blocks, 2);
  EXPECT_EQ(b1.split_rank, 1);
  EXPECT_EQ(a2.local_shape(), (Shape{r, Fe / 2}));
  EXPECT_EQ(a2.split_dim, 1);
  EXPECT_EQ(b2.local_shape(), (Shape{H, r}));
  EXPECT_TRUE(a1.sequence_parallel && b2.sequence_parallel);
  EXPECT_FALSE(b1.sequence_parallel || a2.sequence_parallel);
  for (const ParamSpec* s : {&a1, &b1, &a2, &b2}) EXPECT_TRUE(s->expert_parallel) << s->name;
  EXPECT_EQ(b1.global_name, "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.lora_B.default.weight");
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
