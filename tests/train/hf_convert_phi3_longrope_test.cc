// `gale convert` for Phi3ForCausalLM with rope_scaling longrope (Phi-3.5-mini's form) against the
// phi3_longrope fixture's golden logits (tools/reference/hf_fixture_phi3_longrope.py, a float64 restatement
// of transformers' LongRoPE): the long factors for 12 tokens past the original 8, the short ones for 8,
// KV-cache decoding that switches tables as transformers does, the factor lists written back digit for
// digit, the other spellings (su, rope_type, attention_factor) and the refusals.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/kv_cache.h"
#include "train/hf_config.h"
#include "train/hf_convert.h"
#include "train/hf_test_fixtures.h"

namespace gale {
namespace {

using testing_util::TempDir;
using namespace testing_hf;  // NOLINT: the fixture helpers

Tensor golden_tensor(const char* name, DType dtype) {
  auto f = SafetensorsFile::open(fixture("phi3_longrope") + "/golden.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f->read(name, dtype).value();
}

double max_diff_rows(const float* gale, int64_t Vp, const Tensor& want, int64_t rows) {
  const int64_t V = want.size(1);
  double d = 0;
  for (int64_t s = 0; s < rows; ++s)
    for (int64_t v = 0; v < V; ++v)
      d = std::max(d, std::abs(static_cast<double>(gale[s * Vp + v]) - want.data<float>()[s * V + v]));
  return d;
}

TEST(HfConvertPhi3LongRope, RecordedAsLongRopeAndTheGoldenSeesBothTables) {
  TempDir tmp;
  std::string log;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("phi3_longrope"), tmp.file("gale")),
                                 [&](const std::string& line) { log += line + "\n"; })
                  .ok());
  const nlohmann::json args = CheckpointReader::open(tmp.file("gale")).value().section("args").value();
  EXPECT_EQ(args["rope_scaling_type"], "longrope");
  EXPECT_EQ(args["rope_scaling_original_max_position_embeddings"], 8);
  EXPECT_EQ(args["long_factor"], read_json(fixture("phi3_longrope") + "/config.json")["rope_scaling"]["long_factor"]);
  EXPECT_TRUE(args["long_mscale"].is_null());
  auto lm = load_model(tmp.file("gale"));
  EXPECT_DOUBLE_EQ(lm->config.longrope.short_mscale, std::sqrt(2.0));  // sqrt(1 + ln(64 / 8) / ln 8)
  const Golden g = read_golden("phi3_longrope");  // 12 tokens > 8: the long factors
  const Comparison c = compare(logits_of(*lm->model, g.tokens), g);
  EXPECT_LT(c.max_diff, kLogitTolerance);
  EXPECT_NEAR(c.loss, g.loss, kLogitTolerance);
  const Tensor short_golden = golden_tensor("logits_short", DType::kF32);  // the first 8 alone: short factors
  const std::vector<int32_t> eight(g.tokens.begin(), g.tokens.begin() + 8);
  const Tensor short_logits = logits_of(*lm->model, eight);
  EXPECT_LT(max_diff_rows(short_logits.data<float>(), short_logits.size(2), short_golden, 8), kLogitTolerance);
  // The tables differ where it shows: the 12-token run's first rows are not the 8-token run's.
  const Tensor all = logits_of(*lm->model, g.tokens);
  EXPECT_GT(max_diff_rows(all.data<float>(), all.size(2), short_golden, 8), 1e-2);
  // Plain RoPE (the args without LongRoPE) misses the golden logits.
  auto plain = load_model(tmp.file("gale"), [](nlohmann::json& a) { a.erase("rope_scaling_type"); });
  EXPECT_GT(compare(logits_of(*plain->model, g.tokens), g).max_diff, 1e-2);
}

// Greedy decoding from the 5-token prompt with a KV cache: the prompt and the steps up to total length 8
// use the short table, the later ones the long table, and the keys cached before keep their rotation —
// transformers' behaviour, step by step.
TEST(HfConvertPhi3LongRope, KvCacheDecodingSwitchesTablesAsTransformers) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("phi3_longrope"), tmp.file("gale")), quiet).ok());
  auto lm = load_model(tmp.file("gale"));
  GPTModel& model = *lm->model;
  const Golden g = read_golden("phi3_longrope");
  const Tensor want = golden_tensor("cached_logits", DType::kF32), greedy = golden_tensor("cached_greedy", DType::kI64);
  KvCache cache = make_kv_cache(lm->config, model.partition(), 1, 16);
  std::vector<int32_t> feed(g.tokens.begin(), g.tokens.begin() + 5);
  const int64_t V = want.size(1);
  for (int64_t step = 0; step < 6; ++step) {
    MicroBatch mb;
    mb.B = 1;
    mb.S = static_cast<int64_t>(feed.size());
    mb.tokens = feed;
    mb.position_ids.assign(feed.size(), 0);
    const Tensor logits = model.forward_logits(mb, Tensor(), &cache);
    const float* last = logits.data<float>() + (mb.S - 1) * logits.size(2);
    double d = 0;
    for (int64_t v = 0; v < V; ++v) d = std::max(d, std::abs(static_cast<double>(last[v]) - want.data<float>()[step * V + v]));
    EXPECT_LT(d, kLogitTolerance) << "step " << step;
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + V) - last);
    EXPECT_EQ(next, greedy.data<int64_t>()[step]) << "step " << step;
    feed = {next};
  }
}

