// `gale convert` for BaichuanForCausalLM and ChatGLMModel (tools/reference/hf_fixture_baichuan_chatglm.py).
//
// The fixtures tests/data/hf/{baichuan2,chatglm3}/ are tiny random models in HF's layout with golden logits
// from a float64 plain-torch forward written from the public modeling code. Here: the golden logits, what the
// comparison sees (Baichuan's NormHead, ChatGLM's interleaved half-head RoPE and rope_ratio), the way back
// (byte for byte, but for Baichuan's lm_head, which comes back normalised), Megatron's format at TP 2, and the
// refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "train/hf_config.h"
#include "train/hf_convert.h"
#include "train/hf_test_fixtures.h"

namespace gale {
namespace {

using testing_util::TempDir;
using namespace testing_hf;  // NOLINT: the fixture helpers

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, std::abs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  return d;
}

Golden converted_golden(const std::string& name, const std::string& ckpt, double* max_diff, double* loss) {
  const Golden g = read_golden(name);
  auto lm = load_model(ckpt);
  const Comparison c = compare(logits_of(*lm->model, g.tokens), g);
  *max_diff = c.max_diff;
  *loss = c.loss;
  return g;
}

// ---- Baichuan2 ----

// The golden logits use the NormHead (rows of lm_head divided by their norms): the converted output layer
// holds the normalised rows, and the stored (raw) rows would give other logits.
TEST(HfConvertBaichuan, GoldenLogitsWithTheNormHeadNormalisedAtConversion) {
  TempDir tmp;
  std::string log;
  Status s = convert_hf_to_gale(to_gale(fixture("baichuan2"), tmp.file("gale")),
                                [&](const std::string& line) { log += line + "\n"; });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_NE(log.find("converting BaichuanForCausalLM"), std::string::npos) << log;
  EXPECT_NE(log.find("lm_head (a NormHead) normalised per row once"), std::string::npos) << log;
  double diff = 0, loss = 0;
  const Golden g = converted_golden("baichuan2", tmp.file("gale"), &diff, &loss);
  EXPECT_LT(diff, kLogitTolerance);
  EXPECT_NEAR(loss, g.loss, kLogitTolerance);
  const nlohmann::json args = CheckpointReader::open(tmp.file("gale")).value().section("args").value();
  EXPECT_EQ(args["rotary_base"], 10000);
  EXPECT_EQ(args["untie_embeddings_and_output_weights"], true);
  EXPECT_FALSE(args.value("group_query_attention", false));
  // The raw lm_head in place of the normalised one: the golden comparison catches it.
  auto lm = load_model(tmp.file("gale"));
  ParamBuffer& pb = lm->model->params();
  const int head = pb.find("output_layer.weight");
  ASSERT_GE(head, 0);
  const Tensor raw = tensors_of(fixture("baichuan2") + "/model.safetensors").at("lm_head.weight");
  float* w = pb.param_data(head);
  for (int64_t r = 0; r < 100; ++r) {
    double sq = 0;
    for (int64_t c = 0; c < 64; ++c) sq += static_cast<double>(w[r * 64 + c]) * w[r * 64 + c];
    EXPECT_NEAR(std::sqrt(sq), 1.0, 1e-6) << r;
  }
  std::memcpy(w, raw.data<float>(), raw.nbytes());
  EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 1e-2);
}

