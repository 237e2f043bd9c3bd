// Heterogeneous layers (ModelConfig::hetero): finite-difference gradients through every sub-block
// kind, Megatron's parameter names, KV-cache decoding, and the loss of tools/reference/heterogeneous_reference.py.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/decoding_check.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "model_test_batches.h"
#include "testing.h"
#include "train/heterogeneous_config.h"

namespace gale {
namespace {

// Five layers on a 16-wide GPT (LayerNorm, GeLU, biases, learned positions) with 4 heads in 2
// query groups by default: 0 one group, FFN 20; 1 no-op attention, linear MLP; 2 linear attention,
// FFN 8; 3 four groups, no-op MLP; 4 no-op both.
ModelConfig hetero_config() {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.num_layers = 5;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;
  const std::string json = R"({"block_configs": [
    {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_hidden_size": 20}},
    {"attention": {"no_op": true}, "ffn": {"replace_with_linear": true}},
    {"attention": {"replace_with_linear": true}, "ffn": {"ffn_hidden_size": 8}},
    {"attention": {"num_query_groups": 4}, "ffn": {"no_op": true}},
    {"attention": {"no_op": true, "n_heads_in_group": null}, "ffn": {"no_op": true, "ffn_mult": null}}]})";
  StatusOr<std::vector<HeteroLayer>> layers =
      parse_heterogeneous_layers(json, HeteroModelShape{5, c.hidden, c.heads, c.kv_heads, c.ffn}, "test");
  GALE_CHECK(layers.ok()) << layers.status().message();
  c.hetero = layers.value();
  return c;
}

TEST(HeterogeneousLayers, ParsedSubBlocks) {
  const ModelConfig c = hetero_config();
  ASSERT_EQ(c.hetero.size(), 5u);
  EXPECT_EQ(c.layer_kv_heads(0), 1);
  EXPECT_EQ(c.layer_ffn(0), 20);
  EXPECT_EQ(c.attention_kind(1), SubBlock::kNoOp);
  EXPECT_EQ(c.mlp_kind(1), SubBlock::kLinear);
  EXPECT_EQ(c.attention_kind(2), SubBlock::kLinear);
  EXPECT_EQ(c.layer_ffn(2), 8);
  EXPECT_EQ(c.layer_kv_heads(3), 4);
  EXPECT_EQ(c.mlp_kind(3), SubBlock::kNoOp);
  EXPECT_EQ(c.attention_kind(4), SubBlock::kNoOp);
  EXPECT_EQ(c.mlp_kind(4), SubBlock::kNoOp);
}

// Five-point directional derivatives in fp32 with h = 5e-3 (as tests/model/gpt_model_test.cc: 1%
// relative with a 1e-2 floor), every parameter, over a batch with masked tokens.
TEST(HeterogeneousLayers, EveryParameterMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(hetero_config());
}

// Megatron's local-spec names and shapes: the layer's own linear_qkv rows (NH + 2·KV)·HD and FFN
// columns, self_attention.weight / mlp.weight [H, H] for linear replacements, nothing for no-ops.
TEST(HeterogeneousLayers, MegatronParameterNamesAndShapes) {
  const ModelConfig c = hetero_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  const auto shape = [&](const std::string& name) {
    const int id = pb.find(name);
    EXPECT_GE(id, 0) << name;
    return id >= 0 ? pb.spec(id).global_shape : Shape{};
  };
  EXPECT_EQ(shape("decoder.layers.0.self_attention.linear_qkv.weight"), (Shape{(4 + 2 * 1) * 4, 16}));
  EXPECT_EQ(shape("decoder.layers.0.mlp.linear_fc1.weight"), (Shape{20, 16}));
  EXPECT_EQ(shape("decoder.layers.0.mlp.linear_fc2.weight"), (Shape{16, 20}));
  EXPECT_EQ(shape("decoder.layers.1.mlp.weight"), (Shape{16, 16}));
  EXPECT_EQ(shape("decoder.layers.1.mlp.bias"), (Shape{16}));
  EXPECT_EQ(shape("decoder.layers.1.pre_mlp_layernorm.weight"), (Shape{16}));
  EXPECT_EQ(shape("decoder.layers.2.self_attention.weight"), (Shape{16, 16}));
  EXPECT_EQ(shape("decoder.layers.2.input_layernorm.weight"), (Shape{16}));
  EXPECT_EQ(shape("decoder.layers.2.mlp.linear_fc1.weight"), (Shape{8, 16}));
  EXPECT_EQ(shape("decoder.layers.3.self_attention.linear_qkv.weight"), (Shape{(4 + 2 * 4) * 4, 16}));
  for (const char* name :
       {"decoder.layers.1.input_layernorm.weight", "decoder.layers.1.self_attention.linear_qkv.weight",
        "decoder.layers.1.mlp.linear_fc1.weight", "decoder.layers.2.self_attention.linear_proj.weight",
        "decoder.layers.3.pre_mlp_layernorm.weight", "decoder.layers.3.mlp.linear_fc1.weight",
        "decoder.layers.4.input_layernorm.weight", "decoder.layers.4.pre_mlp_layernorm.weight"})
    EXPECT_LT(pb.find(name), 0) << name;
  for (int id = 0; id < pb.size(); ++id)
    EXPECT_EQ(pb.spec(id).name.rfind("decoder.layers.4.", 0), std::string::npos) << pb.spec(id).name;
}