// The same decoding through ragged batches of KV blocks (continuous batching's path, one request).
TEST(HfConvertPhi3LongRope, RaggedDecodingSwitchesTablesAsTransformers) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("phi3_longrope"), tmp.file("gale")), quiet).ok());
  auto lm = load_model(tmp.file("gale"));
  GPTModel& model = *lm->model;
  const Golden g = read_golden("phi3_longrope");
  const Tensor want = golden_tensor("cached_logits", DType::kF32), greedy = golden_tensor("cached_greedy", DType::kI64);
  KvBlockPool pool(lm->config, model.partition(), 4, 4);
  RaggedKvBatch rb;
  rb.pool = &pool;
  RaggedRequest rr;
  rr.blocks = pool.allocate(3);  // 12 positions: 5 prompt tokens and 6 decoded
  rr.rows = 5;
  rb.requests = {rr};
  std::vector<int32_t> feed(g.tokens.begin(), g.tokens.begin() + 5);
  const int64_t V = want.size(1);
  for (int64_t step = 0; step < 6; ++step) {
    const Tensor logits = model.forward_logits_ragged(feed, rb);
    const float* last = logits.data<float>();
    double d = 0;
    for (int64_t v = 0; v < V; ++v) d = std::max(d, std::abs(static_cast<double>(last[v]) - want.data<float>()[step * V + v]));
    EXPECT_LT(d, kLogitTolerance) << "step " << step;
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + V) - last);
    EXPECT_EQ(next, greedy.data<int64_t>()[step]) << "step " << step;
    rb.requests[0].cached += rb.requests[0].rows;
    rb.requests[0].rows = 1;
    feed = {next};
  }
}

// HF -> Gale -> HF: Phi3ForCausalLM again, the factor lists and the original context as config.json had
// them (the same text), every tensor bit for bit (also in hf_convert_test.cc's HfFixture).
TEST(HfConvertPhi3LongRope, WrittenBackWithTheSameRopeScaling) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("phi3_longrope"), tmp.file("gale")), quiet).ok());
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet).ok());
  const nlohmann::json out = read_json(tmp.file("hf/config.json")), src = read_json(fixture("phi3_longrope") + "/config.json");
  EXPECT_EQ(out["architectures"], src["architectures"]);
  EXPECT_EQ(out["rope_scaling"].dump(), src["rope_scaling"].dump());
  EXPECT_EQ(out["original_max_position_embeddings"], 8);
  EXPECT_EQ(out["max_position_embeddings"], 64);
  // And once more: Gale -> HF -> Gale records the same args.
  ASSERT_TRUE(convert_hf_to_gale(to_gale(tmp.file("hf"), tmp.file("gale2")), quiet).ok());
  const nlohmann::json a = CheckpointReader::open(tmp.file("gale")).value().section("args").value();
  const nlohmann::json b = CheckpointReader::open(tmp.file("gale2")).value().section("args").value();
  for (const char* key : {"rope_scaling_type", "rope_scaling_original_max_position_embeddings", "long_factor",
                          "short_factor", "long_mscale", "short_mscale"})
    EXPECT_EQ(a[key].dump(), b[key].dump()) << key;
}

// The older "su" name, transformers' "rope_type" key, original_max_position_embeddings inside rope_scaling
// and an explicit attention_factor (both mscales; written back as attention_factor).
TEST(HfConvertPhi3LongRope, OtherSpellingsAndAttentionFactor) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "phi3_longrope");
  edit_config(dir, [](nlohmann::json& j) {
    nlohmann::json rs = j["rope_scaling"];
    rs.erase("type");
    rs["rope_type"] = "su";
    rs["original_max_position_embeddings"] = 8;
    rs["attention_factor"] = 1.25;
    j["rope_scaling"] = rs;
    j.erase("original_max_position_embeddings");
  });
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  auto lm = load_model(tmp.file("gale"));
  EXPECT_EQ(lm->config.longrope.original_max_positions, 8);
  EXPECT_EQ(lm->config.longrope.short_mscale, 1.25);
  EXPECT_EQ(lm->config.longrope.long_mscale, 1.25);
  const Golden g = read_golden("phi3_longrope");  // another attention factor: other logits
  EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 1e-2);
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet).ok());
  const nlohmann::json out = read_json(tmp.file("hf/config.json"));
  EXPECT_EQ(out["rope_scaling"]["type"], "longrope");
  EXPECT_EQ(out["rope_scaling"]["attention_factor"], 1.25);
  EXPECT_EQ(out["original_max_position_embeddings"], 8);
}