// HF -> Gale -> HF: every tensor bit for bit but lm_head, which comes back as the normalised rows the NormHead
// computes with (Baichuan's forward normalises them again: the same logits); converted again, the golden holds.
TEST(HfConvertBaichuan, RoundTripIsBitwiseButForTheNormalisedHead) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("baichuan2"), tmp.file("gale")), quiet).ok());
  std::string log;
  Status s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), [&](const std::string& l) { log += l + "\n"; });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(log.find("warning"), std::string::npos) << log;
  const auto before = tensors_of(fixture("baichuan2") + "/model.safetensors");
  const auto after = tensors_of(tmp.file("hf/model.safetensors"));
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [name, t] : before) {
    ASSERT_TRUE(after.count(name)) << name;
    ASSERT_EQ(after.at(name).shape(), t.shape()) << name;
    if (name == "lm_head.weight") continue;
    EXPECT_EQ(0, std::memcmp(after.at(name).data<float>(), t.data<float>(), t.nbytes())) << name;
  }
  const Tensor& raw = before.at("lm_head.weight");
  const Tensor& back = after.at("lm_head.weight");
  for (int64_t r = 0; r < 100; ++r) {
    double sq = 0;
    for (int64_t c = 0; c < 64; ++c) sq += static_cast<double>(raw.data<float>()[r * 64 + c]) * raw.data<float>()[r * 64 + c];
    for (int64_t c = 0; c < 64; ++c)
      EXPECT_NEAR(back.data<float>()[r * 64 + c], raw.data<float>()[r * 64 + c] / std::sqrt(sq), 1e-7) << r;
  }
  const nlohmann::json out = read_json(tmp.file("hf/config.json")), src = read_json(fixture("baichuan2") + "/config.json");
  for (const char* key : {"architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "max_position_embeddings", "model_max_length", "rms_norm_eps",
                          "vocab_size", "tie_word_embeddings", "hidden_act", "z_loss_weight"})
    EXPECT_EQ(out[key], src[key]) << key;
  for (const char* key : {"num_key_value_heads", "head_dim", "rope_theta", "rope_scaling"})
    EXPECT_FALSE(out.contains(key)) << key;
  EXPECT_EQ(out["auto_map"]["AutoModelForCausalLM"], "modeling_baichuan.BaichuanForCausalLM");
  ASSERT_TRUE(convert_hf_to_gale(to_gale(tmp.file("hf"), tmp.file("gale2")), quiet).ok());
  double diff = 0, loss = 0;
  converted_golden("baichuan2", tmp.file("gale2"), &diff, &loss);
  EXPECT_LT(diff, kLogitTolerance);
}

TEST(HfConvertErrors, BaichuanOptionsGaleDoesNotHave) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "baichuan2");
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
    edit_config(dir, [&](nlohmann::json& j) {
      j = read_json(fixture("baichuan2") + "/config.json");
      edit(j);
    });
    return error_of(dir, tmp);
  };
  const std::string cfg = dir + "/config.json";
  EXPECT_EQ(refused([](nlohmann::json& j) { j.erase("max_position_embeddings"); }),
            cfg + ": BaichuanForCausalLM without max_position_embeddings is Baichuan2-13B's form (ALiBi, "
                  "model_max_length), which is not supported yet: Gale reads Baichuan2-7B's (RoPE)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["num_key_value_heads"] = 2; }),
            cfg + ": 'num_key_value_heads' = 2 is not supported yet (Baichuan's W_pack is multi-head: [q; k; v] of "
                  "hidden_size rows each)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["rope_theta"] = 500000; }),
            cfg + ": 'rope_theta' = 500000 is not supported yet (Baichuan2-7B's RotaryEmbedding has the base 10000 "
                  "and reads no rope_theta)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["z_loss_weight"] = 0.0002; }),
            cfg + ": 'z_loss_weight' = 0.0002 is not supported yet (Baichuan's z-loss (z_loss_weight x "
                  "logsumexp(logits)^2 added to the training loss) is not in Gale's loss; 0 (the released models) "
                  "only)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["head_dim"] = 32; }),
            cfg + ": BaichuanForCausalLM has heads of hidden_size / num_attention_heads: expected hidden_size 64 to "
                  "be a multiple of 4 and no other head_dim, found head_dim 32");
}

