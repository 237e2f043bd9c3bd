// Per-layer sliding windows of Qwen2 / Qwen3 through `gale convert` (train/hf_config.h): max_window_layers
// and layer_types <-> --sliding-window with --window-attn-skip-freq.
//
// tests/data/hf/qwen2_swa is tests/data/hf/qwen2's weights with use_sliding_window, sliding_window 4 and
// max_window_layers 1 (layer 0 full, layer 1 windowed), its golden logits from an independent torch
// forward checked against transformers' own logits without the window
// (tools/reference/qwen2_window_fixture.py; logits_first_sliding: layer 0 windowed instead). The
// HfFixture suite (hf_convert_test.cc) also runs it with the bit-exact round trip; here: the recorded
// flags, that the layer choice matters to the golden comparison, the exported config.json, and the
// refusals (Qwen2-MoE, and models whose architecture has no per-layer window).
#include <gtest/gtest.h>

#include <fstream>

#include "train/hf_config.h"
#include "train/hf_test_fixtures.h"

namespace gale {
namespace {

using namespace testing_hf;  // NOLINT: the fixture helpers

nlohmann::json args_of(const std::string& ckpt) {
  auto r = CheckpointReader::open(ckpt);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r->section("args").value();
}

nlohmann::json json_file(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

Golden golden_first_sliding() {
  Golden g = read_golden("qwen2_swa");
  g.logits = SafetensorsFile::open(fixture("qwen2_swa") + "/golden.safetensors")
                 .value()
                 .read("logits_first_sliding", DType::kF32)
                 .value();
  return g;
}

// max_window_layers 1 of 2 layers: --sliding-window 4 --window-attn-skip-freq [0,1]; the converted model
// gives the golden logits, and the opposite pattern (or a window in every layer) does not. Written back
// as Qwen2ForCausalLM with layer_types and max_window_layers 1.
TEST(HfConvertWindow, Qwen2MaxWindowLayersIsAWindowSkipPattern) {
  TempDir tmp;
  Status s = convert_hf_to_gale(to_gale(fixture("qwen2_swa"), tmp.file("gale")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  const nlohmann::json args = args_of(tmp.file("gale"));
  EXPECT_EQ(args["sliding_window"], 4);
  EXPECT_EQ(args["window_attn_skip_freq"], nlohmann::json({0, 1}));
  const Golden g = read_golden("qwen2_swa");
  auto lm = load_model(tmp.file("gale"));
  EXPECT_LT(compare(logits_of(*lm->model, g.tokens), g).max_diff, kLogitTolerance);
  auto every = load_model(tmp.file("gale"), [](nlohmann::json& a) { a.erase("window_attn_skip_freq"); });
  EXPECT_GT(compare(logits_of(*every->model, g.tokens), g).max_diff, 100 * kLogitTolerance);
  auto swapped = load_model(tmp.file("gale"), [](nlohmann::json& a) { a["window_attn_skip_freq"] = {1, 0}; });
  EXPECT_GT(compare(logits_of(*swapped->model, g.tokens), g).max_diff, 100 * kLogitTolerance);
  EXPECT_LT(compare(logits_of(*swapped->model, g.tokens), golden_first_sliding()).max_diff, kLogitTolerance);

  s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  const nlohmann::json back = json_file(tmp.file("hf/config.json"));
  EXPECT_EQ(back["architectures"], nlohmann::json({"Qwen2ForCausalLM"}));
  EXPECT_EQ(back["use_sliding_window"], true);
  EXPECT_EQ(back["sliding_window"], 4);
  EXPECT_EQ(back["max_window_layers"], 1);
  EXPECT_EQ(back["layer_types"], nlohmann::json({"full_attention", "sliding_attention"}));
}

// layer_types (transformers >= 4.53) overrides max_window_layers: sliding then full is [1,0] and gives
// logits_first_sliding; written back with layer_types [sliding, full] and max_window_layers 0 (no leading
// full layer). Without use_sliding_window nothing is windowed; a value other than the two types is refused.
TEST(HfConvertWindow, Qwen2LayerTypesChooseTheWindowedLayers) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "qwen2_swa");
  edit_config(dir, [](nlohmann::json& j) { j["layer_types"] = {"sliding_attention", "full_attention"}; });
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  EXPECT_EQ(args_of(tmp.file("gale"))["window_attn_skip_freq"], nlohmann::json({1, 0}));
  auto lm = load_model(tmp.file("gale"));
  const Golden first = golden_first_sliding();
  EXPECT_LT(compare(logits_of(*lm->model, first.tokens), first).max_diff, kLogitTolerance);
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet).ok());
  const nlohmann::json back = json_file(tmp.file("hf/config.json"));
  EXPECT_EQ(back["layer_types"], nlohmann::json({"sliding_attention", "full_attention"}));
  EXPECT_EQ(back["max_window_layers"], 0);

