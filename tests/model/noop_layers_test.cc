// MindSpeed's --noop-layers: a model whose layer 1 of 3 is a noop layer is, bit for bit, the
// 2-layer model made of its real layers (losses and every gradient), has no parameters for the
// noop layer, and gives the same result with full recomputation across the noop layer.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "tiny_model_training.h"

namespace gale {
namespace {

// The parameter of `to` that holds `from`'s parameter `name`: layer 2 of the noop model is layer 1
// of the dense model.
std::string dense_name(std::string name) {
  const std::string l2 = "decoder.layers.2.";
  if (name.rfind(l2, 0) == 0) name = "decoder.layers.1." + name.substr(l2.size());
  return name;
}

double train_step(GPTModel& model, const MicroBatch& mb) {
  GPTModel::LossSums sums;
  model.params().zero_grads();
  model.forward(0, mb, Tensor(), /*training=*/true, &sums);
  model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  return sums.loss_sum / sums.tokens;
}

class NoopLayers : public ::testing::TestWithParam<bool> {};  // GPT or LLaMA

TEST_P(NoopLayers, EqualTheModelOfTheRealLayers) {
  ModelConfig dense = GetParam() ? testing::tiny_llama_config() : testing::tiny_gpt_config();
  dense.attention_dropout = dense.hidden_dropout = 0.0f;  // dropout streams are numbered by layer
  dense.num_layers = 2;
  ModelConfig noop = dense;
  noop.num_layers = 3;
  noop.noop_layers = {1};
  const OpTable ops = reference_ops();
  GPTModel a(noop, single_process_partition(noop), &ops), b(dense, single_process_partition(dense), &ops);
  ParamBuffer &pa = a.params(), &pb = b.params();
  pa.initialize(7);
  ASSERT_EQ(pa.size(), pb.size());  // the noop layer has no parameters
  ASSERT_EQ(pa.numel(), pb.numel());
  for (const ParamSpec& s : pa.specs()) EXPECT_EQ(s.name.rfind("decoder.layers.1.", 0), std::string::npos) << s.name;
  for (int id = 0; id < pa.size(); ++id) {
    const int to = pb.find(dense_name(pa.spec(id).name));
    ASSERT_GE(to, 0) << pa.spec(id).name;
    std::memcpy(pb.param_data(to), pa.param_data(id), pa.spec(id).local_numel() * sizeof(float));
  }
  for (uint64_t seed : {101, 102}) {
    const MicroBatch mb = testing::tiny_batch(noop, 2, seed, /*documents=*/false);
    EXPECT_EQ(train_step(a, mb), train_step(b, mb)) << "seed " << seed;
    for (int id = 0; id < pa.size(); ++id) {
      const int to = pb.find(dense_name(pa.spec(id).name));
      EXPECT_EQ(0, std::memcmp(pb.grad_data(to), pa.grad_data(id), pa.spec(id).local_numel() * sizeof(float)))
          << pa.spec(id).name;
    }
  }
}

TEST_P(NoopLayers, FullRecomputationAcrossANoopLayer) {
  ModelConfig c = GetParam() ? testing::tiny_llama_config() : testing::tiny_gpt_config();
  c.num_layers = 4;
  c.noop_layers = {0, 2};  // the first layer of the model and of a recompute group
  const OpTable ops = reference_ops();
  const testing::TinyTrainingRun stored = testing::train_tiny(c, ops, /*documents=*/true, 2);
  for (FullRecompute plan : {FullRecompute{FullRecompute::Method::kUniform, 2}, FullRecompute{FullRecompute::Method::kBlock, 3}}) {
    ModelConfig rc = c;
    rc.full_recompute = plan;
    const testing::TinyTrainingRun run = testing::train_tiny(rc, ops, /*documents=*/true, 2);
    ASSERT_EQ(run.losses.size(), stored.losses.size());
    for (size_t i = 0; i < run.losses.size(); ++i) EXPECT_EQ(run.losses[i], stored.losses[i]);
    for (size_t i = 0; i < run.grads.size(); ++i) EXPECT_EQ(run.grads[i], stored.grads[i]) << "step " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, NoopLayers, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "llama" : "gpt"); });

}  // namespace
}  // namespace gale
