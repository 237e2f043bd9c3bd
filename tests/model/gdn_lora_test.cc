// LoRA on a Gated DeltaNet model (model/lora.h; tiny_gdn_config: GDN layers 0, 2, 3 and attention
// layers 1, 4): adapters on the GDN mixers' in_proj / out_proj, the attention layers' linear_qkv /
// linear_proj and every layer's linear_fc1 / linear_fc2 train alone (the rest of the base frozen),
// their gradients match finite differences through the GDN layers, the adapted model starts at the
// base and merging W += s·B·A gives the adapted logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "model/gdn_test_model.h"
#include "model/gpt_model.h"
#include "model/lora.h"
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

ModelConfig gdn_lora_config() {
  ModelConfig c = testing::tiny_gdn_config();
  c.lora.r = 3;
  c.lora.alpha = 6.0;
  c.lora.qkv = c.lora.proj = c.lora.fc1 = c.lora.fc2 = c.lora.in_proj = c.lora.out_proj = true;
  c.seq_length = 16;  // within the RoPE table of max_positions 48
  return c;
}

TEST(GdnLora, OnlyAdaptersTrainAndTheirGradientsMatchFiniteDifferences) {
  const ModelConfig c = gdn_lora_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  ParamBuffer& pb = model.params();
  pb.initialize(42);
  testing::make_gdn_state_carry(model);
  testing::randomise_lora_b(pb, 77);
  int64_t adapters = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    const bool is_lora = s.name.find(".lora_") != std::string::npos;
    EXPECT_EQ(s.trainable, is_lora) << s.name;
    adapters += is_lora;
  }
  // 2 attention layers x 4 linears + 3 GDN layers x (in_proj, out_proj and 2 MLP linears), A and B each.
  EXPECT_EQ(adapters, 2 * (2 * 4 + 3 * 4));
  EXPECT_GE(pb.find("decoder.layers.0.mlp.linear_fc1.lora_A.default.weight"), 0);
  EXPECT_GE(pb.find("decoder.layers.0.self_attention.in_proj.lora_A.default.weight"), 0);
  EXPECT_GE(pb.find("decoder.layers.3.self_attention.out_proj.lora_B.default.weight"), 0);
  EXPECT_LT(pb.find("decoder.layers.0.self_attention.linear_qkv.lora_A.default.weight"), 0);
  const std::vector<float> base_before(pb.flat_params().data<float>() + pb.trainable_numel(),
                                       pb.flat_params().data<float>() + pb.numel());
  MicroBatch mb = testing::tiny_batch(c, 2, 7, /*documents=*/false);
  testing::mean_loss(model, mb, true);
  std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.trainable_numel());
  auto loss = [&] { return testing::mean_loss(model, mb, false); };
  for (int id = 0; id < pb.size(); ++id) {
    if (!pb.spec(id).trainable) continue;
    const int64_t n = pb.spec(id).local_numel();
    auto dir = random_vector(n, 100 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative(loss, pb.param_data(id), dir.data(), n, 1e-3);
    EXPECT_LT(rel_diff(analytic, numeric, 2e-3), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
  }
  EXPECT_EQ(0, std::memcmp(base_before.data(), pb.flat_params().data<float>() + pb.trainable_numel(),
                           base_before.size() * sizeof(float)));
}

TEST(GdnLora, StartsAtTheBaseModelAndMergesIntoIt) {
  const ModelConfig lc = gdn_lora_config();
  ModelConfig bc = testing::tiny_gdn_config();
  bc.seq_length = lc.seq_length;
  OpTable ops = reference_ops();
  GPTModel lora(lc, single_process_partition(lc), &ops), base(bc, single_process_partition(bc), &ops);
  lora.params().initialize(5);
  base.params().initialize(5);
  MicroBatch mb = testing::tiny_batch(lc, 2, 9, /*documents=*/false);
  // f32 rounding of 20 merged weights (through the GDN recurrence): ~1e-5; the adapters move the logits > 1e-2.
  testing::expect_lora_starts_at_base_and_merges(lora, base, lc, mb, 2 * 4 + 3 * 4, 5e-5, 1e-2);
}

}  // namespace
}  // namespace gale
