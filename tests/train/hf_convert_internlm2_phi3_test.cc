// `gale convert` for InternLM2ForCausalLM and Phi3ForCausalLM (tools/reference/hf_fixture_internlm2_phi3.py).
//
// The fixtures tests/data/hf/{internlm2,phi3}/ are tiny random models in HF's layout with golden logits
// from a float64 plain-torch forward written from the public modeling code; hf_convert_test.cc's HfFixture
// runs them through the golden-logit and bit-for-bit round-trip checks. Here: what each records (linear
// RoPE interpolation, the sliding window), that the golden comparison sees it, the way back into the same
// architecture, Megatron's format, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "train/hf_config.h"
#include "train/hf_convert.h"
#include "train/hf_test_fixtures.h"

namespace gale {
namespace {

using testing_util::TempDir;
using namespace testing_hf;  // NOLINT: the fixture helpers

// InternLM2's rope_scaling linear 2 is --rotary-seq-len-interpolation-factor 2: the golden logits match
// with it and not without it.
TEST(HfConvertInternLM2, LinearRopeScalingIsTheInterpolationFactorAndTheGoldenSeesIt) {
  TempDir tmp;
  std::string log;
  Status s = convert_hf_to_gale(to_gale(fixture("internlm2"), tmp.file("gale")),
                                [&](const std::string& line) { log += line + "\n"; });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_NE(log.find("converting InternLM2ForCausalLM"), std::string::npos) << log;
  EXPECT_NE(log.find("--rotary-seq-len-interpolation-factor 2"), std::string::npos) << log;
  const nlohmann::json args = CheckpointReader::open(tmp.file("gale")).value().section("args").value();
  EXPECT_EQ(args["rotary_seq_len_interpolation_factor"], 2.0);
  EXPECT_EQ(args["num_query_groups"], 2);
  const Golden g = read_golden("internlm2");
  EXPECT_LT(compare(logits_of(*load_model(tmp.file("gale"))->model, g.tokens), g).max_diff, kLogitTolerance);
  auto plain = load_model(tmp.file("gale"), [](nlohmann::json& a) { a.erase("rotary_seq_len_interpolation_factor"); });
  EXPECT_GT(compare(logits_of(*plain->model, g.tokens), g).max_diff, 1e-2);
}

// wqkv is copied as Megatron's grouped linear_qkv: reading it as [q; k; v] (Phi-3's / LLaMA's split) is
// what the golden logits would catch.
TEST(HfConvertInternLM2, GoldenComparisonSeesTheWqkvGrouping) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("internlm2"), tmp.file("gale")), quiet).ok());
  auto lm = load_model(tmp.file("gale"));
  // Swap query head 1 (group 0) with the key of group 0 in layer 0: rows [16, 32) and [32, 48).
  ParamBuffer& pb = lm->model->params();
  const int qkv = pb.find("decoder.layers.0.self_attention.linear_qkv.weight");
  ASSERT_GE(qkv, 0);
  const Golden g = read_golden("internlm2");
  EXPECT_LT(compare(logits_of(*lm->model, g.tokens), g).max_diff, kLogitTolerance);
  float* w = pb.param_data(qkv);
  std::swap_ranges(w + 16 * 64, w + 32 * 64, w + 32 * 64);
  EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 1e-2);
}

// rope_scaling dynamic (InternLM2 / 2.5's released configs) rescales only past max_position_embeddings:
// read as plain RoPE with a warning, kept in hf_source and written back.
TEST(HfConvertInternLM2, DynamicRopeScalingIsPlainRopeWithAWarningAndIsWrittenBack) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "internlm2");
  const nlohmann::json dynamic = {{"type", "dynamic"}, {"factor", 2.5}};
  edit_config(dir, [&](nlohmann::json& j) { j["rope_scaling"] = dynamic; });
  std::string log;
  Status s = convert_hf_to_gale(to_gale(dir, tmp.file("gale")), [&](const std::string& line) { log += line + "\n"; });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_NE(log.find("warning: " + dir + "/config.json: rope_scaling dynamic (factor 2.5) is read as plain RoPE: "
                     "InternLM2 rescales RoPE only for sequences longer than max_position_embeddings 64, which Gale "
                     "does not do (exact up to --seq-length 64)"),
            std::string::npos)
      << log;
  auto r = CheckpointReader::open(tmp.file("gale")).value();
  EXPECT_FALSE(r.section("args").value().contains("rotary_seq_len_interpolation_factor") &&
               !r.section("args").value()["rotary_seq_len_interpolation_factor"].is_null());
  EXPECT_EQ(r.section("hf_source").value()["rope_scaling"], dynamic);
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet).ok());
  const nlohmann::json out = read_json(tmp.file("hf/config.json"));
  EXPECT_EQ(out["architectures"], nlohmann::json::array({"InternLM2ForCausalLM"}));
  EXPECT_EQ(out["rope_scaling"], dynamic);
}

