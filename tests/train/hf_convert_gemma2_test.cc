// Gemma2ForCausalLM through `gale convert` (train/hf_gemma2.h, hf_config.h, hf_weights.h) against an
// independent golden: tests/data/hf/gemma2 is a tiny random Gemma-2 whose logits
// tools/reference/hf_fixture_gemma2.py computes with Gemma-2's math written out in torch (float64): 3
// layers (sliding, full, sliding: window 4 over 12 tokens), GQA 4 / 2 heads with head_dim 24,
// query_pre_attn_scalar 20, attention and final soft-caps 4 and 2.5, four distinct norms per layer, tied
// embeddings. The import reproduces those logits within kLogitTolerance (1e-4); each Gemma-2 piece moves
// them far beyond it; the export returns model.safetensors byte for byte with Gemma-2's config keys;
// config defaults and refusals both ways.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "pretrain_cli.h"
#include "train/hf_config.h"
#include "train/hf_test_fixtures.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using namespace testing_hf;  // NOLINT: the fixture helpers

nlohmann::json json_file(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

double diff_after(const std::string& ckpt, const Golden& g, const std::function<void(nlohmann::json&)>& edit_args) {
  return compare(logits_of(*load_model(ckpt, edit_args)->model, g.tokens), g).max_diff;
}

HfModel model_of(const nlohmann::json& config) { return hf_model_from_config(config, "config.json", 128, 1).value(); }

TEST(HfConvertGemma2, ReproducesTheReferenceLogitsAndEachGemma2PieceMatters) {
  TempDir tmp;
  std::string log;
  Status s = convert_hf_to_gale(to_gale(fixture("gemma2"), tmp.file("gale")),
                                [&](const std::string& line) { log += line + "\n"; });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_NE(log.find("converting Gemma2ForCausalLM from "), std::string::npos) << log;
  EXPECT_NE(log.find("gemma2: --gelu-tanh --add-rmsnorm-offset --input-embeds-norm --post-norm "
                     "--query-pre-attn-scalar 20, --attn-logit-softcapping 4, --output-logit-softcapping 2.5, "
                     "--sliding-window 4 --window-attn-skip-freq [1,0,1] (1: sliding_attention), head_dim 24, tied "
                     "embeddings\n"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("warning"), std::string::npos) << log;
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["post_norm"], true);
  EXPECT_EQ(args["query_pre_attn_scalar"], 20);
  EXPECT_EQ(args["attn_logit_softcapping"], 4.0);
  EXPECT_EQ(args["output_logit_softcapping"], 2.5);
  EXPECT_EQ(args["sliding_window"], 4);
  EXPECT_EQ(args["window_attn_skip_freq"], nlohmann::json({1, 0, 1}));
  EXPECT_EQ(args["gelu_tanh"], true);
  EXPECT_EQ(args["add_rmsnorm_offset"], true);
  EXPECT_EQ(args["input_embeds_norm"], true);
  EXPECT_EQ(args["kv_channels"], 24);
  EXPECT_EQ(args["num_query_groups"], 2);
  EXPECT_EQ(args["untie_embeddings_and_output_weights"], false);

  const Golden g = read_golden("gemma2");
  auto lm = load_model(tmp.file("gale"));
  EXPECT_TRUE(lm->config.post_norm && lm->config.rmsnorm_offset && lm->config.geglu && lm->config.openai_gelu);
  EXPECT_EQ(lm->config.layer_window(0), 4);
  EXPECT_EQ(lm->config.layer_window(1), 0);
  EXPECT_EQ(lm->config.layer_window(2), 4);
  const Comparison c = compare(logits_of(*lm->model, g.tokens), g);
  EXPECT_LT(c.max_diff, kLogitTolerance);
  EXPECT_NEAR(c.loss, g.loss, kLogitTolerance);

  // Each piece, undone or moved, changes the logits far beyond the tolerance (the reference script
  // prints how far: 0.16 for the scale, over 1 for the others).
  const double big = 100 * kLogitTolerance;
  EXPECT_GT(diff_after(tmp.file("gale"), g, [](nlohmann::json& a) { a.erase("query_pre_attn_scalar"); }), big);
  EXPECT_GT(diff_after(tmp.file("gale"), g, [](nlohmann::json& a) { a.erase("attn_logit_softcapping"); }), big);
  EXPECT_GT(diff_after(tmp.file("gale"), g, [](nlohmann::json& a) { a.erase("output_logit_softcapping"); }), big);
  EXPECT_GT(diff_after(tmp.file("gale"), g,
                       [](nlohmann::json& a) { a["window_attn_skip_freq"] = nlohmann::json({0, 1, 0}); }),
            big);  // the odd layers windowed instead of the even ones
  EXPECT_GT(diff_after(tmp.file("gale"), g,
                       [](nlohmann::json& a) {
                         a.erase("sliding_window");
                         a.erase("window_attn_skip_freq");
                       }),
            big);
}

// Gale -> HF: model.safetensors is the fixture's byte for byte (f32 in Gale's order; the four norms
// back under their names, no lm_head: tied), with Gemma-2's config keys; imported again, the same logits.
TEST(HfConvertGemma2, ExportsTheFixtureByteForByteWithGemma2ConfigKeys) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("gemma2"), tmp.file("gale")), quiet).ok());
  Status s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(bytes(tmp.file("hf/model.safetensors")) == bytes(fixture("gemma2") + "/model.safetensors"));
  const nlohmann::json out = json_file(tmp.file("hf/config.json"));
  const nlohmann::json src = json_file(fixture("gemma2") + "/config.json");
  for (const char* key : {"architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "hidden_activation",
                          "max_position_embeddings", "rms_norm_eps", "rope_theta", "attention_bias",
                          "tie_word_embeddings", "vocab_size", "query_pre_attn_scalar", "attn_logit_softcapping",
                          "final_logit_softcapping", "sliding_window", "cache_implementation"})
    EXPECT_EQ(out[key], src[key]) << key;
  EXPECT_EQ(out["layer_types"], nlohmann::json({"sliding_attention", "full_attention", "sliding_attention"}));
  ASSERT_TRUE(convert_hf_to_gale(to_gale(tmp.file("hf"), tmp.file("again")), quiet).ok());
  const Golden g = read_golden("gemma2");
  EXPECT_LT(compare(logits_of(*load_model(tmp.file("again"))->model, g.tokens), g).max_diff, kLogitTolerance);
}

