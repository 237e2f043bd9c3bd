// --lora-modules-to-save (model/lora_modules.h): peft's module-name matching, and a LoRA model
// whose embedding, output layer and final norm train whole beside the adapters (gradients by
// finite differences, tied and untied embeddings; everything else frozen).
#include "model/lora_modules.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "model/gpt_model.h"
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

TEST(LoraModulesToSave, MatchesModulePathsAsPeft) {
  const std::vector<std::string> m = {"word_embeddings", "final_layernorm"};
  EXPECT_TRUE(lora_saves_module(m, "embedding.word_embeddings.weight"));
  EXPECT_TRUE(lora_saves_module(m, "decoder.final_layernorm.weight"));
  EXPECT_TRUE(lora_saves_module(m, "decoder.final_layernorm.bias"));
  EXPECT_FALSE(lora_saves_module(m, "output_layer.weight"));
  EXPECT_FALSE(lora_saves_module(m, "embedding.position_embeddings.weight"));
  EXPECT_FALSE(lora_saves_module(m, "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"));
  // A suffix counts at a component boundary only, and the tensor's own name is no module.
  EXPECT_FALSE(lora_saves_module({"layernorm"}, "decoder.final_layernorm.weight"));
  EXPECT_FALSE(lora_saves_module({"weight"}, "output_layer.weight"));
  EXPECT_TRUE(lora_saves_module({"output_layer"}, "output_layer.weight"));
  EXPECT_TRUE(lora_saves_module({"decoder.final_layernorm"}, "decoder.final_layernorm.weight"));
  EXPECT_FALSE(lora_saves_module({}, "output_layer.weight"));
  // The adapters are never modules to save, even inside a named module.
  EXPECT_FALSE(lora_saves_module({"linear_qkv"}, "decoder.layers.0.self_attention.linear_qkv.lora_A.default.weight"));
  EXPECT_TRUE(is_lora_adapter("decoder.layers.0.mlp.linear_fc2.lora_B.default.weight"));
  EXPECT_FALSE(is_lora_adapter("decoder.layers.0.mlp.linear_fc2.weight"));
}

struct Case {
  bool llama, tied;
  std::vector<std::string> modules;
};

ModelConfig config_of(const Case& k) {
  ModelConfig c = testing::gradcheck_gpt_config();
  if (k.llama) {
    use_llama_architecture(c);
    c.heads = 4;
    c.head_dim = 4;
  }
  c.tied_embeddings = k.tied;
  c.lora.r = 3;
  c.lora.alpha = 6.0;
  c.lora.qkv = c.lora.fc2 = true;
  c.lora.modules_to_save = k.modules;
  return c;
}

class LoraModulesModel : public ::testing::TestWithParam<Case> {};

TEST_P(LoraModulesModel, SavedModulesTrainWholeAndTheirGradientsMatchFiniteDifferences) {
  const ModelConfig c = config_of(GetParam());
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  ParamBuffer& pb = model.params();
  pb.initialize(42);
  for (int id = 0; id < pb.size(); ++id)  // B starts at zero, which would make every dA zero
    if (pb.spec(id).name.find(".lora_B.") != std::string::npos)
      fill_random(pb.param_data(id), pb.spec(id).local_numel(), 77 + id, 0.3f);
  int saved = 0, adapters = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    const bool module = lora_saves_module(c.lora.modules_to_save, s.name);
    EXPECT_EQ(s.trainable, module || is_lora_adapter(s.name)) << s.name;
    saved += module;
    adapters += is_lora_adapter(s.name);
  }
  // word_embeddings; output_layer (untied); final_layernorm (weight, and bias in the GPT model).
  int expected = 0;
  for (const std::string& m : c.lora.modules_to_save)
    expected += m == "final_layernorm" ? (GetParam().llama ? 1 : 2) : 1;
  EXPECT_EQ(saved, expected);
  EXPECT_EQ(adapters, 2 * 2 * c.num_layers);
  const std::vector<float> frozen_before(pb.flat_params().data<float>() + pb.trainable_numel(),
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
    EXPECT_GT(std::abs(analytic), 1e-6) << pb.spec(id).name << " has no gradient";
    EXPECT_LT(rel_diff(analytic, numeric, 2e-3), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
  }
  EXPECT_EQ(0, std::memcmp(frozen_before.data(), pb.flat_params().data<float>() + pb.trainable_numel(),
                           frozen_before.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, LoraModulesModel,
    ::testing::Values(Case{false, false, {"word_embeddings", "output_layer", "final_layernorm"}},
                      Case{true, false, {"output_layer", "final_layernorm"}},
                      Case{false, true, {"word_embeddings"}}, Case{true, true, {"word_embeddings", "final_layernorm"}}),
    [](const auto& info) {
      return std::string(info.param.llama ? "llama" : "gpt") + (info.param.tied ? "_tied" : "_untied") + "_" +
             std::to_string(info.param.modules.size());
    });

}  // namespace
}  // namespace gale