TEST(HfConvertErrors, Phi3LongRopeOptionsGaleDoesNotHave) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "phi3_longrope");
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
    edit_config(dir, [&](nlohmann::json& j) {
      j = read_json(fixture("phi3_longrope") + "/config.json");
      edit(j);
    });
    return error_of(dir, tmp);
  };
  const std::string cfg = dir + "/config.json";
  const std::string why =
      "Phi-3's rope_scaling is null or {\"type\" (or \"rope_type\"): \"longrope\" or \"su\", \"short_factor\" and "
      "\"long_factor\": head_dim / 2 positive numbers each, optional \"attention_factor\" > 0 and "
      "\"original_max_position_embeddings\"}";
  std::string e = refused([](nlohmann::json& j) { j["rope_scaling"]["long_factor"].erase(0); });
  EXPECT_NE(e.find(why + "; expected 8 'long_factor' entries)"), std::string::npos) << e;
  e = refused([](nlohmann::json& j) { j["rope_scaling"]["short_mscale"] = 1.1; });
  EXPECT_NE(e.find(why + "; transformers' Phi-3 ignores 'short_mscale')"), std::string::npos) << e;
  e = refused([](nlohmann::json& j) { j["rope_scaling"]["type"] = "dynamic"; });
  EXPECT_NE(e.find(cfg + ": 'rope_scaling' = "), std::string::npos) << e;
  EXPECT_EQ(refused([](nlohmann::json& j) { j.erase("original_max_position_embeddings"); }),
            cfg + ": rope_scaling longrope needs original_max_position_embeddings > 1 (the context the short factors "
                  "hold up to), found none");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["rope_scaling"]["original_max_position_embeddings"] = 16; }),
            cfg + ": original_max_position_embeddings 8 and rope_scaling's 16 differ (expected one original context)");
}

// Megatron-LM's args have no LongRoPE: a Megatron-format checkpoint of the model is refused, nothing written.
TEST(HfConvertErrors, LongRopeToMegatronsFormatIsRefused) {
  TempDir tmp;
  MegatronConvertOptions mg;
  mg.from = ModelFormat::kHf;
  mg.to = ModelFormat::kMegatron;
  mg.load_dir = fixture("phi3_longrope");
  mg.save_dir = tmp.file("mg");
  EXPECT_EQ(convert_megatron(mg, quiet).message(),
            "--rope-scaling-type longrope: Megatron-LM's checkpoint args have no LongRoPE (MindSpeed-LLM's flags), so a "
            "Megatron-format checkpoint would lose it; save a Gale or Hugging Face checkpoint");
  EXPECT_FALSE(std::filesystem::exists(tmp.file("mg/latest_checkpointed_iteration.txt")));
}

// A LongRoPE model is written only as Phi-3; what Phi-3 cannot hold is refused.
TEST(HfConvertErrors, LongRopeWrittenOnlyAsPhi3) {
  ModelArgs a;
  a.num_layers = 2;
  a.hidden_size = 64;
  a.num_attention_heads = 4;
  a.num_kv_heads = 2;
  a.kv_channels = 16;
  a.ffn_hidden_size = 96;
  a.max_position_embeddings = 64;
  a.padded_vocab_size = 128;
  a.position_embedding_type = "rope";
  a.normalization = "RMSNorm";
  a.swiglu = true;
  a.add_bias_linear = false;
  a.untie_embeddings_and_output_weights = true;
  a.rope_scaling_type = "longrope";
  a.rope_scaling_original_max_position_embeddings = 8;
  a.short_factors.assign(8, 1.0);
  a.long_factors.assign(8, 2.0);
  StatusOr<HfModel> m = hf_model_from_args(a, MoeArgs(), 100, "ckpt");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->arch, HfArchitecture::kPhi3);
  a.short_mscale = 1.1;
  a.long_mscale = 1.2;
  EXPECT_EQ(hf_model_from_args(a, MoeArgs(), 100, "ckpt").status().message(),
            "ckpt: --short-mscale 1.1 and --long-mscale 1.2: Phi-3's config holds one attention_factor for both");
  a.long_mscale = 1.1;
  a.add_qkv_bias = true;
  EXPECT_EQ(hf_model_from_args(a, MoeArgs(), 100, "ckpt").status().message(),
            "ckpt: the model has --rope-scaling-type longrope, which Gale writes only as Phi3ForCausalLM (LLaMA's "
            "block: RMSNorm, SwiGLU, no biases, no experts), found a Qwen2ForCausalLM");
}

}  // namespace
}  // namespace gale
