// Gemma-2's layer features in one process (--attn-logit-softcapping, --output-logit-softcapping,
// --query-pre-attn-scalar, --post-norm, the interleaved sliding window): a float64 PyTorch golden of a
// tiny two-layer model (tools/reference/gemma2_reference.py: loss, logits and every gradient),
// finite differences of every parameter (RMSNorm and LayerNorm with biases), the post norms'
// parameters, the reference kernels against the fused ones, and KV-cache decoding (flash decoding)
// against the whole-sequence forward.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/cpu/fused_ops.h"
#include "model/decoding_check.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "model_test_batches.h"
#include "testing.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

// Every Gemma-2 feature on `c`: both caps small enough to bite at init std 0.3, the scalar, the post
// norms, and the window (2 keys) in the even layers (0-based; MindSpeed-LLM's odd layer numbers).
ModelConfig with_gemma2(ModelConfig c) {
  c.attn_logit_softcapping = 1.5f;
  c.output_logit_softcapping = 2.5f;
  c.query_pre_attn_scalar = 5;
  c.post_norm = true;
  c.sliding_window = 2;
  c.window_layers.assign(static_cast<size_t>(c.num_layers), 0);
  for (int64_t i = 0; i < c.num_layers; i += 2) c.window_layers[static_cast<size_t>(i)] = 1;
  return c;
}

nlohmann::json load_fixture() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/gemma2_layer.json");
  EXPECT_TRUE(in.good()) << "tests/data/reference/gemma2_layer.json (tools/reference/gemma2_reference.py)";
  return nlohmann::json::parse(in);
}

// The fixture's model as a ModelConfig, built from its own numbers.
ModelConfig fixture_config(const nlohmann::json& f) {
  const nlohmann::json& j = f["config"];
  ModelConfig c;
  c.num_layers = j["num_layers"];
  c.hidden = j["hidden_size"];
  c.ffn = j["ffn_hidden_size"];
  c.heads = j["num_attention_heads"];
  c.kv_heads = j["num_query_groups"];
  c.head_dim = j["kv_channels"];
  c.vocab = j["vocab_size"];
  c.seq_length = j["seq_length"];
  c.max_positions = c.seq_length;
  c.rms_norm = true;
  c.norm_eps = j["norm_epsilon"].get<float>();
  c.swiglu = true;
  c.add_bias_linear = false;
  c.tied_embeddings = false;
  c.position = PositionEmbedding::kRope;
  c.rotary_base = j["rotary_base"];
  c.attn_logit_softcapping = j["attn_logit_softcapping"].get<float>();
  c.output_logit_softcapping = j["output_logit_softcapping"].get<float>();
  c.query_pre_attn_scalar = j["query_pre_attn_scalar"];
  c.post_norm = true;
  c.sliding_window = j["interleave_sliding_window"];
  c.window_layers = {1, 0};  // --interleave-sliding-window: layer numbers 1, 3, ... windowed
  return c;
}

MicroBatch fixture_batch(const nlohmann::json& f, const ModelConfig& c) {
  MicroBatch mb;
  mb.B = f["tokens"].size();
  mb.S = c.seq_length;
  for (int64_t b = 0; b < mb.B; ++b)
    for (int64_t s = 0; s < mb.S; ++s) {
      mb.tokens.push_back(f["tokens"][b][s].get<int32_t>());
      mb.labels.push_back(f["labels"][b][s].get<int32_t>());
      mb.loss_mask.push_back(1.0f);
      mb.position_ids.push_back(static_cast<int32_t>(s));
    }
  for (int64_t b = 0; b < mb.B; ++b) mb.sample_ids.push_back(b);
  return mb;
}

TEST(Gemma2Layer, MatchesTheFloat64TorchGolden) {
  const nlohmann::json f = load_fixture();
  const ModelConfig c = fixture_config(f);
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused kernels" : "reference kernels");
    OpTable ops = fused ? testing::decoding_ops() : reference_ops();
    GPTModel model(c, single_process_partition(c), &ops);
    ParamBuffer& pb = model.params();
    ASSERT_EQ(static_cast<size_t>(pb.size()), f["weights"].size());
    for (int id = 0; id < pb.size(); ++id) {
      const std::string& name = pb.spec(id).name;
      ASSERT_TRUE(f["weights"].contains(name)) << name;
      const std::vector<double> w = f["weights"][name].get<std::vector<double>>();
      ASSERT_EQ(static_cast<int64_t>(w.size()), pb.spec(id).local_numel()) << name;
      for (size_t i = 0; i < w.size(); ++i) pb.param_data(id)[i] = static_cast<float>(w[i]);
    }
    const MicroBatch mb = fixture_batch(f, c);
    const double loss = testing::mean_loss(model, mb, true);
    EXPECT_NEAR(loss, f["loss"].get<double>(), 2e-5);
    for (int id = 0; id < pb.size(); ++id) {
      const std::string& name = pb.spec(id).name;
      const std::vector<double> g = f["grads"][name].get<std::vector<double>>();
      double peak = 1e-3, err = 0.0;
      for (size_t i = 0; i < g.size(); ++i) {
        peak = std::max(peak, std::fabs(g[i]));
        err = std::max(err, std::fabs(pb.grad_data(id)[i] - g[i]));
      }
      EXPECT_LT(err / peak, 2e-4) << name;
    }
    const Tensor logits = model.forward_logits(mb, Tensor());  // [B, S, V], capped as the loss saw them
    const std::vector<double> want = f["logits"].get<std::vector<double>>();
    ASSERT_EQ(static_cast<size_t>(logits.numel()), want.size());
    double err = 0.0;
    for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(logits.data<float>()[i] - want[i]));
    EXPECT_LT(err, 2e-5);
  }
}

