// --attention-output-gate without Gated DeltaNet through `gale convert` (train/hf_config.h): a
// Qwen3NextForCausalLM whose layer_types are all full_attention <-> a Gale model with gated attention
// in every layer.
//
// tests/data/hf/qwen3_next_gated is a tiny random Qwen3-Next saved by transformers 4.57.1
// (tools/reference/hf_fixture_qwen3_next_gated.py): 2 gated full-attention layers (q_proj per head
// [query | gate], q_norm / k_norm, partial RoPE 0.25), zero-centred RMSNorms, layer 0 MoE with a gated
// shared expert, layer 1 dense; fp32. HfFixture (hf_convert_test.cc) checks its golden logits and the
// bit-exact round trip; here: the recorded flags, that the gate rows matter to the golden comparison,
// the exported config.json, the dense (no experts) variant, and the refusals.
#include <gtest/gtest.h>

#include <fstream>

#include "train/hf_config.h"
#include "train/hf_test_fixtures.h"

namespace gale {
namespace {

using namespace testing_hf;  // NOLINT: the fixture helpers

nlohmann::json json_file(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The checkpoint records gated attention without an attention variant; the converted model gives
// transformers' logits, and swapping head 0's query and gate rows (Megatron's per-group [q heads | gate
// heads | k | v] layout) misses them. Exported back: Qwen3NextForCausalLM with layer_types all
// full_attention and the experts' keys.
TEST(HfConvertGatedAttention, Qwen3NextWithoutLinearLayersIsGatedAttention) {
  TempDir tmp;
  Status s = convert_hf_to_gale(to_gale(fixture("qwen3_next_gated"), tmp.file("gale")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  const nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["attention_output_gate"], true);
  EXPECT_EQ(args["qk_layernorm"], true);
  EXPECT_EQ(args["apply_layernorm_1p"], true);
  EXPECT_EQ(args["rotary_percent"], 0.25);
  EXPECT_TRUE(args.value("experimental_attention_variant", nlohmann::json()).is_null() ||
              args["experimental_attention_variant"] == "")
      << args["experimental_attention_variant"];
  EXPECT_EQ(args["moe_layer_freq"], "[1,0]");
  const Golden g = read_golden("qwen3_next_gated");
  auto lm = load_model(tmp.file("gale"));
  EXPECT_LT(compare(logits_of(*lm->model, g.tokens), g).max_diff, kLogitTolerance);
  ParamBuffer& pb = lm->model->params();
  const int qkv = pb.find("decoder.layers.1.self_attention.linear_qkv.weight");
  ASSERT_GE(qkv, 0);
  const int64_t H = 64, HD = 16, per = 2;  // group 0: q heads 0, 1 then gate heads 0, 1
  float* w = pb.param_data(qkv);
  std::swap_ranges(w, w + HD * H, w + per * HD * H);
  EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 100 * kLogitTolerance);

  s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  const nlohmann::json back = json_file(tmp.file("hf/config.json"));
  EXPECT_EQ(back["architectures"], nlohmann::json({"Qwen3NextForCausalLM"}));
  EXPECT_EQ(back["layer_types"], nlohmann::json({"full_attention", "full_attention"}));
  EXPECT_EQ(back["num_experts"], 4);
  EXPECT_EQ(back["mlp_only_layers"], nlohmann::json({1}));
  EXPECT_EQ(back["rope_parameters"]["partial_rotary_factor"], 0.25);
}

// Without experts the model is written with num_experts 0 and every layer in mlp_only_layers, which
// reads back as the same dense gated-attention model.
TEST(HfConvertGatedAttention, DenseGatedAttentionModelRoundTripsThroughTheConfig) {
  auto hf = hf_model_from_config(json_file(fixture("qwen3_next_gated") + "/config.json"), "config.json", 128, 1);
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  EXPECT_TRUE(hf->model.attention_output_gate);
  EXPECT_TRUE(hf->model.linear_attention_pattern.empty());
  auto dense = hf_model_from_args(hf->model, MoeArgs{}, 100, "ckpt");
  ASSERT_TRUE(dense.ok()) << dense.status().message();
  EXPECT_EQ(dense->arch, HfArchitecture::kQwen3Next);
  const nlohmann::json j = hf_config_json(dense.value(), "float32");
  EXPECT_EQ(j["num_experts"], 0);
  EXPECT_EQ(j["mlp_only_layers"], nlohmann::json({0, 1}));
  EXPECT_EQ(j["layer_types"], nlohmann::json({"full_attention", "full_attention"}));
  auto again = hf_model_from_config(j, "back/config.json", 128, 1);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_FALSE(again->moe.enabled());
  EXPECT_TRUE(again->model.attention_output_gate);
  EXPECT_TRUE(again->model.qk_layernorm);
  EXPECT_TRUE(again->model.apply_layernorm_1p);
  EXPECT_TRUE(again->model.experimental_attention_variant.empty());
  EXPECT_EQ(again->model.rotary_percent, 0.25);
  EXPECT_EQ(again->model.ffn_hidden_size, 96);
}

// A gated-attention model Qwen3-Next cannot hold is refused naming the first missing piece.
TEST(HfConvertGatedAttention, ModelsQwen3NextCannotHoldAreRefused) {
  auto hf = hf_model_from_config(json_file(fixture("qwen3_next_gated") + "/config.json"), "config.json", 128, 1);
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  auto refusal = [&](const std::function<void(ModelArgs&)>& edit) {
    ModelArgs m = hf->model;
    edit(m);
    auto out = hf_model_from_args(m, hf->moe, 100, "ckpt");
    return out.ok() ? std::string("accepted") : out.status().message();
  };
  const std::string head = "ckpt: a model with --attention-output-gate (gated attention) is written as "
                           "Qwen3NextForCausalLM only with ";
  EXPECT_EQ(refusal([](ModelArgs&) {}), "accepted");
  EXPECT_EQ(refusal([](ModelArgs& m) { m.apply_layernorm_1p = false; }),
            head + "zero-centred RMSNorm (--apply-layernorm-1p)");
  EXPECT_EQ(refusal([](ModelArgs& m) { m.qk_layernorm = false; }),
            head + "--attention-output-gate and --qk-layernorm (the full-attention layers' gated q_proj, q_norm and "
                   "k_norm)");
  EXPECT_EQ(refusal([](ModelArgs& m) { m.multi_latent_attention = true; m.q_lora_rank = 16; }).find(
                "ckpt: a --multi-latent-attention model is written as DeepseekV3ForCausalLM only with"),
            0u);
  EXPECT_EQ(refusal([](ModelArgs& m) { m.sliding_window = 4; }),
            head + "no --sliding-window, --noop-layers or --embed-layernorm");
}

}  // namespace
}  // namespace gale