TEST(HfConvertInternLM2, WrittenBackWithInternLM2sConfigKeys) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("internlm2"), tmp.file("gale")), quiet).ok());
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet).ok());
  const nlohmann::json out = read_json(tmp.file("hf/config.json")), src = read_json(fixture("internlm2") + "/config.json");
  for (const char* key : {"architectures", "model_type", "bias", "rope_scaling", "num_key_value_heads",
                          "tie_word_embeddings", "hidden_act", "max_position_embeddings"})
    EXPECT_EQ(out[key], src[key]) << key;
  EXPECT_FALSE(out.contains("head_dim"));
  EXPECT_EQ(out["auto_map"]["AutoModelForCausalLM"], "modeling_internlm2.InternLM2ForCausalLM");
}

// tie_word_embeddings true: output.weight (if the files hold it) is the embedding's tie, left unread; the
// way back writes no output.weight.
TEST(HfConvertInternLM2, TiedOutputIsTheEmbedding) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "internlm2");
  edit_config(dir, [](nlohmann::json& j) { j["tie_word_embeddings"] = true; });
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  auto r = CheckpointReader::open(tmp.file("gale")).value();
  EXPECT_EQ(r.section("args").value()["untie_embeddings_and_output_weights"], false);
  const std::vector<std::string> names = r.tensor_names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "output_layer.weight"), 0);
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet).ok());
  EXPECT_EQ(read_json(tmp.file("hf/config.json"))["tie_word_embeddings"], true);
  auto f = SafetensorsFile::open(tmp.file("hf/model.safetensors")).value();
  for (const SafetensorsEntry& e : f.entries()) EXPECT_NE(e.name, "output.weight");
  EXPECT_EQ(f.entries().size(), 2u + 7u * 2u);  // embedding, final norm, 7 tensors per layer
}

TEST(HfConvertErrors, InternLM2OptionsGaleDoesNotHave) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "internlm2");
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
    edit_config(dir, [&](nlohmann::json& j) {
      j = read_json(fixture("internlm2") + "/config.json");
      edit(j);
    });
    return error_of(dir, tmp);
  };
  const std::string cfg = dir + "/config.json";
  EXPECT_EQ(refused([](nlohmann::json& j) { j["bias"] = true; }),
            cfg + ": 'bias' = true is not supported yet (biases on attention.wqkv and attention.wo only; Megatron's "
                  "--add-bias-linear also puts them on the MLP)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j.erase("bias"); }),
            cfg + ": 'bias' = absent (InternLM2Config's default true) is not supported yet (biases on attention.wqkv "
                  "and attention.wo only; Megatron's --add-bias-linear also puts them on the MLP)");
  const std::string why = " is not supported yet (InternLM2's rope_scaling is {\"type\": \"linear\" or \"dynamic\", "
                          "\"factor\": >= 1}; Gale reads linear as --rotary-seq-len-interpolation-factor and dynamic as "
                          "plain RoPE up to max_position_embeddings)";
  EXPECT_EQ(refused([](nlohmann::json& j) { j["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}}; }),
            cfg + ": 'rope_scaling' = {\"factor\":2.0,\"type\":\"yarn\"}" + why);
  EXPECT_EQ(refused([](nlohmann::json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 0.5}}; }),
            cfg + ": 'rope_scaling' = {\"factor\":0.5,\"type\":\"linear\"}" + why);
  EXPECT_EQ(refused([](nlohmann::json& j) { j["head_dim"] = 32; }),
            cfg + ": InternLM2ForCausalLM has heads of hidden_size / num_attention_heads: expected hidden_size 64 to "
                  "be a multiple of 4 and no other head_dim, found head_dim 32");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["hidden_act"] = "gelu"; }),
            cfg + ": 'hidden_act' = \"gelu\" is not supported yet (the MLP is SwiGLU: silu(gate) * up)");
}