  edit_config(dir, [](nlohmann::json& j) { j["use_sliding_window"] = false; });
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale2")), quiet).ok());
  EXPECT_FALSE(args_of(tmp.file("gale2")).contains("window_attn_skip_freq"));
  EXPECT_TRUE(args_of(tmp.file("gale2"))["sliding_window"].is_null());

  edit_config(dir, [](nlohmann::json& j) {
    j["use_sliding_window"] = true;
    j["layer_types"] = {"sliding_attention", "chunked_attention"};
  });
  const std::string e = error_of(dir, tmp);
  EXPECT_EQ(e, dir + "/config.json: 'layer_types' must hold \"sliding_attention\" or \"full_attention\", found "
                     "[\"sliding_attention\",\"chunked_attention\"]");
}

// Qwen3 reads and writes the same keys as Qwen2.
TEST(HfConvertWindow, Qwen3WindowSkipPatternRoundTrip) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "qwen3");
  edit_config(dir, [](nlohmann::json& j) {
    j["use_sliding_window"] = true;
    j["sliding_window"] = 4;
    j["max_window_layers"] = 1;
  });
  Status s = convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  const nlohmann::json args = args_of(tmp.file("gale"));
  EXPECT_EQ(args["sliding_window"], 4);
  EXPECT_EQ(args["window_attn_skip_freq"], nlohmann::json({0, 1}));
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf"), "bf16"), quiet).ok());
  const nlohmann::json back = json_file(tmp.file("hf/config.json"));
  EXPECT_EQ(back["architectures"], nlohmann::json({"Qwen3ForCausalLM"}));
  EXPECT_EQ(back["layer_types"], nlohmann::json({"full_attention", "sliding_attention"}));
  EXPECT_EQ(back["max_window_layers"], 1);
}

// Qwen2-MoE's windows in only some layers are refused (its config has no layer_types and transformers'
// attention implementations window different layers); on the way out a window pattern is refused for
// the architectures without per-layer windows.
TEST(HfConvertWindow, RefusedWhereNoArchitectureHoldsIt) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "qwen2_moe");
  edit_config(dir, [](nlohmann::json& j) {
    j["use_sliding_window"] = true;
    j["sliding_window"] = 4;
    j["max_window_layers"] = 1;
  });
  EXPECT_EQ(error_of(dir, tmp),
            dir + "/config.json: 'sliding_window' = 4 is used by 1 of 2 layers (max_window_layers 1); per-layer "
                  "windows are read for Qwen2ForCausalLM and Qwen3ForCausalLM only (transformers' Qwen2-MoE windows "
                  "different layers in different attention implementations)");

  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("qwen2_swa"), tmp.file("gale")), quiet).ok());
  const nlohmann::json args = args_of(tmp.file("gale"));
  ModelArgs m = model_args_from_json(args, "x").value();
  const MoeArgs moe = moe_args_from_json(args, "x", m.num_layers).value();
  ASSERT_TRUE(hf_model_from_args(m, moe, 100, "x").ok());
  m.add_qkv_bias = false;  // LLaMA-shaped with a window: MistralForCausalLM, whose window is in every layer
  auto hf = hf_model_from_args(m, moe, 100, "ckpt");
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().message(),
            "ckpt: the model has --window-attn-skip-freq [0,1] (full-attention layers among windowed ones), which "
            "MistralForCausalLM cannot hold (written as Qwen2ForCausalLM with --add-qkv-bias or Qwen3ForCausalLM with "
            "--qk-layernorm: layer_types, or GptOssForCausalLM)");
}

}  // namespace
}  // namespace gale