class Gemma2Grad : public ::testing::TestWithParam<bool> {};

TEST_P(Gemma2Grad, EveryParameterMatchesFiniteDifferences) {
  testing::expect_every_parameter_matches_finite_differences(with_gemma2(testing::small_gqa_rope_config(GetParam())));
}

INSTANTIATE_TEST_SUITE_P(Architectures, Gemma2Grad, ::testing::Values(true, false),
                         [](const auto& info) { return std::string(info.param ? "llama" : "gpt"); });

// post_attn_norm and post_mlp_layernorm: [H] per layer (with LayerNorm their biases too), initialised
// as the other norms (weight 1, bias 0); nothing else changes.
TEST(Gemma2Layer, PostNormParameters) {
  for (bool llama : {true, false}) {
    const ModelConfig c = with_gemma2(testing::small_gqa_rope_config(llama));
    ModelConfig plain = c;
    plain.post_norm = false;
    OpTable ops = reference_ops();
    GPTModel model(c, single_process_partition(c), &ops), without(plain, single_process_partition(plain), &ops);
    model.params().initialize(1);
    const int per_norm = llama ? 1 : 2;
    EXPECT_EQ(model.params().size(), without.params().size() + 2 * per_norm * c.num_layers);
    int found = 0;
    for (int id = 0; id < model.params().size(); ++id) {
      const ParamSpec& s = model.params().spec(id);
      if (s.name.find("post_attn_norm.") == std::string::npos && s.name.find("post_mlp_layernorm.") == std::string::npos)
        continue;
      ++found;
      ASSERT_EQ(s.local_numel(), c.hidden) << s.name;
      const float want = s.name.find(".bias") != std::string::npos ? 0.0f : 1.0f;
      for (int64_t i = 0; i < c.hidden; ++i) EXPECT_EQ(model.params().param_data(id)[i], want) << s.name;
    }
    EXPECT_EQ(found, 2 * per_norm * c.num_layers);
  }
}

// Level 0 (reference kernels) against the fused kernels (flash attention with the cap, the fused LM
// head with the cap), on the tiny Llama (two flash tiles, GQA, HD 12); and each feature moves the loss.
TEST(Gemma2Layer, FusedKernelsMatchReference) {
  const ModelConfig c = with_gemma2(testing::tiny_llama_config());
  const ModelPartition part = single_process_partition(c);
  OpTable ref_ops = reference_ops(), fused_ops = testing::decoding_ops();
  GPTModel ref(c, part, &ref_ops), fused(c, part, &fused_ops);
  ref.params().initialize(3);
  fused.params().initialize(3);
  const MicroBatch mb = testing::tiny_batch(c, 2, 11, /*documents=*/true);
  const double l_ref = testing::mean_loss(ref, mb, true), l_fused = testing::mean_loss(fused, mb, true);
  EXPECT_NEAR(l_ref, l_fused, 1e-5 * std::abs(l_ref));
  testing::expect_close_grads(ref.params(), fused.params(), 1e-4, 1e-7);
}

TEST(Gemma2Layer, EachFeatureChangesTheLoss) {
  const ModelConfig c = with_gemma2(testing::small_gqa_rope_config(true));
  const ModelPartition part = single_process_partition(c);
  OpTable ops = reference_ops();
  const MicroBatch mb = testing::masked_batch(c, 2, 7, false);
  auto loss_of = [&](const ModelConfig& m) {
    GPTModel model(m, part, &ops);
    model.params().initialize(42);
    return testing::mean_loss(model, mb, false);
  };
  const double base = loss_of(c);
  ModelConfig v = c;
  v.attn_logit_softcapping = 0.0f;
  EXPECT_GT(std::abs(loss_of(v) - base), 1e-4) << "attention cap";
  v = c;
  v.output_logit_softcapping = 0.0f;
  EXPECT_GT(std::abs(loss_of(v) - base), 1e-4) << "output cap";
  v = c;
  v.query_pre_attn_scalar = 0;
  EXPECT_GT(std::abs(loss_of(v) - base), 1e-4) << "query-pre-attn-scalar";
  v = c;
  v.window_layers.clear();
  EXPECT_GT(std::abs(loss_of(v) - base), 1e-4) << "window in every layer";
}

// The cache holds the capped layers' keys; decoding in chunks (whole-prompt, one-token and flash-decode
// steps) gives the whole-sequence logits, capped.
TEST(Gemma2Layer, KvCacheDecodingEqualsTheWholeSequenceForward) {
  const ModelConfig c = with_gemma2(testing::tiny_llama_config());
  OpTable ops = reference_ops();
  const ModelPartition part = single_process_partition(c);
  GPTModel model(c, part, &ops);
  model.params().initialize(5);
  const int64_t B = 2, S = 23;
  KvCache cache = make_kv_cache(c, part, B, S);
  testing::expect_chunked_decoding_equals_whole_forward(model, cache, model, testing::test_tokens(B * S, c.vocab), B,
                                                        S, {7, 1, 1, 5, 1, 8}, 2e-5);
}

}  // namespace
}  // namespace gale