// Phi-3's sliding_window 5 is --sliding-window 5 (Mistral's mask); the golden logits need it.
TEST(HfConvertPhi3, SlidingWindowIsRecordedAndTheGoldenSeesIt) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("phi3"), tmp.file("gale")), quiet).ok());
  const nlohmann::json args = CheckpointReader::open(tmp.file("gale")).value().section("args").value();
  EXPECT_EQ(args["sliding_window"], 5);
  const Golden g = read_golden("phi3");
  EXPECT_LT(compare(logits_of(*load_model(tmp.file("gale"))->model, g.tokens), g).max_diff, kLogitTolerance);
  auto full = load_model(tmp.file("gale"), [](nlohmann::json& a) { a.erase("sliding_window"); });
  EXPECT_GT(compare(logits_of(*full->model, g.tokens), g).max_diff, 1e-2);
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet).ok());
  const nlohmann::json out = read_json(tmp.file("hf/config.json")), src = read_json(fixture("phi3") + "/config.json");
  for (const char* key : {"architectures", "model_type", "sliding_window", "rope_scaling", "partial_rotary_factor",
                          "original_max_position_embeddings", "num_key_value_heads", "tie_word_embeddings"})
    EXPECT_EQ(out[key], src[key]) << key;
  EXPECT_FALSE(out.contains("head_dim"));
}

// A window of at least max_position_embeddings (Phi-3.5-mini's 262144) is no window.
TEST(HfConvertPhi3, AWindowAtLeastTheContextIsNoWindow) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "phi3");
  edit_config(dir, [](nlohmann::json& j) { j["sliding_window"] = 64; });
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  const nlohmann::json args = CheckpointReader::open(tmp.file("gale")).value().section("args").value();
  EXPECT_TRUE(!args.contains("sliding_window") || args["sliding_window"].is_null()) << args["sliding_window"];
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet).ok());
  EXPECT_EQ(read_json(tmp.file("hf/config.json"))["architectures"], nlohmann::json::array({"Phi3ForCausalLM"}));
  EXPECT_TRUE(read_json(tmp.file("hf/config.json"))["sliding_window"].is_null());
}

TEST(HfConvertErrors, Phi3OptionsGaleDoesNotHave) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "phi3");
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
    edit_config(dir, [&](nlohmann::json& j) {
      j = read_json(fixture("phi3") + "/config.json");
      edit(j);
    });
    return error_of(dir, tmp);
  };
  const std::string cfg = dir + "/config.json";
  // Phi-3's rope_scaling is longrope (hf_convert_phi3_longrope_test.cc) or null: linear is refused.
  const nlohmann::json linear = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(refused([&](nlohmann::json& j) { j["rope_scaling"] = linear; }),
            cfg + ": 'rope_scaling' = " + linear.dump() +
                " is not supported yet (Phi-3's rope_scaling is null or {\"type\" (or \"rope_type\"): \"longrope\" or "
                "\"su\", \"short_factor\" and \"long_factor\": head_dim / 2 positive numbers each, optional "
                "\"attention_factor\" > 0 and \"original_max_position_embeddings\"})");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["partial_rotary_factor"] = 0.5; }),
            cfg + ": 'partial_rotary_factor' = 0.5 is not supported yet (Phi3ForCausalLM is read with RoPE over the "
                  "whole head only)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["attention_bias"] = true; }),
            cfg + ": 'attention_bias' = true is not supported yet (biases on q/k/v/o; Qwen2's q/k/v-only bias is "
                  "supported)");
}