// Incremental decoding with a KvCache (each layer's own query groups, no cache for a layer without
// attention) gives the logits of the whole-sequence forward.
TEST(HeterogeneousLayers, KvCacheDecodingEqualsTheWholeSequenceForward) {
  ModelConfig c = hetero_config();
  c.attention_dropout = c.hidden_dropout = 0.0f;
  OpTable ops = reference_ops();
  const ModelPartition part = single_process_partition(c);
  GPTModel model(c, part, &ops);
  model.params().initialize(5);
  const int64_t B = 2, S = 12;
  KvCache cache = make_kv_cache(c, part, B, S);
  EXPECT_EQ(cache.layers[0].size(1), 2 * 1 * c.head_dim);  // one query group
  EXPECT_FALSE(cache.layers[1].defined());                  // no-op attention
  EXPECT_FALSE(cache.layers[2].defined());                  // linear attention
  EXPECT_EQ(cache.layers[3].size(1), 2 * 4 * c.head_dim);
  testing::expect_chunked_decoding_equals_whole_forward(model, cache, model, testing::test_tokens(B * S, c.vocab), B,
                                                        S, {5, 1, 1, 5}, 2e-5);
}

// The reference's tiny Llama-style model (RMSNorm, SwiGLU, no biases, untied output, no position
// embedding) with its weights: Gale's loss and per-token losses match the float64 reference.
TEST(HeterogeneousLayers, MatchesNumpyReference) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/heterogeneous/golden.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json g = nlohmann::json::parse(in);
  const nlohmann::json& cfg = g["config"];
  ModelConfig c;
  c.num_layers = cfg["num_hidden_layers"];
  c.hidden = cfg["hidden_size"];
  c.heads = cfg["num_attention_heads"];
  c.head_dim = cfg["kv_channels"];
  c.kv_heads = cfg["num_query_groups"];
  c.ffn = cfg["ffn_hidden_size"];
  c.vocab = cfg["vocab_size"];
  c.seq_length = cfg["seq_length"];
  c.max_positions = c.seq_length;
  c.norm_eps = cfg["norm_epsilon"].get<float>();
  use_llama_architecture(c);
  c.position = PositionEmbedding::kNone;
  StatusOr<std::vector<HeteroLayer>> layers = parse_heterogeneous_layers(
      g["heterogeneous_config"].dump(), HeteroModelShape{c.num_layers, c.hidden, c.heads, c.kv_heads, c.ffn},
      "golden.json");
  ASSERT_TRUE(layers.ok()) << layers.status().message();
  c.hetero = layers.value();
  for (int64_t i = 0; i < c.num_layers; ++i) {  // ffn_mult 1.5 at H = 8: the multiple of 256 above 8
    if (c.mlp_kind(i) == SubBlock::kBlock) {
      EXPECT_EQ(c.layer_ffn(i), g["ffn_sizes"][i].get<int64_t>()) << i;
    }
  }

  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  ParamBuffer& pb = model.params();
  ASSERT_EQ(static_cast<size_t>(pb.size()), g["weights"].size());
  for (const auto& [name, values] : g["weights"].items()) {
    const int id = pb.find(name);
    ASSERT_GE(id, 0) << name;
    const std::vector<float> v = values.get<std::vector<float>>();
    ASSERT_EQ(static_cast<int64_t>(v.size()), pb.spec(id).local_numel()) << name;
    pb.set_param_values(id, v.data());
  }
  const int64_t B = g["tokens"].size(), S = c.seq_length;
  MicroBatch mb;
  mb.B = B;
  mb.S = S;
  for (int64_t b = 0; b < B; ++b)  // [B, S]
    for (int64_t s = 0; s < S; ++s) {
      mb.tokens.push_back(g["tokens"][b][s].get<int32_t>());
      mb.labels.push_back(g["labels"][b][s].get<int32_t>());
      mb.loss_mask.push_back(g["loss_mask"][b][s].get<float>());
      mb.position_ids.push_back(static_cast<int32_t>(s));
    }
  const double loss = testing::mean_loss(model, mb, false);
  EXPECT_NEAR(loss, g["loss"].get<double>(), 2e-6 * std::abs(g["loss"].get<double>()));
}

}  // namespace
}  // namespace gale