// Absent keys take Gemma2Config's defaults; null soft-caps are none; hidden_activation alone picks the
// GeLU; layer_types as written (a warning when not the even layers); a window of at least
// max_position_embeddings is none.
TEST(HfConvertGemma2, ConfigDefaultsAndLayerTypes) {
  nlohmann::json j = json_file(fixture("gemma2") + "/config.json");
  for (const char* key : {"query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                          "sliding_window", "head_dim", "hidden_activation"})
    j.erase(key);
  j["hidden_act"] = "gelu";  // Gemma2MLP ignores it
  j["max_position_embeddings"] = 8192;
  HfModel m = model_of(j);
  EXPECT_EQ(m.arch, HfArchitecture::kGemma2);
  EXPECT_EQ(m.model.query_pre_attn_scalar, 256);
  EXPECT_EQ(m.model.attn_logit_softcapping, 50.0);
  EXPECT_EQ(m.model.output_logit_softcapping, 30.0);
  EXPECT_EQ(m.model.kv_channels, 256);
  EXPECT_TRUE(m.model.gelu_tanh);
  EXPECT_FALSE(m.model.geglu);
  EXPECT_TRUE(m.model.post_norm);
  EXPECT_EQ(m.model.sliding_window, 4096);
  EXPECT_EQ(m.model.window_attn_pattern, std::vector<int>({1, 0, 1}));
  EXPECT_TRUE(m.warnings.empty());

  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  j["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention"};
  j["sliding_window"] = 16;
  m = model_of(j);
  EXPECT_TRUE(unset(m.model.attn_logit_softcapping));
  EXPECT_TRUE(unset(m.model.output_logit_softcapping));
  EXPECT_EQ(m.model.sliding_window, 16);
  EXPECT_TRUE(m.model.window_attn_pattern.empty());  // every layer windowed
  ASSERT_EQ(m.warnings.size(), 1u);
  EXPECT_EQ(m.warnings[0], "config.json: layer_types windows other layers than the even ones 0, 2, ...: read as "
                           "written (transformers releases before layer_types window the even layers)");
  nlohmann::json back = hf_config_json(hf_model_from_args(m.model, m.moe, 100, "ckpt").value(), "float32");
  EXPECT_EQ(back["attn_logit_softcapping"], nullptr);
  EXPECT_EQ(back["final_logit_softcapping"], nullptr);
  EXPECT_EQ(back["layer_types"], j["layer_types"]);
  EXPECT_EQ(back["sliding_window"], 16);

  j["layer_types"] = {"full_attention", "full_attention", "full_attention"};
  EXPECT_EQ(model_of(j).model.sliding_window, kUnset);
  j.erase("layer_types");
  j["sliding_window"] = 8192;  // hides no key below max_position_embeddings
  m = model_of(j);
  EXPECT_EQ(m.model.sliding_window, kUnset);
  EXPECT_TRUE(m.model.window_attn_pattern.empty());
  back = hf_config_json(hf_model_from_args(m.model, m.moe, 100, "ckpt").value(), "float32");
  EXPECT_EQ(back["sliding_window"], 8192);  // max_position_embeddings: no window
  EXPECT_EQ(back["query_pre_attn_scalar"], 256);
  // A Gale model without --query-pre-attn-scalar scales by --kv-channels: written as head_dim.
  m.model.query_pre_attn_scalar = kUnset;
  back = hf_config_json(hf_model_from_args(m.model, m.moe, 100, "ckpt").value(), "float32");
  EXPECT_EQ(back["query_pre_attn_scalar"], 256);
  EXPECT_EQ(back["head_dim"], 256);
}

// transformers' sliding layers (layer_idx % 2 == 0, the fixture's golden) are the ones MindSpeed-LLM's
// --interleave-sliding-window windows when training: 1-based layer numbers 1, 3, 5, ...
TEST(HfConvertGemma2, InterleaveSlidingWindowWindowsTheLayersTransformersDoes) {
  for (int layers : {3, 4, 7}) {
    nlohmann::json j = json_file(fixture("gemma2") + "/config.json");
    j["num_hidden_layers"] = layers;
    const HfModel m = model_of(j);
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal({"--interleave-sliding-window", "4", "--num-layers", std::to_string(layers),
                                        "--normalization", "RMSNorm", "--post-norm"});
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(cli.args.model.sliding_window, m.model.sliding_window) << layers;
    EXPECT_EQ(cli.args.model.window_attn_pattern, m.model.window_attn_pattern) << layers;
  }
}

// A MindSpeed-LLM Gemma-2 checkpoint's args hold interleave_sliding_window instead of a window: read as
// the same window in the same layers (the golden's logits), and refused with another skip frequency.
TEST(HfConvertGemma2, MindSpeedInterleaveSlidingWindowArgsAreRead) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("gemma2"), tmp.file("gale")), quiet).ok());
  auto mindspeed = [](nlohmann::json& a) {
    a.erase("sliding_window");
    a.erase("window_attn_skip_freq");
    a["interleave_sliding_window"] = 4;
  };
  const Golden g = read_golden("gemma2");
  auto lm = load_model(tmp.file("gale"), mindspeed);
  EXPECT_EQ(lm->config.sliding_window, 4);
  EXPECT_EQ(lm->config.window_layers, std::vector<int>({1, 0, 1}));
  EXPECT_LT(compare(logits_of(*lm->model, g.tokens), g).max_diff, kLogitTolerance);
  nlohmann::json args = CheckpointReader::open(tmp.file("gale"))->section("args").value();
  mindspeed(args);
  args["window_attn_skip_freq"] = 3;
  const Status s = model_args_from_json(args, "ckpt").status();
  EXPECT_EQ(s.message(), "ckpt: args: --interleave-sliding-window windows every other layer (--window-attn-skip-freq "
                         "2), found --window-attn-skip-freq 3");
}