// The recorded Baichuan architecture is kept only while it can hold the model.
TEST(HfConvert, RecordedBaichuanArchitectureOnlyWhenItFits) {
  HfModel m;
  m.model.hidden_size = 64;
  m.model.num_attention_heads = m.model.num_kv_heads = 4;
  m.model.kv_channels = 16;
  m.model.position_embedding_type = "rope";
  m.model.rotary_base = 10000;
  m.model.untie_embeddings_and_output_weights = true;
  m.arch = HfArchitecture::kLlama;
  const nlohmann::json source = {{"architecture", "BaichuanForCausalLM"}};
  m.model.num_kv_heads = 2;
  EXPECT_EQ(hf_keep_source_architecture(&m, source),
            "the checkpoint was converted from BaichuanForCausalLM, which cannot hold it (--num-query-groups 2: W_pack "
            "is multi-head): writing it as LlamaForCausalLM");
  m.model.num_kv_heads = 4;
  m.model.rotary_base = 500000;
  EXPECT_EQ(hf_keep_source_architecture(&m, source),
            "the checkpoint was converted from BaichuanForCausalLM, which cannot hold it (--rotary-base 500000: its "
            "RoPE base is 10000): writing it as LlamaForCausalLM");
  m.model.rotary_base = 10000;
  m.model.untie_embeddings_and_output_weights = false;
  EXPECT_NE(hf_keep_source_architecture(&m, source).find("its lm_head is not tied"), std::string::npos);
  EXPECT_EQ(m.arch, HfArchitecture::kLlama);
  m.model.untie_embeddings_and_output_weights = true;
  EXPECT_EQ(hf_keep_source_architecture(&m, source), "");
  EXPECT_EQ(m.arch, HfArchitecture::kBaichuan);
}

// ---- ChatGLM3 ----

// kv_channels 24 (not hidden / heads), multi_query_group_num 2, add_qkv_bias, rope_ratio 2: Megatron's flags,
// and the golden logits see the interleaving, the half-head rotation and the base.
TEST(HfConvertChatGLM, GoldenLogitsAndTheFlagsTheySee) {
  TempDir tmp;
  std::string log;
  Status s = convert_hf_to_gale(to_gale(fixture("chatglm3"), tmp.file("gale")),
                                [&](const std::string& line) { log += line + "\n"; });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_NE(log.find("converting ChatGLMModel"), std::string::npos) << log;
  EXPECT_NE(log.find("--rotary-percent 0.5 --rotary-interleaved (MindSpeed-LLM's --use-glm-rope), --rotary-base "
                     "20000, --kv-channels 24, --add-qkv-bias"),
            std::string::npos)
      << log;
  const nlohmann::json args = CheckpointReader::open(tmp.file("gale")).value().section("args").value();
  EXPECT_EQ(args["rotary_percent"], 0.5);
  EXPECT_EQ(args["rotary_interleaved"], true);
  EXPECT_EQ(args["rotary_base"], 20000);
  EXPECT_EQ(args["kv_channels"], 24);
  EXPECT_EQ(args["num_query_groups"], 2);
  EXPECT_EQ(args["add_qkv_bias"], true);
  EXPECT_EQ(args["seq_length"], 64);
  double diff = 0, loss = 0;
  const Golden g = converted_golden("chatglm3", tmp.file("gale"), &diff, &loss);
  EXPECT_LT(diff, kLogitTolerance);
  EXPECT_NEAR(loss, g.loss, kLogitTolerance);
  for (const auto& edit : std::vector<std::function<void(nlohmann::json&)>>{
           [](nlohmann::json& a) { a["rotary_interleaved"] = false; },
           [](nlohmann::json& a) { a["rotary_percent"] = 1.0; },
           [](nlohmann::json& a) { a["rotary_base"] = 10000; }}) {
    auto lm = load_model(tmp.file("gale"), edit);
    EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 1e-2);
  }
}

