// Gemma3ForCausalLM (text) through `gale convert` where it maps onto Gale's flags (train/hf_gemma2.h): the
// tiny tests/data/hf/gemma3 (tools/reference/hf_fixture_gemma2.py --gemma3: Gemma-2's layer with q_norm /
// k_norm, sliding_window_pattern 3, no soft-caps, rope_local_base_freq = rope_theta) against its float64
// torch golden; the byte-identical export; Gemma3TextConfig's defaults; the RoPE keys Gale cannot hold
// (a second base for the sliding layers, scaling of the full layers only) refused.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "train/hf_config.h"
#include "train/hf_test_fixtures.h"

namespace gale {
namespace {

using namespace testing_hf;  // NOLINT: the fixture helpers

nlohmann::json json_file(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

HfModel model_of(const nlohmann::json& config) { return hf_model_from_config(config, "config.json", 128, 1).value(); }

TEST(HfConvertGemma3, ReproducesTheReferenceLogitsAndEachPieceMatters) {
  TempDir tmp;
  std::string log;
  Status s = convert_hf_to_gale(to_gale(fixture("gemma3"), tmp.file("gale")),
                                [&](const std::string& line) { log += line + "\n"; });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_NE(log.find("gemma3: --gelu-tanh --add-rmsnorm-offset --input-embeds-norm --post-norm --qk-layernorm "
                     "--query-pre-attn-scalar 20, --attn-logit-softcapping none, --output-logit-softcapping none, "
                     "--sliding-window 4 --window-attn-skip-freq [1,1,0] (1: sliding_attention), head_dim 24, tied "
                     "embeddings\n"),
            std::string::npos)
      << log;
  const nlohmann::json args = CheckpointReader::open(tmp.file("gale"))->section("args").value();
  EXPECT_EQ(args["qk_layernorm"], true);
  EXPECT_EQ(args["post_norm"], true);
  EXPECT_FALSE(args.contains("attn_logit_softcapping"));
  EXPECT_FALSE(args.contains("output_logit_softcapping"));
  EXPECT_EQ(args["window_attn_skip_freq"], nlohmann::json({1, 1, 0}));

  const Golden g = read_golden("gemma3");
  auto lm = load_model(tmp.file("gale"));
  const Comparison c = compare(logits_of(*lm->model, g.tokens), g);
  EXPECT_LT(c.max_diff, kLogitTolerance);
  EXPECT_NEAR(c.loss, g.loss, kLogitTolerance);
  const double big = 100 * kLogitTolerance;
  auto diff_after = [&](const std::function<void(nlohmann::json&)>& edit) {
    return compare(logits_of(*load_model(tmp.file("gale"), edit)->model, g.tokens), g).max_diff;
  };
  EXPECT_GT(diff_after([](nlohmann::json& a) { a["window_attn_skip_freq"] = nlohmann::json({0, 0, 1}); }), big);
  EXPECT_GT(diff_after([](nlohmann::json& a) { a.erase("query_pre_attn_scalar"); }), big);
}

TEST(HfConvertGemma3, ExportsTheFixtureByteForByte) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("gemma3"), tmp.file("gale")), quiet).ok());
  Status s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(bytes(tmp.file("hf/model.safetensors")) == bytes(fixture("gemma3") + "/model.safetensors"));
  const nlohmann::json out = json_file(tmp.file("hf/config.json"));
  const nlohmann::json src = json_file(fixture("gemma3") + "/config.json");
  for (const char* key : {"architectures", "model_type", "head_dim", "hidden_activation", "query_pre_attn_scalar",
                          "attn_logit_softcapping", "final_logit_softcapping", "sliding_window",
                          "sliding_window_pattern", "rope_theta", "rope_local_base_freq", "tie_word_embeddings"})
    EXPECT_EQ(out[key], src[key]) << key;
  EXPECT_EQ(out["layer_types"], nlohmann::json({"sliding_attention", "sliding_attention", "full_attention"}));
}

// Gemma3TextConfig's defaults: no soft-caps, sliding_window_pattern 6, rope_local_base_freq 10000.
TEST(HfConvertGemma3, DefaultsAndRefusedRope) {
  nlohmann::json j = json_file(fixture("gemma3") + "/config.json");
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping", "sliding_window_pattern",
                          "rope_local_base_freq"})
    j.erase(key);
  j["num_hidden_layers"] = 7;
  HfModel m = model_of(j);
  EXPECT_EQ(m.arch, HfArchitecture::kGemma3);
  EXPECT_TRUE(m.model.qk_layernorm);
  EXPECT_TRUE(unset(m.model.attn_logit_softcapping));
  EXPECT_TRUE(unset(m.model.output_logit_softcapping));
  EXPECT_EQ(m.model.window_attn_pattern, std::vector<int>({1, 1, 1, 1, 1, 0, 1}));
  const nlohmann::json back = hf_config_json(hf_model_from_args(m.model, m.moe, 100, "ckpt").value(), "float32");
  EXPECT_EQ(back["sliding_window_pattern"], 6);
  EXPECT_EQ(back["architectures"], nlohmann::json({"Gemma3ForCausalLM"}));

  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "gemma3");
  const std::string config = dir + "/config.json";
  edit_config(dir, [](nlohmann::json& c) { c["rope_local_base_freq"] = 1000000.0; });
  EXPECT_EQ(error_of(dir, tmp), config + ": 'rope_local_base_freq' = 1000000.0 is not supported yet (the sliding "
                                         "layers' RoPE base; Gale's RoPE has one base for every layer: only "
                                         "rope_local_base_freq = rope_theta (10000) is read)");
  edit_config(dir, [](nlohmann::json& c) {
    c.erase("rope_local_base_freq");
    c["rope_theta"] = 1000000.0;
  });
  EXPECT_EQ(error_of(dir, tmp), config + ": 'rope_local_base_freq' absent (Gemma3TextConfig's default 10000) is not "
                                         "supported yet with rope_theta 1000000 (Gale's RoPE has one base for every "
                                         "layer)");
  edit_config(dir, [](nlohmann::json& c) {
    c["rope_theta"] = c["rope_local_base_freq"] = 10000.0;
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  });
  EXPECT_EQ(error_of(dir, tmp), config + ": 'rope_scaling' = {\"factor\":8.0,\"rope_type\":\"linear\"} is not "
                                         "supported yet (Gemma-3 scales RoPE in its full-attention layers only; "
                                         "Gale's RoPE scaling applies to every layer)");
}

}  // namespace
}  // namespace gale