TEST(HfConvertGemma2, Refusals) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "gemma2");
  const std::string config = dir + "/config.json";
  edit_config(dir, [](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}}; });
  EXPECT_EQ(error_of(dir, tmp), config + ": 'rope_scaling' = {\"factor\":2.0,\"rope_type\":\"linear\"} is not "
                                         "supported yet (transformers 4.x's Gemma2ForCausalLM ignores rope_scaling "
                                         "and 5.x applies it: only plain RoPE (rope_scaling null) is read)");
  edit_config(dir, [](nlohmann::json& j) {
    j["rope_scaling"] = nullptr;
    j["use_bidirectional_attention"] = true;
  });
  EXPECT_EQ(error_of(dir, tmp), config + ": 'use_bidirectional_attention' = true is not supported yet (Gale's GPT "
                                         "model attends causally)");
  edit_config(dir, [](nlohmann::json& j) {
    j.erase("use_bidirectional_attention");
    j["query_pre_attn_scalar"] = 12.5;
  });
  EXPECT_EQ(error_of(dir, tmp), config + ": 'query_pre_attn_scalar' = 12.5 is not supported yet (MindSpeed-LLM's "
                                         "--query-pre-attn-scalar is a positive integer)");
  edit_config(dir, [](nlohmann::json& j) {
    j["query_pre_attn_scalar"] = 20;
    j["sliding_window"] = nullptr;
  });
  EXPECT_EQ(error_of(dir, tmp), config + ": 'sliding_window' = null is not supported yet (Gemma-2's sliding layers "
                                         "need a window: a positive integer (at least max_position_embeddings for "
                                         "none))");
  edit_config(dir, [](nlohmann::json& j) {
    j["sliding_window"] = 4;
    j["attn_logit_softcapping"] = -1.0;
  });
  EXPECT_EQ(error_of(dir, tmp),
            config + ": 'attn_logit_softcapping' must be null or a number greater than zero, found -1.0");
  edit_config(dir, [](nlohmann::json& j) {
    j["attn_logit_softcapping"] = 4.0;
    j["layer_types"] = {"sliding_attention", "full_attention"};
  });
  EXPECT_EQ(error_of(dir, tmp), config + ": 'layer_types' must list 3 layer types, found "
                                         "[\"sliding_attention\",\"full_attention\"]");
  edit_config(dir, [](nlohmann::json& j) {
    j.erase("layer_types");
    j["hidden_activation"] = "silu";
  });
  EXPECT_EQ(error_of(dir, tmp), config + ": 'hidden_activation' = \"silu\" is not supported yet (Gemma's MLP is GeGLU "
                                         "with gelu_pytorch_tanh / gelu_new (--gelu-tanh) or gelu (--geglu))");
  // Each refusal above came from its key alone: the restored config converts.
  edit_config(dir, [](nlohmann::json& j) { j["hidden_activation"] = "gelu_pytorch_tanh"; });
  EXPECT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("ok")), quiet).ok());
}