// HF -> Gale -> HF returns every tensor bit for bit (the inv_freq buffer recomputed) and ChatGLM's keys.
TEST(HfConvertChatGLM, RoundTripReturnsEveryTensorBitForBitAndItsKeys) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("chatglm3"), tmp.file("gale")), quiet).ok());
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet).ok());
  const auto before = tensors_of(fixture("chatglm3") + "/model.safetensors");
  const auto after = tensors_of(tmp.file("hf/model.safetensors"));
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [name, t] : before) {
    ASSERT_TRUE(after.count(name)) << name;
    ASSERT_EQ(after.at(name).shape(), t.shape()) << name;
    EXPECT_EQ(0, std::memcmp(after.at(name).data<float>(), t.data<float>(), t.nbytes())) << name;
  }
  const nlohmann::json out = read_json(tmp.file("hf/config.json")), src = read_json(fixture("chatglm3") + "/config.json");
  for (auto it = src.begin(); it != src.end(); ++it) {
    if (it.key() == "eos_token_id" || it.key() == "pad_token_id") continue;  // the tokenizer's, not kept
    EXPECT_EQ(out[it.key()], it.value()) << it.key();
  }
}

// ChatGLMForConditionalGeneration (the class the checkpoints' weights belong to) reads the same; it is written
// back under the released configs' name, ChatGLMModel.
TEST(HfConvertChatGLM, ForConditionalGenerationNameAndModelTypeHf) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "chatglm3");
  edit_config(dir, [](nlohmann::json& j) { j["architectures"] = {"ChatGLMForConditionalGeneration"}; });
  HfToGaleOptions o = to_gale(dir, tmp.file("gale"));
  o.model_type_hf = "chatglm3";
  ASSERT_TRUE(convert_hf_to_gale(o, quiet).ok());
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet).ok());
  EXPECT_EQ(read_json(tmp.file("hf/config.json"))["architectures"], nlohmann::json::array({"ChatGLMModel"}));
  o = to_gale(fixture("baichuan2"), tmp.file("b"));
  o.model_type_hf = "baichuan2";
  EXPECT_TRUE(convert_hf_to_gale(o, quiet).ok());
  o.model_type_hf = "chatglm3";
  EXPECT_EQ(convert_hf_to_gale(o, quiet).message(), "--model-type-hf chatglm3 does not match " +
                                                        fixture("baichuan2") +
                                                        "/config.json, which describes a BaichuanForCausalLM");
}

// multi_query_attention false: multi-head (multi_query_group_num unread); padded_vocab_size is the vocabulary
// (a tokenizer's vocab_size key is not); no kv_channels: hidden / heads.
TEST(HfConvertChatGLM, ConfigReadsMultiHeadAndThePaddedVocabulary) {
  nlohmann::json j = read_json(fixture("chatglm3") + "/config.json");
  j["multi_query_attention"] = false;
  j["vocab_size"] = 7;
  j.erase("kv_channels");
  j.erase("rope_ratio");
  auto m = hf_model_from_config(j, "config.json", 128, 1);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->arch, HfArchitecture::kChatGLM);
  EXPECT_EQ(m->model.num_kv_heads, 4);
  EXPECT_FALSE(m->model.group_query_attention);
  EXPECT_EQ(m->model.kv_channels, 16);
  EXPECT_EQ(m->model.rotary_base, 10000);
  EXPECT_EQ(m->vocab_size, 100);
  EXPECT_EQ(m->model.padded_vocab_size, 128);
  EXPECT_EQ(m->model.rotary_percent, 0.5);
  EXPECT_TRUE(m->model.rotary_interleaved);
  EXPECT_TRUE(m->model.add_qkv_bias);
  j.erase("add_qkv_bias");  // ChatGLMConfig's default: false
  EXPECT_FALSE(hf_model_from_config(j, "config.json", 128, 1)->model.add_qkv_bias);
}