// The recorded architecture is kept only while it can hold the model; otherwise a warning names why.
TEST(HfConvert, RecordedInternLM2OrPhi3ArchitectureOnlyWhenItFits) {
  ModelArgs a;
  a.hidden_size = 64;
  a.num_attention_heads = 4;
  a.kv_channels = 16;
  a.position_embedding_type = "rope";
  HfModel m;
  m.model = a;
  m.arch = HfArchitecture::kQwen2;
  EXPECT_EQ(hf_keep_source_architecture(&m, {{"architecture", "InternLM2ForCausalLM"}}),
            "the checkpoint was converted from InternLM2ForCausalLM, which cannot hold it (it is a Qwen2ForCausalLM "
            "(biases, norms, a window or experts InternLM2 lacks)): writing it as Qwen2ForCausalLM");
  EXPECT_EQ(m.arch, HfArchitecture::kQwen2);
  m.arch = HfArchitecture::kLlama;
  m.model.rotary_seq_len_interpolation_factor = 2.0;
  EXPECT_EQ(hf_keep_source_architecture(&m, {{"architecture", "Phi3ForCausalLM"}}),
            "the checkpoint was converted from Phi3ForCausalLM, which cannot hold it (Phi-3 has no linear RoPE "
            "interpolation (--rotary-seq-len-interpolation-factor)): writing it as LlamaForCausalLM");
  EXPECT_EQ(m.arch, HfArchitecture::kLlama);
  EXPECT_EQ(hf_keep_source_architecture(&m, {{"architecture", "InternLM2ForCausalLM"}}), "");
  EXPECT_EQ(m.arch, HfArchitecture::kInternLM2);
  m.arch = HfArchitecture::kMistral;
  m.model.rotary_seq_len_interpolation_factor = std::nan("");
  m.model.kv_channels = 32;
  EXPECT_EQ(hf_keep_source_architecture(&m, {{"architecture", "Phi3ForCausalLM"}}),
            "the checkpoint was converted from Phi3ForCausalLM, which cannot hold it (--kv-channels 32 is not hidden "
            "/ heads): writing it as MistralForCausalLM");
  m.model.kv_channels = 16;
  EXPECT_EQ(hf_keep_source_architecture(&m, {{"architecture", "Phi3ForCausalLM"}}), "");
  EXPECT_EQ(m.arch, HfArchitecture::kPhi3);
  // Any other recorded architecture: nothing to do.
  m.arch = HfArchitecture::kLlama;
  EXPECT_EQ(hf_keep_source_architecture(&m, {{"architecture", "MistralForCausalLM"}}), "");
  EXPECT_EQ(m.arch, HfArchitecture::kLlama);
}

// MindSpeed-LLM's --model-type-hf names.
TEST(HfConvert, ModelTypeHfNamesInternLM2AndPhi3) {
  TempDir tmp;
  HfToGaleOptions o = to_gale(fixture("internlm2"), tmp.file("a"));
  o.model_type_hf = "internlm2";
  EXPECT_TRUE(convert_hf_to_gale(o, quiet).ok());
  o = to_gale(fixture("phi3"), tmp.file("b"));
  o.model_type_hf = "phi3.5";
  EXPECT_TRUE(convert_hf_to_gale(o, quiet).ok());
  o.model_type_hf = "internlm2";
  EXPECT_EQ(convert_hf_to_gale(o, quiet).message(),
            "--model-type-hf internlm2 does not match " + fixture("phi3") + "/config.json, which describes a "
            "Phi3ForCausalLM");
}

// HF -> Megatron's format -> Gale: the same tensors as HF -> Gale (the golden logits hold there).
TEST(HfConvert, InternLM2AndPhi3ToMegatronsFormat) {
  for (const char* name : {"internlm2", "phi3"}) {
    TempDir tmp;
    const Status s = hf_through_megatron(fixture(name), tmp, /*tp=*/2);
    ASSERT_TRUE(s.ok()) << name << ": " << s.message();
    const Golden g = read_golden(name);
    EXPECT_LT(compare(logits_of(*load_model(tmp.file("gale"))->model, g.tokens), g).max_diff, kLogitTolerance) << name;
  }
  // Megatron's --rotary-seq-len-interpolation-factor is an int: a factor of 1.5 has no place in its args.
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "internlm2");
  edit_config(dir, [](nlohmann::json& j) { j["rope_scaling"]["factor"] = 1.5; });
  MegatronConvertOptions mg;
  mg.from = ModelFormat::kHf;
  mg.to = ModelFormat::kMegatron;
  mg.load_dir = dir;
  mg.save_dir = tmp.file("mg");
  EXPECT_EQ(convert_megatron(mg, quiet).message(),
            "--rotary-seq-len-interpolation-factor 1.5: Megatron's flag is an integer (type=int), so its checkpoint "
            "args cannot hold this factor");
  EXPECT_FALSE(std::filesystem::exists(tmp.file("mg/latest_checkpointed_iteration.txt")));
}

}  // namespace
}  // namespace gale