// Gale -> HF: Gemma-2's flags are written only as Gemma2ForCausalLM, which needs --post-norm and Gemma's shape.
TEST(HfConvertGemma2, Gemma2FlagsAreWrittenOnlyAsGemma2) {
  const HfModel m = model_of(json_file(fixture("gemma2") + "/config.json"));
  EXPECT_EQ(hf_model_from_args(m.model, m.moe, 100, "ckpt").value().arch, HfArchitecture::kGemma2);
  ModelArgs no_post = m.model;  // soft-caps without the sandwich norms
  no_post.post_norm = false;
  Status s = hf_model_from_args(no_post, m.moe, 100, "ckpt").status();
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("ckpt: a model with MindSpeed-LLM's Gemma-2 flags (--post-norm, --attn-logit-softcapping, "
                             "--output-logit-softcapping, --query-pre-attn-scalar) is written only as "
                             "Gemma2ForCausalLM (Gemma3ForCausalLM with --qk-layernorm): "),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("found --post-norm off, --geglu off, --gelu-tanh on"), std::string::npos) << s.message();
  ModelArgs llama = m.model;  // --post-norm on a SwiGLU model
  llama.gelu_tanh = false;
  llama.swiglu = true;
  s = hf_model_from_args(llama, m.moe, 100, "ckpt").status();
  EXPECT_NE(s.message().find("found --post-norm on, --geglu off, --gelu-tanh off"), std::string::npos) << s.message();
  ModelArgs biased = m.model;
  biased.add_bias_linear = true;
  EXPECT_EQ(hf_model_from_args(biased, m.moe, 100, "ckpt").status().code(), StatusCode::kUnimplemented);
  // Gemma (v1) still holds no window.
  ModelArgs v1 = m.model;
  v1.post_norm = false;
  v1.query_pre_attn_scalar = kUnset;
  v1.attn_logit_softcapping = v1.output_logit_softcapping = kUnsetF;
  s = hf_model_from_args(v1, m.moe, 100, "ckpt").status();
  EXPECT_NE(s.message().find("is written only as GemmaForCausalLM"), std::string::npos) << s.message();
  v1.sliding_window = kUnset;
  v1.window_attn_pattern.clear();
  v1.window_attn_skip_freq.clear();
  EXPECT_EQ(hf_model_from_args(v1, m.moe, 100, "ckpt").value().arch, HfArchitecture::kGemma);
}

}  // namespace
}  // namespace gale