TEST(HfConvertErrors, ChatGLMOptionsGaleDoesNotHave) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "chatglm3");
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
    edit_config(dir, [&](nlohmann::json& j) {
      j = read_json(fixture("chatglm3") + "/config.json");
      edit(j);
    });
    return error_of(dir, tmp);
  };
  const std::string cfg = dir + "/config.json";
  EXPECT_EQ(refused([](nlohmann::json& j) { j["rmsnorm"] = false; }),
            cfg + ": 'rmsnorm' = false is not supported yet (ChatGLM with LayerNorm and RoPE: Gale reads RMSNorm only)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["add_bias_linear"] = true; }),
            cfg + ": 'add_bias_linear' = true is not supported yet (biases on dense and the MLP; the q/k/v bias "
                  "(add_qkv_bias) is supported)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j.erase("post_layer_norm"); j["post_layer_norm"] = false; }),
            cfg + ": 'post_layer_norm' = false is not supported yet (no final_layernorm)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j.erase("original_rope"); j["original_rope"] = false; }),
            cfg + ": 'original_rope' = false is not supported yet (ChatGLM's RotaryEmbedding implements "
                  "original_impl only)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["pre_seq_len"] = 128; }),
            cfg + ": 'pre_seq_len' = 128 is not supported yet (P-tuning v2 prefix encoders "
                  "(transformer.prefix_encoder) are not converted)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["kv_channels"] = 22; }),
            cfg + ": kv_channels 22 must be a multiple of 4 (ChatGLM rotates kv_channels / 2 dimensions of each head "
                  "in pairs)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["rope_ratio"] = 1.00001; }),
            cfg + ": 'rope_ratio' = 1.00001 is not supported yet (Megatron's --rotary-base 10000 x rope_ratio is a "
                  "positive integer)");
  // The way back: interleaved half-head RoPE is ChatGLM's, and needs the rest of its block.
  ModelArgs a;
  a.hidden_size = 64;
  a.num_attention_heads = a.num_kv_heads = 4;
  a.kv_channels = 16;
  a.position_embedding_type = "rope";
  a.rotary_interleaved = true;
  a.rotary_percent = 0.5;
  a.normalization = "LayerNorm";
  a.swiglu = true;
  a.add_bias_linear = false;
  a.untie_embeddings_and_output_weights = true;
  a.padded_vocab_size = 128;
  EXPECT_EQ(hf_model_from_args(a, MoeArgs(), 100, "ckpt").status().message(),
            "ckpt: a model with --rotary-interleaved --rotary-percent 0.5 is written only as ChatGLMModel: "
            "--normalization RMSNorm, --swiglu, --disable-bias-linear (--add-qkv-bias allowed), "
            "--untie-embeddings-and-output-weights, --position-embedding-type rope without scaling, --kv-channels a "
            "multiple of 4, without experts, q/k norms, --sliding-window, MLA, MTP or noop layers (found "
            "--normalization LayerNorm, swiglu on, linear biases off, untied output on, position embedding rope, "
            "--kv-channels 16)");
  a.normalization = "RMSNorm";
  auto ok = hf_model_from_args(a, MoeArgs(), 100, "ckpt");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->arch, HfArchitecture::kChatGLM);
  a.rotary_percent = 1.0;
  EXPECT_EQ(hf_model_from_args(a, MoeArgs(), 100, "ckpt").status().message(),
            "ckpt: the model has --rotary-interleaved, which no Hugging Face architecture Gale writes can hold "
            "(ChatGLMModel holds it with --rotary-percent 0.5)");
}

// HF -> Megatron's format at TP 2 -> Gale: the golden logits hold (the heads and groups split over two ranks).
TEST(HfConvert, BaichuanAndChatGLMThroughMegatronsFormatAtTp2) {
  for (const char* name : {"baichuan2", "chatglm3"}) {
    TempDir tmp;
    const Status s = hf_through_megatron(fixture(name), tmp, /*tp=*/2);
    ASSERT_TRUE(s.ok()) << name << ": " << s.message();
    double diff = 0, loss = 0;
    converted_golden(name, tmp.file("gale"), &diff, &loss);
    EXPECT_LT(diff, kLogitTolerance) << name;
  }
}

}  // namespace
}  // namespace gale
