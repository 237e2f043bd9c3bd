// HF <-> Gale checkpoint conversion against transformers' own logits (tools/reference/hf_fixture.py).
//
// Each fixture under tests/data/hf/<name>/ is a tiny random HF model saved by transformers, with
// the logits and loss transformers computed for a fixed token sequence. Converting it and running
// Gale's model on the converted checkpoint must reproduce those logits within 1e-4 (fp32 compute on
// both sides; the stored weights are exactly representable in f32). HF -> Gale -> HF must return
// every tensor bit for bit. mistral_swa is the mistral fixture with "sliding_window": 4 and the
// logits of an independent torch reference with that window (tools/reference/sliding_window_fixture.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/model_checkpoint.h"
#include "ckpt/safetensors.h"
#include "ckpt/temp_dir.h"
#include "core/allocator.h"
#include "kernels/op_table.h"
#include "model/gpt_model.h"
#include "train/checkpoint_args.h"
#include "train/hf_config.h"
#include "train/hf_convert.h"
#include "train/hf_files.h"
#include "train/hf_weights.h"
#include "train/megatron_moe_names.h"
#include "train/hf_test_fixtures.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using testing_util::TempDir;
namespace fs = std::filesystem;

using namespace testing_hf;  // NOLINT: the fixture helpers

class HfFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(HfFixture, ConvertedModelReproducesTransformersLogits) {
  TempDir tmp;
  const std::string name = GetParam();
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture(name), tmp.file("gale")), quiet).ok());
  const Golden g = read_golden(name);
  auto lm = load_model(tmp.file("gale"));
  EXPECT_EQ(lm->config.vocab, 128);  // 100 real tokens padded to a multiple of 128
  Comparison c = compare(logits_of(*lm->model, g.tokens), g);
  EXPECT_LT(c.max_diff, kLogitTolerance) << name;
  EXPECT_NEAR(c.loss, g.loss, kLogitTolerance) << name;
  // The padded rows repeat the last real row (as Megatron pads): their logits equal token 99's.
  Tensor logits = logits_of(*lm->model, g.tokens);
  for (int64_t v = 100; v < 128; ++v) EXPECT_EQ(logits.data<float>()[v], logits.data<float>()[99]) << v;
}

std::map<std::string, std::pair<StDType, Tensor>> safetensors_of(const std::string& dir) {
  std::map<std::string, std::pair<StDType, Tensor>> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string p = entry.path().string();
    if (entry.path().extension() != ".safetensors" || entry.path().filename() == "golden.safetensors") continue;
    auto f = SafetensorsFile::open(p);
    EXPECT_TRUE(f.ok()) << f.status().message();
    for (const SafetensorsEntry& e : f->entries()) out[e.name] = {e.dtype, f->read(e.name, DType::kF32).value()};
  }
  return out;
}

TEST_P(HfFixture, RoundTripReturnsEveryTensorBitForBit) {
  TempDir tmp;
  const std::string name = GetParam();
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture(name), tmp.file("gale")), quiet).ok());
  auto before = safetensors_of(fixture(name));
  const bool bf16 = before.begin()->second.first == StDType::kBF16;
  Status s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf"), bf16 ? "bf16" : "fp32"), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  auto after = safetensors_of(tmp.file("hf"));
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [tensor, entry] : before) {
    ASSERT_TRUE(after.count(tensor)) << tensor;
    const Tensor& a = entry.second;
    const Tensor& b = after.at(tensor).second;
    ASSERT_EQ(a.shape(), b.shape()) << tensor;
    EXPECT_EQ(0, std::memcmp(a.data<float>(), b.data<float>(), a.nbytes())) << tensor;
    if (entry.first != StDType::kF16) {
      EXPECT_EQ(after.at(tensor).first, entry.first) << tensor;
    }
  }
  // config.json describes the same model.
  std::ifstream in(tmp.file("hf/config.json")), orig(fixture(name) + "/config.json");
  nlohmann::json out = nlohmann::json::parse(in), src = nlohmann::json::parse(orig);
  EXPECT_EQ(out["vocab_size"], 100);
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                          "intermediate_size", "rms_norm_eps", "rope_theta", "n_embd", "n_layer", "n_head", "n_inner",
                          "layer_norm_epsilon", "n_positions", "max_position_embeddings"})
    if (src.contains(key)) {
      // Qwen3-Next is written with transformers 5.x's rope_parameters (rope_theta inside); the
      // qwen3_next_gated fixture (transformers 4.57.1) has a top-level rope_theta.
      const bool nested = key == std::string("rope_theta") && out.contains("rope_parameters");
      EXPECT_EQ(nested ? out["rope_parameters"][key] : out[key], src[key]) << key;
    }
  if (name != "mistral") {
    EXPECT_EQ(out["architectures"], src["architectures"]);
  }
  if (name == std::string("mistral_swa")) {
    EXPECT_EQ(out["model_type"], "mistral");
    EXPECT_EQ(out["sliding_window"], 4);
  }
  EXPECT_EQ(out.value("tie_word_embeddings", true),
            src.value("tie_word_embeddings", name == "gpt2" || name == "bloom"));
}

INSTANTIATE_TEST_SUITE_P(Architectures, HfFixture,
                         ::testing::Values("gpt2", "bloom", "llama", "qwen2", "mistral", "mixtral", "qwen2_moe",
                                           "deepseek_v3", "qwen3", "mistral_swa", "qwen2_yarn", "qwen3_moe",
                                           "qwen3_next", "gpt_oss", "deepseek_v3_dense", "qwen2_swa",
                                           "qwen3_next_gated", "internlm2", "phi3", "phi3_longrope"));

// Qwen3: q_norm/k_norm become --qk-layernorm's q_layernorm/k_layernorm (recorded in the checkpoint
// args), head_dim 24 (not hidden/heads = 16) becomes --kv-channels; the golden logits see a swap of
// the two norms of layer 0.
TEST(HfConvert, Qwen3RecordsItsQkNormsAndTheGoldenComparisonSeesThem) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("qwen3"), tmp.file("gale")), quiet).ok());
  auto lm = load_model(tmp.file("gale"));
  EXPECT_TRUE(lm->config.qk_layernorm);
  EXPECT_FALSE(lm->config.add_qkv_bias);
  EXPECT_EQ(lm->config.head_dim, 24);
  ParamBuffer& pb = lm->model->params();
  const int q = pb.find("decoder.layers.0.self_attention.q_layernorm.weight");
  const int k = pb.find("decoder.layers.0.self_attention.k_layernorm.weight");
  ASSERT_GE(q, 0);
  ASSERT_GE(k, 0);
  EXPECT_EQ(pb.spec(q).global_shape, (Shape{24}));
  const Golden g = read_golden("qwen3");
  EXPECT_LT(compare(logits_of(*lm->model, g.tokens), g).max_diff, kLogitTolerance);
  std::swap_ranges(pb.param_data(q), pb.param_data(q) + 24, pb.param_data(k));
  EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 100 * kLogitTolerance);
}

// Qwen2-MoE's layer pattern, routing and gated shared expert land where Gale reads them: the
// checkpoint records the flags, and zeroing the shared expert's gate weight (sigmoid 1/2 instead of
// the trained gate) or its down projection breaks the agreement with transformers.
TEST(HfConvert, Qwen2MoeRecordsItsSharedExpertAndTheGoldenComparisonSeesIt) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("qwen2_moe"), tmp.file("gale")), quiet).ok());
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["num_experts"], 4);
  EXPECT_EQ(args["moe_ffn_hidden_size"], 32);
  EXPECT_EQ(args["ffn_hidden_size"], 96);
  EXPECT_EQ(args["moe_layer_freq"], "[0,1]");  // decoder_sparse_step 2: layer 1 sparse
  EXPECT_EQ(args["moe_router_pre_softmax"], true);  // norm_topk_prob false
  EXPECT_EQ(args["moe_shared_expert_intermediate_size"], 48);
  EXPECT_EQ(args["moe_shared_expert_gate"], true);
  EXPECT_EQ(args["add_qkv_bias"], true);
  const Golden g = read_golden("qwen2_moe");
  for (const char* name : {"decoder.layers.1.mlp.shared_experts.gate_weight",
                           "decoder.layers.1.mlp.shared_experts.linear_fc2.weight"}) {
    auto lm = load_model(tmp.file("gale"));
    EXPECT_LT(compare(logits_of(*lm->model, g.tokens), g).max_diff, kLogitTolerance);
    ParamBuffer& pb = lm->model->params();
    const int id = pb.find(name);
    ASSERT_GE(id, 0) << name;
    std::fill(pb.param_data(id), pb.param_data(id) + pb.spec(id).local_numel(), 0.0f);
    EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 100 * kLogitTolerance) << name;
  }
}

// norm_topk_prob true (renormalised over the k) is Megatron's default routing; layer patterns come
// from decoder_sparse_step and mlp_only_layers; a pattern with no sparse layer is refused.
TEST(HfConvert, Qwen2MoeRoutingAndLayerPatternFromTheConfig) {
  std::ifstream in(fixture("qwen2_moe") + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["num_hidden_layers"] = 4;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = {0, 2};
  j["norm_topk_prob"] = true;
  auto m = hf_model_from_config(j, "q/config.json", 128, 1);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE(m->moe.moe_router_pre_softmax);
  EXPECT_EQ(m->moe.layer_pattern, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(m->moe.moe_layer_freq, "[0,1,0,1]");
  // Written back: decoder_sparse_step 2 gives the same layers.
  nlohmann::json out = hf_config_json(m.value(), "float32");
  EXPECT_EQ(out["decoder_sparse_step"], 2);
  EXPECT_EQ(out["mlp_only_layers"], nlohmann::json::array());
  EXPECT_EQ(out["norm_topk_prob"], true);
  // [1, 1, 0, 1] fits no step: mlp_only_layers.
  m->moe.layer_pattern = {1, 1, 0, 1};
  out = hf_config_json(m.value(), "float32");
  EXPECT_EQ(out["decoder_sparse_step"], 1);
  EXPECT_EQ(out["mlp_only_layers"], nlohmann::json::array({2}));
  j["mlp_only_layers"] = {0, 1, 2, 3};
  auto none = hf_model_from_config(j, "q/config.json", 128, 1);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), "q/config.json: 'decoder_sparse_step' / 'mlp_only_layers' leave no sparse layer; "
                                     "convert it as a dense model (Qwen2ForCausalLM) instead");
  j["mlp_only_layers"] = {7};
  auto bad = hf_model_from_config(j, "q/config.json", 128, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "q/config.json: 'mlp_only_layers' must hold layer indices 0 to 3, found [7]");
}

// Qwen3-MoE (tools/reference/hf_fixture_qwen3_moe.py, saved by transformers 5.x: num_local_experts,
// rope_parameters, per-expert tensor names): the checkpoint records Qwen3's attention and the expert
// flags; the routing matters to the golden logits (norm_topk_prob true is Megatron's default routing:
// the same weights with --moe-router-pre-softmax, i.e. without the renormalisation, disagree), and so
// do the router, the experts' [gate; up] order and the dense layer 1's MLP.
TEST(HfConvert, Qwen3MoeRecordsItsExpertsAndRoutingAndTheGoldenComparisonSeesThem) {
  TempDir tmp;
  std::string log;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("qwen3_moe"), tmp.file("gale")),
                                 [&](const std::string& line) { log += line + "\n"; })
                  .ok());
  // router_aux_loss_coef is a training flag (gale pretrain takes it from --moe-aux-loss-coeff, not from the
  // checkpoint's args): the log names it.
  EXPECT_NE(log.find("experts: 4 per layer, top-2, ffn 32 (router_aux_loss_coef 0.001 is a training flag: pass "
                     "--moe-aux-loss-coeff to gale pretrain)\n"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("no shared expert; MoE layers [1,0,1], routing Megatron's default (norm_topk_prob true)\n"),
            std::string::npos)
      << log;
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["num_experts"], 4);
  EXPECT_EQ(args["moe_router_topk"], 2);
  EXPECT_EQ(args["moe_ffn_hidden_size"], 32);
  EXPECT_EQ(args["ffn_hidden_size"], 96);
  EXPECT_EQ(args["moe_layer_freq"], "[1,0,1]");  // mlp_only_layers [1]
  EXPECT_EQ(args["moe_router_pre_softmax"], false);  // norm_topk_prob true
  EXPECT_EQ(args["qk_layernorm"], true);
  EXPECT_EQ(args["add_qkv_bias"], false);
  EXPECT_EQ(args["kv_channels"], 24);
  EXPECT_FALSE(args.contains("moe_shared_expert_intermediate_size"));
  const Golden g = read_golden("qwen3_moe");
  EXPECT_LT(compare(logits_of(*load_model(tmp.file("gale"))->model, g.tokens), g).max_diff, kLogitTolerance);
  auto pre_softmax = load_model(tmp.file("gale"), [](nlohmann::json& a) { a["moe_router_pre_softmax"] = true; });
  EXPECT_GT(compare(logits_of(*pre_softmax->model, g.tokens), g).max_diff, 100 * kLogitTolerance);
  for (const char* name : {"decoder.layers.0.mlp.router.weight",
                           "decoder.layers.2.mlp.experts.local_experts.2.linear_fc1.weight",
                           "decoder.layers.1.mlp.linear_fc1.weight"}) {
    auto lm = load_model(tmp.file("gale"));
    ParamBuffer& pb = lm->model->params();
    const int id = pb.find(name);
    ASSERT_GE(id, 0) << name;
    Tensor t = pb.param(id);
    const int64_t half = t.numel() / 2;  // swap the two halves: router rows 0-1 with 2-3, gate with up
    std::vector<float> first(t.data<float>(), t.data<float>() + half);
    std::memmove(t.data<float>(), t.data<float>() + half, half * sizeof(float));
    std::memcpy(t.data<float>() + half, first.data(), half * sizeof(float));
    EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 100 * kLogitTolerance) << name;
  }
}

// Gale -> HF: a --qk-layernorm MoE model without a shared expert is written as Qwen3MoeForCausalLM
// with the Hub's keys (num_experts, the sparse layers, the routing; router_aux_loss_coef is left to
// transformers' default, as the checkpoint does not record --moe-aux-loss-coeff).
TEST(HfConvert, Qwen3MoeIsWrittenWithTheHubsConfigKeys) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("qwen3_moe"), tmp.file("gale")), quiet).ok());
  Status s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  std::ifstream in(tmp.file("hf/config.json"));
  const nlohmann::json out = nlohmann::json::parse(in);
  EXPECT_EQ(out["architectures"], nlohmann::json::array({"Qwen3MoeForCausalLM"}));
  EXPECT_EQ(out["model_type"], "qwen3_moe");
  EXPECT_EQ(out["num_experts"], 4);
  EXPECT_EQ(out["num_experts_per_tok"], 2);
  EXPECT_EQ(out["moe_intermediate_size"], 32);
  EXPECT_EQ(out["intermediate_size"], 96);
  EXPECT_EQ(out["head_dim"], 24);
  EXPECT_EQ(out["norm_topk_prob"], true);
  EXPECT_EQ(out["decoder_sparse_step"], 1);
  EXPECT_EQ(out["mlp_only_layers"], nlohmann::json::array({1}));
  EXPECT_EQ(out["attention_bias"], false);
  EXPECT_EQ(out["use_sliding_window"], false);
  EXPECT_FALSE(out.contains("shared_expert_intermediate_size"));
  EXPECT_FALSE(out.contains("router_aux_loss_coef"));
  // Read back, the written config describes the same model.
  auto back = hf_model_from_config(out, "hf/config.json", 128, 1);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->arch, HfArchitecture::kQwen3Moe);
  EXPECT_EQ(back->moe.layer_pattern, (std::vector<int>{1, 0, 1}));
  EXPECT_FALSE(back->moe.moe_router_pre_softmax);
}

// Bloom: the checkpoint records ALiBi, --embed-layernorm and the tanh GeLU; the embedding norm is
// where Gale reads it (scaling its weight breaks the agreement with transformers); files saved
// from BloomModel (no "transformer." prefix, as the original bigscience/bloom-* files) convert to
// the same checkpoint; what Gale cannot compute is refused with the key named.
TEST(HfConvert, BloomRecordsAlibiAndItsEmbeddingNorm) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("bloom"), tmp.file("gale")), quiet).ok());
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  const nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["position_embedding_type"], "alibi");
  EXPECT_EQ(args["embed_layernorm"], true);
  EXPECT_EQ(args["openai_gelu"], true);
  EXPECT_EQ(args["num_layers"], 2);
  EXPECT_EQ(args["ffn_hidden_size"], 4 * 48);
  EXPECT_EQ(args["seq_length"], 32);
  auto lm = load_model(tmp.file("gale"));
  const Golden g = read_golden("bloom");
  EXPECT_LT(compare(logits_of(*lm->model, g.tokens), g).max_diff, kLogitTolerance);
  ParamBuffer& pb = lm->model->params();
  const int w = pb.find("embedding.norm.weight");
  ASSERT_GE(w, 0);
  for (int64_t i = 0; i < 48; ++i) pb.param_data(w)[i] *= 1.5f;
  EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 100 * kLogitTolerance);

  // The same weights without the "transformer." prefix.
  fs::create_directories(tmp.file("bare"));
  fs::copy_file(fixture("bloom") + "/config.json", tmp.file("bare/config.json"));
  auto f = SafetensorsFile::open(fixture("bloom") + "/model.safetensors");
  ASSERT_TRUE(f.ok());
  std::vector<Tensor> kept;
  kept.reserve(f->entries().size());
  SafetensorsWriter writer;
  for (const SafetensorsEntry& e : f->entries()) {
    kept.push_back(f->read(e.name, DType::kF32).value());
    ASSERT_TRUE(writer.add(e.name.rfind("transformer.", 0) == 0 ? e.name.substr(12) : e.name, kept.back()).ok());
  }
  ASSERT_TRUE(writer.write(tmp.file("bare/model.safetensors")).ok());
  ASSERT_TRUE(convert_hf_to_gale(to_gale(tmp.file("bare"), tmp.file("gale_bare")), quiet).ok());
  auto bare_lm = load_model(tmp.file("gale_bare"));
  EXPECT_LT(compare(logits_of(*bare_lm->model, g.tokens), g).max_diff, kLogitTolerance);

  std::ifstream in(fixture("bloom") + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  for (const char* key : {"apply_residual_connection_post_layernorm", "slow_but_exact"}) {
    nlohmann::json bad = j;
    bad[key] = true;
    auto m = hf_model_from_config(bad, "b/config.json", 128, 1);
    ASSERT_FALSE(m.ok()) << key;
    EXPECT_NE(m.status().message().find(std::string("b/config.json: '") + key + "'"), std::string::npos)
        << m.status().message();
  }
}

// The model args of the llama fixture converted to a Gale checkpoint (what an export starts from).
ModelArgs converted_llama_args() {
  TempDir tmp;
  EXPECT_TRUE(convert_hf_to_gale(to_gale(fixture("llama"), tmp.file("gale")), quiet).ok());
  auto r = CheckpointReader::open(tmp.file("gale"));
  EXPECT_TRUE(r.ok()) << r.status().message();
  return model_args_from_json(r->section("args").value(), "x").value();
}

// ALiBi models go out as Bloom only when Bloom-shaped; anything else is refused in one line.
TEST(HfConvertErrors, AlibiModelsOtherThanBloomAreRefused) {
  ModelArgs m = converted_llama_args();
  ASSERT_TRUE(hf_model_from_args(m, MoeArgs{}, 100, "x").ok());
  m.position_embedding_type = "alibi";
  auto out = hf_model_from_args(m, MoeArgs{}, 100, "ckpt/metadata.json");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "ckpt/metadata.json: the model has --position-embedding-type alibi, which Gale writes only as "
            "BloomForCausalLM: with --embed-layernorm, LayerNorm, --openai-gelu, linear biases, tied embeddings, "
            "multi-head attention (no GQA) and --ffn-hidden-size 4 x hidden, without experts, --qk-layernorm or "
            "--sliding-window");
  m.position_embedding_type = "rope";
  m.embed_layernorm = true;
  auto norm = hf_model_from_args(m, MoeArgs{}, 100, "ckpt/metadata.json");
  ASSERT_FALSE(norm.ok());
  EXPECT_EQ(norm.status().message(), "ckpt/metadata.json: the model has --embed-layernorm, which Gale writes only as "
                                     "BloomForCausalLM (with --position-embedding-type alibi)");
}

// --softmax-type off-by-one: no architecture Gale writes holds a fixed zero sink logit; learnable
// sinks (and gpt-oss's MLP activation) are GptOssForCausalLM's, which needs the rest of gpt-oss's shape
// (tests/train/hf_convert_gpt_oss_test.cc): a LLaMA-shaped model with only the sinks or only the
// activation is refused, naming the first thing missing.
TEST(HfConvertErrors, SoftmaxTypeSinksAreRefused) {
  ModelArgs m = converted_llama_args();
  ASSERT_TRUE(hf_model_from_args(m, MoeArgs{}, 100, "x").ok());
  m.softmax_type = "off-by-one";
  auto out = hf_model_from_args(m, MoeArgs{}, 100, "ckpt/metadata.json");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "ckpt/metadata.json: the model has --softmax-type off-by-one (attention sinks), which no Hugging Face "
            "architecture Gale writes can hold (GptOssForCausalLM's sinks are --softmax-type learnable)");
  m.softmax_type = "learnable";
  out = hf_model_from_args(m, MoeArgs{}, 100, "ckpt/metadata.json");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "ckpt/metadata.json: a model with gpt-oss's attention sinks or MLP activation is written as "
            "GptOssForCausalLM only with --quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7 "
            "(transformers' GptOssExperts)");
}

TEST(HfConvertErrors, GptOssActivationWithoutTheRestOfGptOssIsRefused) {
  const ModelArgs base = converted_llama_args();
  ModelArgs m = base;
  m.swiglu = false;
  m.quick_geglu = true;
  m.glu_linear_offset = 1.0;
  m.activation_func_clamp_value = 7.0;
  auto out = hf_model_from_args(m, MoeArgs{}, 100, "ckpt/metadata.json");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "ckpt/metadata.json: a model with gpt-oss's attention sinks or MLP activation is written as "
            "GptOssForCausalLM only with --softmax-type learnable (self_attn.sinks)");
  m = base;
  m.activation_func_clamp_value = 7.0;  // a LLaMA export would drop the clamp
  out = hf_model_from_args(m, MoeArgs{}, 100, "ckpt/metadata.json");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "ckpt/metadata.json: a model with gpt-oss's attention sinks or MLP activation is written as "
            "GptOssForCausalLM only with --quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7 "
            "(transformers' GptOssExperts)");
}

// Gale -> HF: a MoE model with a shared expert is Qwen2-MoE only with q/k/v biases and the gate.
TEST(HfConvertErrors, SharedExpertModelsQwen2MoeCannotHold) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("qwen2_moe"), tmp.file("gale")), quiet).ok());
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  const nlohmann::json args = r->section("args").value();
  ModelArgs m = model_args_from_json(args, "x").value();
  MoeArgs moe = moe_args_from_json(args, "x", m.num_layers).value();
  auto ok = hf_model_from_args(m, moe, 100, "x");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->arch, HfArchitecture::kQwen2Moe);
  moe.moe_shared_expert_gate = false;
  auto hf = hf_model_from_args(m, moe, 100, "ckpt/metadata.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().message(),
            "ckpt/metadata.json: a mixture-of-experts model with a shared expert is written as Qwen2MoeForCausalLM "
            "only when it is Qwen2-shaped (RMSNorm, SwiGLU, rope, --disable-bias-linear with --add-qkv-bias, found "
            "--add-qkv-bias on) with --moe-shared-expert-gate (found it off)");
  moe.moe_shared_expert_gate = true;
  m.add_qkv_bias = false;
  EXPECT_FALSE(hf_model_from_args(m, moe, 100, "x").ok());
}

// DeepSeek-V3 (tools/reference/hf_fixture_deepseek_v3.py): the checkpoint records MLA, YaRN and the
// routing flags, and each tensor class the mapping moves matters to the golden logits: dropping the
// correction bias (it changes 15 routing choices of the fixture's tokens), swapping gate and up of
// the dense MLP, of the experts or of the shared expert, and rotating q_pe / k_pe in the rotate-half
// order instead of DeepSeek's interleaved one each break the agreement with transformers.
TEST(HfConvert, DeepseekV3RecordsMlaAndRoutingAndTheGoldenComparisonSeesThem) {
  TempDir tmp;
  Status s = convert_hf_to_gale(to_gale(fixture("deepseek_v3"), tmp.file("gale")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["multi_latent_attention"], true);
  EXPECT_EQ(args["qk_layernorm"], true);
  EXPECT_EQ(args["q_lora_rank"], 16);
  EXPECT_EQ(args["kv_lora_rank"], 12);
  EXPECT_EQ(args["qk_head_dim"], 8);
  EXPECT_EQ(args["qk_pos_emb_head_dim"], 4);
  EXPECT_EQ(args["v_head_dim"], 6);
  EXPECT_EQ(args["rotary_scaling_factor"], 4.0);
  EXPECT_EQ(args["mscale"], 1.0);
  EXPECT_EQ(args["mscale_all_dim"], 0.8);
  EXPECT_EQ(args["num_experts"], 8);
  EXPECT_EQ(args["moe_router_topk"], 2);
  EXPECT_EQ(args["moe_ffn_hidden_size"], 16);
  EXPECT_EQ(args["ffn_hidden_size"], 48);
  EXPECT_EQ(args["moe_layer_freq"], "[0,1,1]");  // first_k_dense_replace 1
  EXPECT_EQ(args["moe_router_score_function"], "sigmoid");
  EXPECT_EQ(args["moe_router_enable_expert_bias"], true);
  EXPECT_EQ(args["moe_router_topk_scaling_factor"], 2.5);
  EXPECT_EQ(args["moe_router_num_groups"], 2);
  EXPECT_EQ(args["moe_router_group_topk"], 1);
  EXPECT_EQ(args["moe_shared_expert_intermediate_size"], 16);
  EXPECT_EQ(args["moe_shared_expert_gate"], false);
  const Golden g = read_golden("deepseek_v3");
  auto swap_halves = [](ParamBuffer& pb, int id) {
    float* w = pb.param_data(id);
    const int64_t half = pb.spec(id).local_numel() / 2;
    std::swap_ranges(w, w + half, w + half);
  };
  auto find = [](ParamBuffer& pb, const std::string& name) {
    const int id = pb.find(name);
    EXPECT_GE(id, 0) << name;
    return id;
  };
  std::vector<std::pair<std::string, std::function<void(ParamBuffer&)>>> breaks;
  breaks.push_back({"no correction bias", [&](ParamBuffer& pb) {
    for (const char* n : {"decoder.layers.1.mlp.router.expert_bias", "decoder.layers.2.mlp.router.expert_bias"}) {
      const int id = find(pb, n);
      std::fill(pb.param_data(id), pb.param_data(id) + pb.spec(id).local_numel(), 0.0f);
    }
  }});
  for (const char* fc1 : {"decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.2.mlp.shared_experts.linear_fc1.weight"})
    breaks.push_back({std::string("gate/up swapped in ") + fc1, [&, fc1](ParamBuffer& pb) { swap_halves(pb, find(pb, fc1)); }});
  breaks.push_back({"gate/up swapped in layer 1's experts", [&](ParamBuffer& pb) {  // some experts see no token
    for (int j = 0; j < 8; ++j)
      swap_halves(pb, find(pb, "decoder.layers.1.mlp.experts.local_experts." + std::to_string(j) + ".linear_fc1.weight"));
  }});
  breaks.push_back({"q_pe / k_pe rows in rotate-half order", [&](ParamBuffer& pb) {
    const int64_t R = 4, Dq = 12, Ckv = 12, Cq = 16, H = 32;
    auto permute = [&](float* rows, int64_t cols) {  // row r <- the interleaved layout's row
      std::vector<float> pe(rows, rows + R * cols);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t from = r < R / 2 ? 2 * r : 2 * (r - R / 2) + 1;
        std::copy(pe.begin() + from * cols, pe.begin() + (from + 1) * cols, rows + r * cols);
      }
    };
    for (int layer = 0; layer < 3; ++layer) {
      const std::string p = "decoder.layers." + std::to_string(layer) + ".self_attention.";
      float* q = pb.param_data(find(pb, p + "linear_q_up_proj.weight"));
      for (int64_t h = 0; h < 4; ++h) permute(q + (h * Dq + 8) * Cq, Cq);
      permute(pb.param_data(find(pb, p + "linear_kv_down_proj.weight")) + Ckv * H, H);
    }
  }});
  for (const auto& [what, apply] : breaks) {
    auto lm = load_model(tmp.file("gale"));
    EXPECT_LT(compare(logits_of(*lm->model, g.tokens), g).max_diff, kLogitTolerance);
    apply(lm->model->params());
    EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 100 * kLogitTolerance) << what;
  }
}

// DeepSeek-V3's config.json keys Gale cannot express are refused with the file and the key; the
// config written back from Gale's flags reads as the same model.
TEST(HfConvertErrors, DeepseekV3OptionsGaleDoesNotHave) {
  std::ifstream in(fixture("deepseek_v3") + "/config.json");
  const nlohmann::json src = nlohmann::json::parse(in);
  auto m = hf_model_from_config(src, "d/config.json", 128, 1);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->arch, HfArchitecture::kDeepseekV3);
  EXPECT_EQ(m->moe.layer_pattern, (std::vector<int>{0, 1, 1}));
  nlohmann::json back = hf_config_json(m.value(), "float32");
  for (const char* key : {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                          "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                          "routed_scaling_factor", "n_group", "topk_group", "first_k_dense_replace", "norm_topk_prob",
                          "max_position_embeddings", "rope_theta", "rms_norm_eps", "intermediate_size"})
    EXPECT_EQ(back[key], src[key]) << key;
  for (const char* key : {"rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                          "mscale_all_dim"})
    EXPECT_EQ(back["rope_scaling"][key], src["rope_scaling"][key]) << key;
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = src;
    edit(j);
    auto r = hf_model_from_config(j, "d/config.json", 128, 1);
    return r.ok() ? std::string("accepted") : r.status().message();
  };
  const std::string yarn = "Gale's MLA YaRN has 4096 original positions, beta_fast 32, beta_slow 1, factor = "
                           "max_position_embeddings / 4096, and mscale with mscale_all_dim both set or both unset)";
  EXPECT_EQ(refused([](nlohmann::json& j) { j["rope_scaling"]["original_max_position_embeddings"] = 8192; }),
            "d/config.json: 'rope_scaling' = " +
                nlohmann::json({{"beta_fast", 32.0}, {"beta_slow", 1.0}, {"factor", 4.0}, {"mscale", 1.0},
                                {"mscale_all_dim", 0.8}, {"original_max_position_embeddings", 8192},
                                {"rope_type", "yarn"}}).dump() + " is not supported yet (" + yarn);
  EXPECT_NE(refused([](nlohmann::json& j) { j["rope_scaling"]["beta_fast"] = 16.0; }).find(yarn), std::string::npos);
  EXPECT_NE(refused([](nlohmann::json& j) { j["max_position_embeddings"] = 8192; }).find(yarn), std::string::npos);
  EXPECT_EQ(refused([](nlohmann::json& j) { j["norm_topk_prob"] = false; }),
            "d/config.json: 'norm_topk_prob' = false is not supported yet (Gale's sigmoid routing divides the chosen "
            "scores by their sum when num_experts_per_tok > 1 and keeps the score when it is 1)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["num_experts_per_tok"] = 3; }).rfind("d/config.json: 'topk_group' = 1", 0), 0u);
  EXPECT_EQ(refused([](nlohmann::json& j) { j["attention_bias"] = true; }),
            "d/config.json: 'attention_bias' = true is not supported yet (MLA's projections have no biases)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["rope_interleave"] = false; }).rfind("d/config.json: 'rope_interleave' = false", 0), 0u);
  EXPECT_EQ(refused([](nlohmann::json& j) { j["scoring_func"] = "softmax"; }).rfind("d/config.json: 'scoring_func' = \"softmax\"", 0), 0u);
  EXPECT_EQ(refused([](nlohmann::json& j) { j["q_lora_rank"] = nullptr; }),
            "d/config.json: 'q_lora_rank' is null (a direct query projection), which is not supported yet "
            "(transformers norms only the key/value latent there; Megatron's --multi-latent-attention with "
            "--qk-layernorm and no --q-lora-rank also norms linear_q_proj's input, and without --qk-layernorm "
            "norms neither)");
  // first_k_dense_replace >= num_hidden_layers: a dense MLA model (tests/data/hf/deepseek_v3_dense); its
  // MTP layers are refused. transformers' default first_k_dense_replace is 3.
  EXPECT_EQ(refused([](nlohmann::json& j) { j["first_k_dense_replace"] = 3; }), "accepted");
  EXPECT_EQ(refused([](nlohmann::json& j) { j.erase("first_k_dense_replace"); }), "accepted");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["first_k_dense_replace"] = 4; j["num_nextn_predict_layers"] = 1; }),
            "d/config.json: 'num_nextn_predict_layers' = 1 with 'first_k_dense_replace' = 4 >= num_hidden_layers 3: "
            "multi-token-prediction layers of a dense DeepSeek-V3 are not supported (Gale reads DeepSeek's MTP layers "
            "as MoE layers)");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["quantization_config"] = {{"quant_method", "fp8"}}; })
                .rfind("d/config.json: 'quantization_config'", 0), 0u);
  // n_group 1 (no group-limited routing) and no rope_scaling (plain RoPE) are accepted.
  EXPECT_EQ(refused([](nlohmann::json& j) { j["n_group"] = 1; j["topk_group"] = 1; j["num_experts_per_tok"] = 3; }), "accepted");
  EXPECT_EQ(refused([](nlohmann::json& j) { j["rope_scaling"] = nullptr; }), "accepted");
}

// A dense DeepSeek-V3 (first_k_dense_replace 3 of 3 layers, tools/reference/hf_fixture_deepseek_v3_dense.py)
// is a dense MLA model: no expert flag is recorded, every layer's MLP is the dense SwiGLU one (swapping
// gate and up of the last layer's breaks the golden logits), and the config written back says
// first_k_dense_replace = num_hidden_layers without expert keys. Such a model with MTP layers is refused
// both ways.
TEST(HfConvert, DenseDeepseekV3IsADenseMlaModel) {
  TempDir tmp;
  Status s = convert_hf_to_gale(to_gale(fixture("deepseek_v3_dense"), tmp.file("gale")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["multi_latent_attention"], true);
  EXPECT_EQ(args["q_lora_rank"], 16);
  EXPECT_EQ(args["ffn_hidden_size"], 48);
  EXPECT_TRUE(!args.contains("num_experts") || args["num_experts"].is_null()) << args["num_experts"];
  const Golden g = read_golden("deepseek_v3_dense");
  auto lm = load_model(tmp.file("gale"));
  ParamBuffer& pb = lm->model->params();
  EXPECT_LT(pb.find("decoder.layers.2.mlp.router.weight"), 0);
  EXPECT_LT(compare(logits_of(*lm->model, g.tokens), g).max_diff, kLogitTolerance);
  const int fc1 = pb.find("decoder.layers.2.mlp.linear_fc1.weight");
  ASSERT_GE(fc1, 0);
  float* w = pb.param_data(fc1);
  const int64_t half = pb.spec(fc1).local_numel() / 2;
  std::swap_ranges(w, w + half, w + half);
  EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 100 * kLogitTolerance);

  std::ifstream in(fixture("deepseek_v3_dense") + "/config.json");
  const nlohmann::json src = nlohmann::json::parse(in);
  auto m = hf_model_from_config(src, "d/config.json", 128, 1);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE(m->moe.enabled());
  auto back_model = hf_model_from_args(m->model, m->moe, 100, "ckpt");
  ASSERT_TRUE(back_model.ok()) << back_model.status().message();
  EXPECT_EQ(back_model->arch, HfArchitecture::kDeepseekV3);
  nlohmann::json back = hf_config_json(back_model.value(), "float32");
  EXPECT_EQ(back["first_k_dense_replace"], 3);
  EXPECT_FALSE(back.contains("n_routed_experts"));
  EXPECT_EQ(back["num_nextn_predict_layers"], 0);
  ModelArgs with_mtp = m->model;
  with_mtp.mtp_num_layers = 1;
  auto refused = hf_model_from_args(with_mtp, m->moe, 100, "ckpt");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "ckpt: a --multi-latent-attention model is written as DeepseekV3ForCausalLM only with --num-experts when it "
            "has --mtp-num-layers (DeepSeek's MTP layers are MoE layers)");
}

// Mixtral's experts land where Gale's MoE layer reads them: the checkpoint records the MoE flags,
// and swapping one expert's gate (w1) and up (w3) halves breaks the agreement with transformers.
TEST(HfConvert, MixtralRecordsItsExpertsAndTheGoldenComparisonSeesThem) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("mixtral"), tmp.file("gale")), quiet).ok());
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["num_experts"], 4);
  EXPECT_EQ(args["moe_router_topk"], 2);
  EXPECT_EQ(args["moe_ffn_hidden_size"], 48);
  EXPECT_EQ(args["moe_layer_freq"], "1");
  const Golden g = read_golden("mixtral");
  auto lm = load_model(tmp.file("gale"));
  ParamBuffer& pb = lm->model->params();
  const int id = pb.find("decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight");
  ASSERT_GE(id, 0);
  Tensor fc1 = pb.param(id);  // [2·48, 64] = [w1; w3]
  const int64_t half = fc1.numel() / 2;
  std::vector<float> w1(fc1.data<float>(), fc1.data<float>() + half);
  std::memmove(fc1.data<float>(), fc1.data<float>() + half, half * sizeof(float));
  std::memcpy(fc1.data<float>() + half, w1.data(), half * sizeof(float));
  EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 100 * kLogitTolerance);
}

// The golden comparison can fail: Gale's model with the query rows of one head put in the
// interleaved-RoPE order (what a wrong RoPE permutation would do) no longer matches transformers.
TEST(HfConvert, GoldenComparisonDetectsAQueryRowPermutation) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("llama"), tmp.file("gale")), quiet).ok());
  const Golden g = read_golden("llama");
  auto lm = load_model(tmp.file("gale"));
  ParamBuffer& pb = lm->model->params();
  int qkv = -1;
  for (int id = 0; id < pb.size(); ++id)
    if (pb.spec(id).name == "decoder.layers.0.self_attention.linear_qkv.weight") qkv = id;
  ASSERT_GE(qkv, 0);
  const int64_t HD = 16, H = 64;
  float* w = pb.param_data(qkv);
  std::vector<float> head(w, w + HD * H);
  for (int64_t r = 0; r < HD; ++r) {  // rotate-half row r <- interleaved row
    const int64_t from = r < HD / 2 ? 2 * r : 2 * (r - HD / 2) + 1;
    std::copy(head.begin() + from * H, head.begin() + (from + 1) * H, w + r * H);
  }
  EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 100 * kLogitTolerance);
}

// bf16 weights (the qwen2 fixture) are stored as bf16 in the Gale checkpoint: exact (the mapping
// only copies) and half the memory of f32 while converting; f32 (llama) and f16 (mistral) stay f32.
TEST(HfConvert, Bf16WeightsAreStoredAsBf16AndConversionHoldsHalfTheBytes) {
  TempDir tmp;
  auto dtypes_of = [&](const std::string& ckpt) {
    std::set<StDType> out;
    auto f = SafetensorsFile::open(ckpt + "/iter_0000000/shard_00000.safetensors");
    EXPECT_TRUE(f.ok());
    for (const SafetensorsEntry& e : f->entries()) out.insert(e.dtype);
    return out;
  };
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("qwen2"), tmp.file("qwen2")), quiet).ok());
  EXPECT_EQ(dtypes_of(tmp.file("qwen2")), std::set<StDType>{StDType::kBF16});
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("llama"), tmp.file("llama")), quiet).ok());
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("mistral"), tmp.file("mistral")), quiet).ok());
  EXPECT_EQ(dtypes_of(tmp.file("llama")), std::set<StDType>{StDType::kF32});
  EXPECT_EQ(dtypes_of(tmp.file("mistral")), std::set<StDType>{StDType::kF32});  // f16 has no exact bf16
  // The mapping's peak memory with bf16 outputs is below that with f32 outputs (for a 7B model
  // 14 against 28 GB: the outputs dominate; in this tiny model one f32 tensor in flight weighs more).
  Allocator& a = host_allocator();
  auto mapping_peak = [&](DType store) {
    HfFiles hf = HfFiles::open(fixture("qwen2")).value();
    HfModel m = hf_model_from_config(hf.config(), hf.config_path(), 128, 1).value();
    a.release_cache();
    a.reset_peak();
    const int64_t base = a.current_bytes();
    auto out = gale_tensors_from_hf(
        m, [&](const std::string& name, const Shape& shape) { return hf.read(name, shape); }, store);
    EXPECT_TRUE(out.ok());
    return a.peak_bytes() - base;
  };
  const int64_t f32_peak = mapping_peak(DType::kF32), bf16_peak = mapping_peak(DType::kBF16);
  EXPECT_LT(bf16_peak, f32_peak * 4 / 5) << bf16_peak << " vs " << f32_peak << " bytes";
}

TEST(HfConvert, PadsTheVocabularyForTheTargetTensorParallelSize) {
  TempDir tmp;
  Status s = convert_hf_to_gale(to_gale(fixture("llama"), tmp.file("gale"), 64, 4), quiet);
  EXPECT_NE(s.message().find("--target-tensor-parallel-size 4: does not divide the 4 attention heads and 2 key/value "
                             "heads of "),
            std::string::npos)
      << s.message();
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("llama"), tmp.file("gale"), 64, 2), quiet).ok());
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->global_shape("embedding.word_embeddings.weight").value(), (Shape{128, 64}));  // 64 x TP 2
  EXPECT_EQ(r->global_shape("output_layer.weight").value(), (Shape{128, 64}));
  nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["vocab_size"], 100);
  EXPECT_EQ(args["padded_vocab_size"], 128);
  EXPECT_EQ(args["make_vocab_size_divisible_by"], 64);
  EXPECT_EQ(args["tensor_model_parallel_size"], 2);
  EXPECT_EQ(args["num_query_groups"], 2);
  EXPECT_EQ(args["group_query_attention"], true);
  EXPECT_EQ(args["rotary_base"], 1000);
  EXPECT_EQ(args["norm_epsilon"], 1e-6);
  EXPECT_EQ(args["untie_embeddings_and_output_weights"], true);
  EXPECT_EQ(r->section("model").value()["padded_vocab_size"], 128);
  EXPECT_EQ(r->iteration(), 0);
}

// --- errors: one line naming the file and the key or tensor -----------------------------------

// Qwen3-Next (tools/reference/hf_fixture_qwen3_next.py, transformers 5.25, bf16): Gated DeltaNet
// layers 0 and 2, gated full attention in layer 1 with partial RoPE, zero-centred norms, MoE with a
// gated shared expert in layers 0 and 1 and a dense layer 2. The converted model reproduces
// transformers' logits; each re-layout matters (HF's per-key-head in_proj_qkvz / in_proj_ba order
// taken as Megatron's sections, the query and gate rows of a head swapped, the gated norm's weight
// not shifted to zero-centred, full RoPE instead of partial). Exported back (the fixture's tensors bit for
// bit: HfFixture.RoundTripReturnsEveryTensorBitForBit) and imported again, every Gale tensor is the
// first import's, bit for bit, and config.json holds Qwen3-Next's keys as transformers 5.x saves them.
TEST(HfConvert, Qwen3NextImportReproducesTransformersLogits) {
  TempDir tmp;
  Status s = convert_hf_to_gale(to_gale(fixture("qwen3_next"), tmp.file("gale")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  const nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["experimental_attention_variant"], "gdn");
  EXPECT_EQ(args["linear_attention_freq"], nlohmann::json::array({1, 0, 1}));
  EXPECT_EQ(args["linear_num_key_heads"], 2);
  EXPECT_EQ(args["linear_num_value_heads"], 4);
  EXPECT_EQ(args["linear_key_head_dim"], 16);
  EXPECT_EQ(args["linear_value_head_dim"], 8);
  EXPECT_EQ(args["attention_output_gate"], true);
  EXPECT_EQ(args["apply_layernorm_1p"], true);
  EXPECT_EQ(args["qk_layernorm"], true);
  EXPECT_DOUBLE_EQ(args["rotary_percent"].get<double>(), 0.25);
  EXPECT_EQ(args["moe_layer_freq"], "[1,1,0]");
  EXPECT_EQ(args["moe_shared_expert_intermediate_size"], 48);
  EXPECT_EQ(args["moe_shared_expert_gate"], true);
  const Golden g = read_golden("qwen3_next");
  auto lm = load_model(tmp.file("gale"));
  Comparison c = compare(logits_of(*lm->model, g.tokens), g);
  EXPECT_LT(c.max_diff, kLogitTolerance);
  EXPECT_NEAR(c.loss, g.loss, kLogitTolerance);
  auto full_rope = load_model(tmp.file("gale"), [](nlohmann::json& a) { a["rotary_percent"] = 1.0; });
  EXPECT_GT(compare(logits_of(*full_rope->model, g.tokens), g).max_diff, 100 * kLogitTolerance);
  // Wrong layouts, applied to the converted tensors: each misses the golden logits.
  auto broken = [&](const char* name, const std::function<void(float*, int64_t)>& edit) {
    auto model = load_model(tmp.file("gale"));
    ParamBuffer& pb = model->model->params();
    const int id = pb.find(name);
    EXPECT_GE(id, 0) << name;
    if (id < 0) return 0.0;
    edit(pb.param_data(id), pb.spec(id).local_numel());
    return compare(logits_of(*model->model, g.tokens), g).max_diff;
  };
  // in_proj's q section of key head 0 swapped with its k section (HF's order read as Megatron's would
  // mix them); H = 64 columns per row, DK = 16 rows per key head.
  EXPECT_GT(broken("decoder.layers.0.self_attention.in_proj.weight",
                   [](float* w, int64_t) { std::swap_ranges(w, w + 16 * 64, w + 32 * 64); }),
            100 * kLogitTolerance);
  // b and a of value head 0 swapped (rows 2·16 + 2·32 + 0 and + 4).
  EXPECT_GT(broken("decoder.layers.0.self_attention.in_proj.weight",
                   [](float* w, int64_t) { std::swap_ranges(w + 96 * 64, w + 97 * 64, w + 100 * 64); }),
            100 * kLogitTolerance);
  // Head 0's query rows swapped with its gate rows (HF's per-head [query | gate] read in order).
  EXPECT_GT(broken("decoder.layers.1.self_attention.linear_qkv.weight",
                   [](float* w, int64_t) { std::swap_ranges(w, w + 16 * 64, w + 32 * 64); }),
            100 * kLogitTolerance);
  // The gated norm's plain weight taken as zero-centred (not shifted by −1).
  EXPECT_GT(broken("decoder.layers.2.self_attention.out_norm.weight",
                   [](float* w, int64_t n) { for (int64_t j = 0; j < n; ++j) w[j] += 1.0f; }),
            100 * kLogitTolerance);
  // Gale -> HF -> Gale.
  s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf"), "bf16"), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  std::ifstream in(tmp.file("hf/config.json"));
  const nlohmann::json out = nlohmann::json::parse(in);
  EXPECT_EQ(out["architectures"], nlohmann::json::array({"Qwen3NextForCausalLM"}));
  EXPECT_EQ(out["model_type"], "qwen3_next");
  EXPECT_EQ(out["layer_types"], nlohmann::json::array({"linear_attention", "full_attention", "linear_attention"}));
  EXPECT_EQ(out["rope_parameters"]["partial_rotary_factor"], 0.25);
  EXPECT_EQ(out["rope_parameters"]["rope_theta"], 10000.0);
  EXPECT_EQ(out["mlp_only_layers"], nlohmann::json::array({2}));
  EXPECT_EQ(out["shared_expert_intermediate_size"], 48);
  EXPECT_EQ(out["norm_topk_prob"], true);
  for (const char* key : {"linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                          "linear_num_key_heads", "linear_num_value_heads", "head_dim", "moe_intermediate_size",
                          "num_experts", "num_experts_per_tok", "tie_word_embeddings"})
    EXPECT_EQ(out[key], nlohmann::json::parse(std::ifstream(fixture("qwen3_next") + "/config.json"))[key]) << key;
  s = convert_hf_to_gale(to_gale(tmp.file("hf"), tmp.file("gale2")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  auto first = CheckpointReader::open(tmp.file("gale"));
  auto second = CheckpointReader::open(tmp.file("gale2"));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->section("args").value(), second->section("args").value());
  ASSERT_EQ(first->tensor_names(), second->tensor_names());
  for (const std::string& name : first->tensor_names()) {
    const Shape shape = first->global_shape(name).value();
    const Tensor a = first->read(name, shape, DType::kF32).value(), b = second->read(name, shape, DType::kF32).value();
    EXPECT_EQ(0, std::memcmp(a.data<float>(), b.data<float>(), a.nbytes())) << name;
  }
  // Megatron's torch format holds Gated DeltaNet layers (train/megatron_gdn_names.h, whose tests
  // convert GDN models) but Megatron-Core's shared experts have no gate, which Qwen3-Next always has:
  // refused from Gale and from Hugging Face for that, not for its GDN layers.
  for (const bool from_hf : {false, true}) {
    MegatronConvertOptions mg;
    mg.from = from_hf ? ModelFormat::kHf : ModelFormat::kGale;
    mg.to = ModelFormat::kMegatron;
    mg.load_dir = from_hf ? fixture("qwen3_next") : tmp.file("gale");
    mg.save_dir = tmp.file("mg");
    s = convert_megatron(mg, quiet);
    EXPECT_EQ(s.message(), "a shared expert gate (--moe-shared-expert-gate, Qwen2-MoE's shared_expert_gate): writing "
                           "it to Megatron's format is not supported (Megatron-Core's shared experts have no gate "
                           "weight)")
        << from_hf;
  }
  EXPECT_FALSE(fs::exists(tmp.file("mg/latest_checkpointed_iteration.txt")));
}

// The Gated DeltaNet models Qwen3NextForCausalLM cannot hold: transformers' class always gates its full
// attention, normalises q and k, uses 1 + w norms and has sparse layers with a gated shared expert.
TEST(HfConvertErrors, GdnModelsQwen3NextCannotHold) {
  auto hf = hf_model_from_config(nlohmann::json::parse(std::ifstream(fixture("qwen3_next") + "/config.json")),
                                 "config.json", 128, 1);
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  ASSERT_TRUE(hf_model_from_args(hf->model, hf->moe, 100, "ckpt").ok());
  auto refusal = [&](const std::function<void(ModelArgs&, MoeArgs&)>& edit) {
    ModelArgs m = hf->model;
    MoeArgs moe = hf->moe;
    edit(m, moe);
    auto out = hf_model_from_args(m, moe, 100, "ckpt");
    return out.ok() ? std::string("accepted") : out.status().message();
  };
  const std::string head = "ckpt: a Gated DeltaNet model (--experimental-attention-variant gdn) is written as "
                           "Qwen3NextForCausalLM only with ";
  EXPECT_EQ(refusal([](ModelArgs& m, MoeArgs&) { m.apply_layernorm_1p = false; }),
            head + "zero-centred RMSNorm (--apply-layernorm-1p)");
  EXPECT_EQ(refusal([](ModelArgs& m, MoeArgs&) { m.attention_output_gate = false; }),
            head + "--attention-output-gate and --qk-layernorm (the full-attention layers' gated q_proj, q_norm and "
                   "k_norm)");
  EXPECT_EQ(refusal([](ModelArgs& m, MoeArgs&) { m.add_qkv_bias = true; }),
            head + "--swiglu and --disable-bias-linear (no --add-qkv-bias)");
  EXPECT_EQ(refusal([](ModelArgs& m, MoeArgs&) { m.sliding_window = 8; }),
            head + "no --sliding-window, --noop-layers or --embed-layernorm");
  EXPECT_EQ(refusal([](ModelArgs&, MoeArgs& moe) { moe = MoeArgs(); }), "accepted");  // every MLP dense
  EXPECT_EQ(refusal([](ModelArgs&, MoeArgs& moe) { moe.moe_shared_expert_gate = false; }),
            head + "--moe-shared-expert-intermediate-size and --moe-shared-expert-gate with --num-experts (its "
                   "sparse layers' gated shared expert)");
  EXPECT_EQ(refusal([](ModelArgs&, MoeArgs& moe) { moe.moe_router_score_function = "sigmoid"; }),
            head + "softmax routing (no --moe-router-score-function sigmoid, expert bias, top-k scaling or groups)");
  EXPECT_EQ(refusal([](ModelArgs& m, MoeArgs&) { m.use_rope_scaling = true; }),
            head + "--position-embedding-type rope in every layer, rotate-half, unscaled");
}

// What Gale cannot hold in a Qwen3-MoE config, and the Gale models Qwen3-MoE cannot hold.
TEST(HfConvertErrors, Qwen3MoeOptionsGaleDoesNotHave) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "qwen3_moe");
  edit_config(dir, [](nlohmann::json& j) {
    j["use_sliding_window"] = true;
    j["sliding_window"] = 8;
  });
  EXPECT_EQ(error_of(dir, tmp), dir + "/config.json: 'use_sliding_window' = true is not supported yet "
                                      "(Qwen3MoeForCausalLM's sliding window: transformers 4.x and 5.x apply it to "
                                      "different layers)");
  edit_config(dir, [](nlohmann::json& j) {
    j["use_sliding_window"] = false;
    j["num_experts"] = 8;  // the Hub's key, disagreeing with transformers 5.x's
  });
  EXPECT_EQ(error_of(dir, tmp), dir + "/config.json: 'num_experts' 8 and 'num_local_experts' 4 disagree (expected "
                                      "one expert count)");
  edit_config(dir, [](nlohmann::json& j) {
    j.erase("num_local_experts");
    j["num_experts_per_tok"] = 9;
  });
  EXPECT_EQ(error_of(dir, tmp), dir + "/config.json: num_experts_per_tok 9 exceeds num_experts 8");
  edit_config(dir, [](nlohmann::json& j) {
    j["num_experts_per_tok"] = 2;
    j["mlp_only_layers"] = {0, 1, 2};
  });
  EXPECT_EQ(error_of(dir, tmp), dir + "/config.json: 'decoder_sparse_step' / 'mlp_only_layers' leave no sparse "
                                      "layer; convert it as a dense model (Qwen3ForCausalLM) instead");
  edit_config(dir, [](nlohmann::json& j) {
    j["mlp_only_layers"] = nlohmann::json::array();
    j["attention_bias"] = true;
  });
  EXPECT_EQ(error_of(dir, tmp), dir + "/config.json: 'attention_bias' = true is not supported yet (biases on "
                                      "q/k/v/o; Qwen2's q/k/v-only bias is supported)");
  // The Hub's spelling (num_experts, no num_local_experts) converts.
  edit_config(dir, [](nlohmann::json& j) {
    j["attention_bias"] = false;
    j["num_experts"] = 4;
    j["mlp_only_layers"] = {1};
  });
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  // Gale -> HF: --qk-layernorm with a shared expert, or with --sliding-window, has no Qwen3-MoE form.
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  const nlohmann::json args = r->section("args").value();
  ModelArgs m = model_args_from_json(args, "x").value();
  MoeArgs moe = moe_args_from_json(args, "x", m.num_layers).value();
  EXPECT_EQ(moe.num_experts, 4);
  EXPECT_EQ(moe.layer_pattern, (std::vector<int>{1, 0, 1}));
  auto ok = hf_model_from_args(m, moe, 100, "x");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->arch, HfArchitecture::kQwen3Moe);
  moe.moe_shared_expert_intermediate_size = 48;
  moe.moe_shared_expert_gate = true;
  auto hf = hf_model_from_args(m, moe, 100, "ckpt/metadata.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().message(),
            "ckpt/metadata.json: the model has --qk-layernorm, which is written as Qwen3ForCausalLM or "
            "Qwen3MoeForCausalLM only when it is LLaMA-shaped (RMSNorm, SwiGLU, rope with --rotary-percent 1, "
            "--disable-bias-linear, no --add-qkv-bias) without a shared expert");
  moe.moe_shared_expert_intermediate_size = kUnset;
  moe.moe_shared_expert_gate = false;
  m.sliding_window = 8;
  hf = hf_model_from_args(m, moe, 100, "ckpt/metadata.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().message(),
            "ckpt/metadata.json: the model has --sliding-window 8, which Qwen3MoeForCausalLM cannot hold (written as "
            "MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM or Qwen3ForCausalLM)");
}

// Qwen3-Next configs: the layer kinds from layer_types (transformers 5.x) or full_attention_interval
// (the Hub's configs), partial_rotary_factor at the top level or in rope_parameters; what Gale cannot
// build is refused naming the key.
TEST(HfConvertErrors, Qwen3NextOptionsGaleDoesNotHave) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "qwen3_next");
  edit_config(dir, [](nlohmann::json& j) { j["layer_types"][1] = "sliding_attention"; });
  EXPECT_EQ(error_of(dir, tmp), dir + "/config.json: 'layer_types' must hold \"linear_attention\" or "
                                      "\"full_attention\", found [\"linear_attention\",\"sliding_attention\","
                                      "\"linear_attention\"]");
  // No linear_attention layer: gated attention in every layer (tests/data/hf/qwen3_next_gated); here the
  // GDN layers' tensors are then unexpected.
  edit_config(dir, [](nlohmann::json& j) {
    j["layer_types"] = {"full_attention", "full_attention", "full_attention"};
  });
  EXPECT_NE(error_of(dir, tmp).find("model.layers.0.self_attn.q_proj.weight"), std::string::npos);
  edit_config(dir, [](nlohmann::json& j) {
    j["layer_types"] = {"linear_attention", "full_attention", "linear_attention"};
    j["rope_parameters"]["partial_rotary_factor"] = 0.3;
  });
  EXPECT_EQ(error_of(dir, tmp), dir + "/config.json: 'partial_rotary_factor' must be in (0, 1] and give an even "
                                      "number of rotary channels of head_dim 16, found 0.3");
  edit_config(dir, [](nlohmann::json& j) {
    j["rope_parameters"]["partial_rotary_factor"] = 0.25;
    j["linear_num_value_heads"] = 3;
  });
  EXPECT_EQ(error_of(dir, tmp), dir + "/config.json: linear_num_value_heads 3 is not a multiple of "
                                      "linear_num_key_heads 2");
  edit_config(dir, [](nlohmann::json& j) {
    j["linear_num_value_heads"] = 4;
    j["mlp_only_layers"] = {0, 1, 2};
  });
  // No sparse layer: every MLP dense; here the experts' tensors are then missing / unexpected.
  EXPECT_NE(error_of(dir, tmp).find("model.layers.0.mlp"), std::string::npos);
  edit_config(dir, [](nlohmann::json& j) { j["mlp_only_layers"] = {2}; });
  // The Hub's spelling: full_attention_interval and a top-level partial_rotary_factor.
  edit_config(dir, [](nlohmann::json& j) {
    j["linear_num_value_heads"] = 4;
    j.erase("layer_types");
    j["full_attention_interval"] = 2;
    j["rope_parameters"].erase("partial_rotary_factor");
    j["partial_rotary_factor"] = 0.5;
  });
  auto hub = hf_model_from_config(
      [&] {
        std::ifstream in(dir + "/config.json");
        return nlohmann::json::parse(in);
      }(),
      "c", 128, 1);
  ASSERT_TRUE(hub.ok()) << hub.status().message();
  EXPECT_EQ(hub->model.linear_attention_pattern, (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(hub->model.linear_attention_freq, "[1,0,1]");
  EXPECT_DOUBLE_EQ(hub->model.rotary_percent, 0.5);
}

// The Hub's Qwen3-Next files carry multi-token-prediction layers (mtp.*) that transformers does not
// load: left out, as any other tensor the architecture has no place for is not.
TEST(HfConvert, Qwen3NextLeavesOutItsMtpLayers) {
  TempDir tmp;
  const std::string dir = copy_fixture(tmp, "qwen3_next");
  auto write_with = [&](const std::string& extra) {
    auto src = SafetensorsFile::open(fixture("qwen3_next") + "/model.safetensors");
    ASSERT_TRUE(src.ok());
    std::vector<Tensor> keep;
    SafetensorsWriter w;
    for (const SafetensorsEntry& e : src->entries()) {
      keep.push_back(src->read(e.name, DType::kF32).value());
      ASSERT_TRUE(w.add(e.name, keep.back()).ok());
    }
    keep.push_back(Tensor::zeros({2, 64}));
    ASSERT_TRUE(w.add(extra, keep.back()).ok());
    ASSERT_TRUE(w.write(dir + "/model.safetensors").ok());
  };
  write_with("mtp.fc.weight");
  Status s = convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet);
  EXPECT_TRUE(s.ok()) << s.message();
  write_with("model.layers.0.linear_attn.extra.weight");
  EXPECT_EQ(error_of(dir, tmp), dir + ": tensor 'model.layers.0.linear_attn.extra.weight' has no place in a "
                                      "Qwen3NextForCausalLM built from " + dir +
                                      "/config.json (an option Gale does not support?)");
}

TEST(HfConvertErrors, MissingConfigOrWeights) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "gpt2");
  fs::remove(dir + "/model.safetensors");
  EXPECT_NE(error_of(dir, tmp).find("no model.safetensors or model.safetensors.index.json"), std::string::npos);
  fs::remove(dir + "/config.json");
  EXPECT_NE(error_of(dir, tmp).find("no config.json"), std::string::npos);
  EXPECT_NE(error_of(tmp.file("nowhere"), tmp).find("not a directory"), std::string::npos);
}

TEST(HfConvertErrors, ShardMissingFromTheIndex) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "llama");
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  std::string e = error_of(dir, tmp);
  EXPECT_NE(e.find("model-00002-of-00002.safetensors"), std::string::npos) << e;
}

TEST(HfConvertErrors, UnknownArchitectureAndUnsupportedOptions) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "llama");
  edit_config(dir, [](nlohmann::json& j) { j["architectures"] = {"FalconForCausalLM"}; });
  std::string e = error_of(dir, tmp);
  EXPECT_EQ(e, dir + "/config.json: architecture 'FalconForCausalLM' is not supported yet (supported: "
               "GPT2LMHeadModel, BloomForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
               "MistralForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, Qwen3NextForCausalLM, "
               "DeepseekV3ForCausalLM, DeepseekV32ForCausalLM, GptOssForCausalLM, InternLM2ForCausalLM, Phi3ForCausalLM, "
               "GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, BaichuanForCausalLM, ChatGLMModel, "
               "ChatGLMForConditionalGeneration)");
  edit_config(dir, [](nlohmann::json& j) {
    j["architectures"] = {"LlamaForCausalLM"};
    j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  });
  e = error_of(dir, tmp);
  EXPECT_NE(e.find("config.json: 'rope_scaling' = {\"factor\":2.0,\"type\":\"dynamic\"} is not supported yet"),
            std::string::npos)
      << e;
  edit_config(dir, [](nlohmann::json& j) {
    j["rope_scaling"] = nullptr;
    j["hidden_act"] = "gelu";
  });
  EXPECT_NE(error_of(dir, tmp).find("'hidden_act' = \"gelu\" is not supported yet"), std::string::npos);
  edit_config(dir, [](nlohmann::json& j) {
    j["hidden_act"] = "silu";
    j["num_hidden_layers"] = "two";
  });
  EXPECT_NE(error_of(dir, tmp).find("config.json: 'num_hidden_layers' must be a positive integer, found \"two\""),
            std::string::npos);
}

// Llama 3's rope_scaling is --use-rope-scaling --rope-scaling-factor (recorded, used by the model
// built from the checkpoint, and written back); other constants than Megatron's are refused.
TEST(HfConvert, Llama3RopeScalingConvertsAndRoundTrips) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "llama");
  edit_config(dir, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  });
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  auto lm = load_model(tmp.file("gale"));
  EXPECT_EQ(lm->config.rope_scaling_factor, 32.0);
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("back")), quiet).ok());
  std::ifstream config(tmp.file("back") + "/config.json");
  const nlohmann::json back = nlohmann::json::parse(config);
  EXPECT_EQ(back["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(back["rope_scaling"]["factor"], 32.0);
  EXPECT_EQ(back["rope_scaling"]["original_max_position_embeddings"], 8192);
  edit_config(dir, [](nlohmann::json& j) { j["rope_scaling"]["high_freq_factor"] = 2.0; });
  const std::string e = error_of(dir, tmp);
  EXPECT_NE(e.find("'rope_scaling' = "), std::string::npos) << e;
  EXPECT_NE(e.find("Megatron's --use-rope-scaling is Llama 3's scaling with low_freq_factor 1"), std::string::npos) << e;
}

// rope_scaling {"rope_type": "linear"} (position interpolation) is --rotary-seq-len-interpolation-factor:
// recorded, used by the model built from the checkpoint, and written back.
TEST(HfConvert, LinearRopeScalingIsPositionInterpolation) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "llama");
  edit_config(dir, [](nlohmann::json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; });
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  auto lm = load_model(tmp.file("gale"));
  EXPECT_EQ(lm->config.rope_position_scale, 0.5);
  EXPECT_EQ(lm->config.rope_scaling_factor, 0.0);
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("back")), quiet).ok());
  std::ifstream config(tmp.file("back") + "/config.json");
  const nlohmann::json back = nlohmann::json::parse(config);
  EXPECT_EQ(back["rope_scaling"]["rope_type"], "linear");
  EXPECT_EQ(back["rope_scaling"]["factor"], 2.0);
  edit_config(dir, [](nlohmann::json& j) { j["rope_scaling"]["factor"] = 0.0; });
  EXPECT_NE(error_of(dir, tmp).find("rope_type linear with a positive factor"), std::string::npos);
}

// Qwen2.5-style rope_scaling {"type": "yarn", ...} is --position-embedding-type yarn, read as
// transformers 5.x computes it (factor as given, original_max_position_embeddings, betas, truncate,
// mscale with mscale_all_dim only as a pair): recorded, used by the model built from the checkpoint,
// and written back; what Megatron's flags cannot hold is refused.
TEST(HfConvert, YarnRopeScalingConvertsAndRoundTrips) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "qwen2");
  edit_config(dir, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 16}};
  });
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  auto lm = load_model(tmp.file("gale"));
  const YarnConfig& y = lm->config.yarn;
  EXPECT_TRUE(y.enabled);
  EXPECT_EQ(y.scaling_factor, 4.0);
  EXPECT_EQ(y.original_max_positions, 16);
  EXPECT_EQ(y.beta_fast, 32.0);
  EXPECT_EQ(y.beta_slow, 1.0);
  EXPECT_EQ(y.mscale, 1.0);  // HF's attention factor m(4, 1): Megatron's mscale 1 over mscale_all_dim 0
  EXPECT_EQ(y.mscale_all_dim, 0.0);
  EXPECT_TRUE(y.round_to_int);
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("back")), quiet).ok());
  {
    std::ifstream config(tmp.file("back") + "/config.json");
    const nlohmann::json back = nlohmann::json::parse(config);
    EXPECT_EQ(back["model_type"], "qwen2");
    EXPECT_EQ(back["rope_scaling"]["rope_type"], "yarn");
    EXPECT_EQ(back["rope_scaling"]["factor"], 4.0);
    EXPECT_EQ(back["rope_scaling"]["original_max_position_embeddings"], 16);
    EXPECT_EQ(back["rope_scaling"]["truncate"], true);
    EXPECT_FALSE(back["rope_scaling"].contains("mscale"));
  }
  // Every field, and no original_max_position_embeddings in rope_scaling: max_position_embeddings.
  edit_config(dir, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0},      {"beta_fast", 16.0},     {"beta_slow", 2.0},
                         {"truncate", false},   {"mscale", 0.707},    {"mscale_all_dim", 0.3}};
  });
  fs::remove_all(tmp.file("gale"));
  fs::remove_all(tmp.file("back"));
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  const YarnConfig z = load_model(tmp.file("gale"))->config.yarn;
  EXPECT_EQ(z.original_max_positions, 64);
  EXPECT_EQ(z.beta_fast, 16.0);
  EXPECT_EQ(z.beta_slow, 2.0);
  EXPECT_FALSE(z.round_to_int);
  EXPECT_EQ(z.mscale, 0.707);
  EXPECT_EQ(z.mscale_all_dim, 0.3);
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("back")), quiet).ok());
  {
    std::ifstream config(tmp.file("back") + "/config.json");
    const nlohmann::json back = nlohmann::json::parse(config);
    EXPECT_EQ(back["rope_scaling"]["original_max_position_embeddings"], 64);
    EXPECT_EQ(back["rope_scaling"]["beta_fast"], 16.0);
    EXPECT_EQ(back["rope_scaling"]["truncate"], false);
    EXPECT_EQ(back["rope_scaling"]["mscale"], 0.707);
    EXPECT_EQ(back["rope_scaling"]["mscale_all_dim"], 0.3);
  }
  // mscale without mscale_all_dim counts for nothing in transformers: Megatron's defaults.
  edit_config(dir, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}, {"mscale", 0.707}};
  });
  fs::remove_all(tmp.file("gale"));
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  EXPECT_EQ(load_model(tmp.file("gale"))->config.yarn.mscale, 1.0);
  // An attention_factor of its own, and a factor below 1, are refused naming rope_scaling.
  edit_config(dir, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}, {"attention_factor", 1.5}};
  });
  std::string e = error_of(dir, tmp);
  EXPECT_NE(e.find("'rope_scaling' = "), std::string::npos) << e;
  EXPECT_NE(e.find("no attention_factor other than the one factor, mscale and mscale_all_dim give"), std::string::npos)
      << e;
  edit_config(dir, [](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 0.5}}; });
  EXPECT_NE(error_of(dir, tmp).find("Megatron's --position-embedding-type yarn takes a factor >= 1"), std::string::npos);
  // The attention factor transformers would derive is accepted when given explicitly.
  edit_config(dir, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 0.1 * std::log(4.0) + 1.0}};
  });
  fs::remove_all(tmp.file("gale"));
  EXPECT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
}

// transformers 5.x configs keep RoPE in rope_parameters (rope_theta inside; qwen2_yarn's golden run
// reads one): a default type is plain RoPE with that base, per-layer-type parameters are refused.
TEST(HfConvert, Transformers5RopeParameters) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "qwen2");
  edit_config(dir, [](nlohmann::json& j) {
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000.0}};
  });
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  auto lm = load_model(tmp.file("gale"));
  EXPECT_EQ(lm->config.rotary_base, 5000.0);
  EXPECT_FALSE(lm->config.yarn.enabled);
  edit_config(dir, [](nlohmann::json& j) {
    j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 5000.0}}}};
  });
  EXPECT_NE(error_of(dir, tmp).find("per-layer-type RoPE parameters are not supported"), std::string::npos);
}

// The window the checkpoint records for `config` edited into the fixture `name` (0: none), and
// the config.json converting it back writes.
struct WindowRoundTrip {
  int64_t recorded = 0, model = 0;
  nlohmann::json back;
};
WindowRoundTrip window_round_trip(const TempDir& tmp, const std::string& name,
                                  const std::function<void(nlohmann::json&)>& config) {
  fs::remove_all(tmp.file(name));
  std::string dir = copy_fixture(tmp, name);
  edit_config(dir, config);
  fs::remove_all(tmp.file("gale"));
  fs::remove_all(tmp.file("back"));
  Status s = convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet);
  EXPECT_TRUE(s.ok()) << s.message();
  WindowRoundTrip out;
  auto r = CheckpointReader::open(tmp.file("gale"));
  const nlohmann::json args = r->section("args").value();
  out.recorded = args.value("sliding_window", int64_t{0});
  out.model = load_model(tmp.file("gale"))->config.sliding_window;
  s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("back")), quiet);
  EXPECT_TRUE(s.ok()) << s.message();
  std::ifstream in(tmp.file("back") + "/config.json");
  out.back = nlohmann::json::parse(in);
  return out;
}

// Mistral's sliding_window W < max_position_embeddings is --sliding-window W (recorded in the
// checkpoint, used by the model, written back as MistralForCausalLM); W >= max_position_embeddings
// hides nothing and is no window (written back as LLaMA).
TEST(HfConvert, MistralSlidingWindowIsRecordedAndWrittenBack) {
  TempDir tmp;
  WindowRoundTrip w = window_round_trip(tmp, "mistral", [](nlohmann::json& j) { j["sliding_window"] = 16; });
  EXPECT_EQ(w.recorded, 16);
  EXPECT_EQ(w.model, 16);
  EXPECT_EQ(w.back["architectures"], nlohmann::json({"MistralForCausalLM"}));
  EXPECT_EQ(w.back["model_type"], "mistral");
  EXPECT_EQ(w.back["sliding_window"], 16);
  w = window_round_trip(tmp, "mistral", [](nlohmann::json& j) { j["sliding_window"] = 64; });
  EXPECT_EQ(w.recorded, 0);
  EXPECT_EQ(w.model, 0);
  EXPECT_EQ(w.back["architectures"], nlohmann::json({"LlamaForCausalLM"}));
  // Absent: MistralConfig's default 4096, which covers this fixture's 64 positions.
  w = window_round_trip(tmp, "mistral", [](nlohmann::json& j) {
    j.erase("sliding_window");
    j["max_position_embeddings"] = 8192;
  });
  EXPECT_EQ(w.recorded, 4096);
  w = window_round_trip(tmp, "mixtral", [](nlohmann::json& j) { j["sliding_window"] = 8; });
  EXPECT_EQ(w.model, 8);
  EXPECT_EQ(w.back["architectures"], nlohmann::json({"MixtralForCausalLM"}));
  EXPECT_EQ(w.back["sliding_window"], 8);
}

// Qwen2's window applies to the layers i >= max_window_layers (transformers' Qwen2Config) and only
// with use_sliding_window: in every layer it is --sliding-window, written back with
// max_window_layers 0; in some layers only: hf_convert_window_test.cc.
TEST(HfConvert, Qwen2SlidingWindowInEveryLayerOrNone) {
  TempDir tmp;
  WindowRoundTrip w = window_round_trip(tmp, "qwen2", [](nlohmann::json& j) {
    j["use_sliding_window"] = true;
    j["sliding_window"] = 8;
    j["max_window_layers"] = 0;
  });
  EXPECT_EQ(w.model, 8);
  EXPECT_EQ(w.back["architectures"], nlohmann::json({"Qwen2ForCausalLM"}));
  EXPECT_EQ(w.back["use_sliding_window"], true);
  EXPECT_EQ(w.back["sliding_window"], 8);
  EXPECT_EQ(w.back["max_window_layers"], 0);
  w = window_round_trip(tmp, "qwen2", [](nlohmann::json& j) {  // layer_types says it instead
    j["use_sliding_window"] = true;
    j["sliding_window"] = 8;
    j["max_window_layers"] = 28;
    j["layer_types"] = {"sliding_attention", "sliding_attention"};
  });
  EXPECT_EQ(w.model, 8);
  w = window_round_trip(tmp, "qwen2", [](nlohmann::json& j) {  // every layer below max_window_layers
    j["use_sliding_window"] = true;
    j["sliding_window"] = 8;
    j["max_window_layers"] = 2;
  });
  EXPECT_EQ(w.model, 0);
  EXPECT_EQ(w.back["use_sliding_window"], false);
  w = window_round_trip(tmp, "qwen2", [](nlohmann::json& j) {  // not used
    j["use_sliding_window"] = false;
    j["sliding_window"] = 8;
    j["max_window_layers"] = 0;
  });
  EXPECT_EQ(w.model, 0);
}

// Qwen2-MoE's window in only some layers is refused (Qwen2 / Qwen3 read it: hf_convert_window_test.cc).
TEST(HfConvertErrors, SlidingWindowInSomeLayersOnly) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "qwen2_moe");
  edit_config(dir, [](nlohmann::json& j) {
    j["use_sliding_window"] = true;
    j["sliding_window"] = 8;
    j["max_window_layers"] = 1;
  });
  std::string e = error_of(dir, tmp);
  EXPECT_NE(e.find("config.json: 'sliding_window' = 8 is used by 1 of 2 layers (max_window_layers 1); per-layer "
                   "windows are read for Qwen2ForCausalLM and Qwen3ForCausalLM only"),
            std::string::npos)
      << e;
  // Gale -> HF: GPT-2 has no window.
  ModelArgs m;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.num_kv_heads = 4;
  m.kv_channels = 16;
  m.ffn_hidden_size = 256;
  m.max_position_embeddings = 32;
  m.padded_vocab_size = 128;
  m.sliding_window = 8;
  auto hf = hf_model_from_args(m, MoeArgs{}, 100, "ckpt/metadata.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().message(), "ckpt/metadata.json: the model has --sliding-window 8, which GPT2LMHeadModel cannot "
                                   "hold (written as MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, "
                                   "Qwen2MoeForCausalLM or Qwen3ForCausalLM)");
}

TEST(HfConvertErrors, MixtralOptionsGaleDoesNotHaveAndMoeModelsMixtralCannotHold) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "mixtral");
  edit_config(dir, [](nlohmann::json& j) { j["router_jitter_noise"] = 0.01; });
  std::string e = error_of(dir, tmp);
  EXPECT_NE(e.find("config.json: 'router_jitter_noise' = 0.01 is not supported yet"), std::string::npos) << e;
  edit_config(dir, [](nlohmann::json& j) {
    j["router_jitter_noise"] = 0.0;
    j["num_experts_per_tok"] = 5;
  });
  e = error_of(dir, tmp);
  EXPECT_NE(e.find("config.json: num_experts_per_tok 5 exceeds num_local_experts 4"), std::string::npos) << e;
  // Gale -> HF: a MoE model is Mixtral only with experts in every layer and Megatron's routing.
  edit_config(dir, [](nlohmann::json& j) { j["num_experts_per_tok"] = 2; });
  ASSERT_TRUE(convert_hf_to_gale(to_gale(dir, tmp.file("gale")), quiet).ok());
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  const nlohmann::json args = r->section("args").value();
  const ModelArgs m = model_args_from_json(args, "x").value();
  MoeArgs moe = moe_args_from_json(args, "x", m.num_layers).value();
  ASSERT_TRUE(hf_model_from_args(m, moe, 100, "x").ok());
  moe.moe_layer_freq = "[1,0]";
  moe.layer_pattern = {1, 0};
  auto hf = hf_model_from_args(m, moe, 100, "ckpt/metadata.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("ckpt/metadata.json: a mixture-of-experts model (4 experts) is written as "
                                       "MixtralForCausalLM only when it is LLaMA-shaped"),
            std::string::npos)
      << hf.status().message();
  EXPECT_NE(hf.status().message().find("(--moe-layer-freq 1, found [1,0])"), std::string::npos);
  moe.moe_layer_freq = "1";
  moe.layer_pattern = {1, 1};
  moe.moe_router_pre_softmax = true;
  EXPECT_FALSE(hf_model_from_args(m, moe, 100, "x").ok());
  moe.moe_router_pre_softmax = false;  // Mixtral's gate has no sigmoid scores, expert bias or groups
  moe.moe_router_score_function = "sigmoid";
  moe.moe_router_enable_expert_bias = true;
  hf = hf_model_from_args(m, moe, 100, "x");
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("only with softmax routing (found --moe-router-score-function sigmoid, "
                                       "expert bias on, top-k scaling factor unset, group-limited routing off)"),
            std::string::npos)
      << hf.status().message();
  moe.moe_router_score_function = "softmax";
  moe.moe_router_enable_expert_bias = false;
  moe.moe_router_num_groups = 2;
  moe.moe_router_group_topk = 1;
  EXPECT_FALSE(hf_model_from_args(m, moe, 100, "x").ok());
}

// The routing flags travel in the checkpoint's args (gale generate/evaluate rebuild the model from
// them); older checkpoints without them get Megatron's defaults.
TEST(CheckpointArgs, MoeRoutingFlagsRoundTrip) {
  MoeArgs moe;
  moe.num_experts = 8;
  moe.moe_ffn_hidden_size = 16;
  moe.moe_router_score_function = "sigmoid";
  moe.moe_router_enable_expert_bias = true;
  moe.moe_router_topk_scaling_factor = 2.5;
  moe.moe_router_num_groups = 4;
  moe.moe_router_group_topk = 2;
  moe.moe_input_jitter_eps = 0.05;
  nlohmann::json args = nlohmann::json::object();
  add_moe_flags_json(moe, &args);
  const MoeArgs back = moe_args_from_json(args, "x", 2).value();
  EXPECT_EQ(back.moe_input_jitter_eps, 0.05);
  EXPECT_EQ(back.moe_router_score_function, "sigmoid");
  EXPECT_TRUE(back.moe_router_enable_expert_bias);
  EXPECT_EQ(back.moe_router_topk_scaling_factor, 2.5);
  EXPECT_EQ(back.moe_router_num_groups, 4);
  EXPECT_EQ(back.moe_router_group_topk, 2);
  for (const char* key : {"moe_router_score_function", "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor",
                          "moe_router_num_groups", "moe_router_group_topk", "moe_input_jitter_eps"})
    args.erase(key);
  const MoeArgs old = moe_args_from_json(args, "x", 2).value();
  EXPECT_TRUE(unset(old.moe_input_jitter_eps));
  EXPECT_EQ(old.moe_router_score_function, "softmax");
  EXPECT_FALSE(old.moe_router_enable_expert_bias);
  EXPECT_TRUE(unset(old.moe_router_topk_scaling_factor));
  EXPECT_EQ(old.moe_router_group_topk, kUnset);
}

// The load-balancing types and coefficients, as Megatron's args hold them: a string and a number,
// or (Megatron's list form) a list of each, in Gale's checkpoint args and Megatron's Namespace; a
// one-element list read back is the scalar form (Megatron's validate_args).
// quantile_balancing's EMA is recorded with it (absent otherwise) and read back.
TEST(CheckpointArgs, QuantileBalancingEmaRoundTrips) {
  MoeArgs moe;
  moe.num_experts = 8;
  moe.moe_ffn_hidden_size = 16;
  nlohmann::json plain = nlohmann::json::object();
  add_moe_flags_json(moe, &plain);
  EXPECT_FALSE(plain.contains("moe_router_quantile_balancing_ema"));
  moe.moe_router_load_balancing_type = "quantile_balancing";
  moe.moe_aux_loss_coeff = 0.0;
  moe.moe_router_quantile_balancing_ema = 0.75;
  nlohmann::json qb = nlohmann::json::object();
  add_moe_flags_json(moe, &qb);
  EXPECT_EQ(qb["moe_router_load_balancing_type"], "quantile_balancing");
  EXPECT_EQ(qb["moe_router_quantile_balancing_ema"], 0.75);
  const MoeArgs back = moe_args_from_json(qb, "x", 2).value();
  EXPECT_EQ(back.moe_router_load_balancing_type, "quantile_balancing");
  EXPECT_EQ(back.moe_router_quantile_balancing_ema, 0.75);
}

TEST(CheckpointArgs, MoeLoadBalancingTypesRoundTripAsScalarOrList) {
  MoeArgs moe;
  moe.num_experts = 8;
  moe.moe_ffn_hidden_size = 16;
  moe.moe_router_load_balancing_type = "seq_aux_loss";
  moe.moe_aux_loss_coeff = 1e-3;
  nlohmann::json scalar = nlohmann::json::object();
  add_moe_flags_json(moe, &scalar);
  EXPECT_EQ(scalar["moe_router_load_balancing_type"], "seq_aux_loss");
  EXPECT_EQ(scalar["moe_aux_loss_coeff"], 1e-3);
  const MoeArgs back_scalar = moe_args_from_json(scalar, "x", 2).value();
  EXPECT_EQ(back_scalar.moe_router_load_balancing_type, "seq_aux_loss");
  EXPECT_EQ(back_scalar.moe_aux_loss_coeff, 1e-3);
  EXPECT_TRUE(back_scalar.moe_router_load_balancing_types.empty());

  moe.moe_router_load_balancing_types = {"aux_loss", "global_aux_loss"};
  moe.moe_aux_loss_coeffs = {1e-2, 1e-4};
  nlohmann::json list = nlohmann::json::object();
  add_moe_flags_json(moe, &list);
  EXPECT_EQ(list["moe_router_load_balancing_type"], nlohmann::json({"aux_loss", "global_aux_loss"}));
  EXPECT_EQ(list["moe_aux_loss_coeff"], nlohmann::json({1e-2, 1e-4}));
  const MoeArgs back = moe_args_from_json(list, "x", 2).value();
  EXPECT_EQ(back.moe_router_load_balancing_types, moe.moe_router_load_balancing_types);
  EXPECT_EQ(back.moe_aux_loss_coeffs, moe.moe_aux_loss_coeffs);
  EXPECT_EQ(back.aux_loss_coeff("global_aux_loss"), 1e-4);

  PyValue ns;
  ns.kind = PyValue::kDict;
  add_megatron_moe_args(moe, 1, 1, ns);
  const PyValue* types = ns.get("moe_router_load_balancing_type");
  const PyValue* coeffs = ns.get("moe_aux_loss_coeff");
  ASSERT_TRUE(types && coeffs);
  ASSERT_EQ(types->kind, PyValue::kList);
  ASSERT_EQ(coeffs->kind, PyValue::kList);
  ASSERT_EQ(types->items.size(), 2u);
  EXPECT_EQ(types->items[1]->s, "global_aux_loss");
  EXPECT_EQ(coeffs->items[1]->f, 1e-4);
  moe.moe_router_load_balancing_types.clear();
  moe.moe_aux_loss_coeffs.clear();
  add_megatron_moe_args(moe, 1, 1, ns);
  EXPECT_EQ(ns.get("moe_router_load_balancing_type")->s, "seq_aux_loss");
  EXPECT_EQ(ns.get("moe_aux_loss_coeff")->f, 1e-3);

  nlohmann::json one = list;  // a one-element list: the scalar form
  one["moe_router_load_balancing_type"] = nlohmann::json({"global_aux_loss"});
  one["moe_aux_loss_coeff"] = nlohmann::json({0.5});
  const MoeArgs back_one = moe_args_from_json(one, "x", 2).value();
  EXPECT_EQ(back_one.moe_router_load_balancing_type, "global_aux_loss");
  EXPECT_EQ(back_one.moe_aux_loss_coeff, 0.5);
  EXPECT_TRUE(back_one.moe_router_load_balancing_types.empty());
  one["moe_aux_loss_coeff"] = 0.5;  // Megatron asserts a list of coefficients with a list of types
  EXPECT_EQ(moe_args_from_json(one, "x", 2).status().message(),
            "x: args 'moe_aux_loss_coeff' is 0.5, expected a list of 1 numbers as 'moe_router_load_balancing_type' "
            "[\"global_aux_loss\"]");
}

TEST(HfConvertErrors, TensorOfTheWrongShapeOrMissing) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "qwen2");
  edit_config(dir, [](nlohmann::json& j) { j["intermediate_size"] = 128; });
  std::string e = error_of(dir, tmp);
  EXPECT_NE(e.find("model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [96, 64], expected "
                   "[128, 64] (from "),
            std::string::npos)
      << e;
  edit_config(dir, [](nlohmann::json& j) {
    j["intermediate_size"] = 96;
    j["architectures"] = {"LlamaForCausalLM"};  // Qwen2's q/k/v biases then have no place
  });
  e = error_of(dir, tmp);
  EXPECT_NE(e.find("tensor 'model.layers.0.self_attn.k_proj.bias' has no place in a LlamaForCausalLM"),
            std::string::npos)
      << e;
  edit_config(dir, [](nlohmann::json& j) {
    j["architectures"] = {"Qwen2ForCausalLM"};
    j["tie_word_embeddings"] = false;  // then lm_head.weight must exist
  });
  e = error_of(dir, tmp);
  EXPECT_NE(e.find("tensor 'lm_head.weight' is missing"), std::string::npos) << e;
}

TEST(HfConvertErrors, GaleCheckpointWithoutAnHfCounterpart) {
  TempDir tmp;
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("gpt2"), tmp.file("gale")), quiet).ok());
  Status s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("hf"), "fp16"),
                                quiet);
  EXPECT_NE(s.message().find("--save-dtype: expected fp32 or bf16, found 'fp16'"), std::string::npos) << s.message();
  s = convert_gale_to_hf(to_hf(tmp.file("nothing"), tmp.file("hf")), quiet);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.message();
  // LayerNorm with RoPE: neither GPT-2 nor LLaMA.
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  ModelArgs m = model_args_from_json(r->section("args").value(), "x").value();
  m.position_embedding_type = "rope";
  auto hf = hf_model_from_args(m, MoeArgs{}, 100, "ckpt/metadata.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("ckpt/metadata.json: no Hugging Face architecture Gale writes matches"),
            std::string::npos)
      << hf.status().message();
  EXPECT_FALSE(
      hf_model_from_args(model_args_from_json(r->section("args").value(), "x").value(), MoeArgs{}, 129, "x").ok());
  m = model_args_from_json(r->section("args").value(), "x").value();
  m.noop_layers = {1};
  m.noop_layers_flag = "1";
  hf = hf_model_from_args(m, MoeArgs{}, 100, "ckpt/metadata.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("ckpt/metadata.json: the model has --noop-layers 1 (identity layers)"),
            std::string::npos)
      << hf.status().message();
  // The recorded noop layers come back.
  nlohmann::json args = model_flags_json(m);
  EXPECT_EQ(model_args_from_json(args, "x").value().noop_layers, std::vector<int64_t>{1});
  // --squared-relu and --apply-layernorm-1p have no Hugging Face form Gale writes; both come back
  // from the recorded flags.
  for (const char* flag : {"--squared-relu", "--apply-layernorm-1p"}) {
    m = model_args_from_json(r->section("args").value(), "x").value();
    (std::string(flag) == "--squared-relu" ? m.squared_relu : m.apply_layernorm_1p) = true;
    hf = hf_model_from_args(m, MoeArgs{}, 100, "ckpt/metadata.json");
    ASSERT_FALSE(hf.ok());
    EXPECT_EQ(hf.status().message(), std::string("ckpt/metadata.json: the model has ") + flag +
                                         ", which no Hugging Face architecture Gale writes can hold");
    const ModelArgs back = model_args_from_json(model_flags_json(m), "x").value();
    EXPECT_EQ(back.squared_relu, m.squared_relu);
    EXPECT_EQ(back.apply_layernorm_1p, m.apply_layernorm_1p);
  }
}

// GPT-2 files saved from GPT2Model have no "transformer." prefix and may carry the causal-mask
// buffers; real GPT-2 configs say gelu_new, which converts with a warning (Gale's GeLU is exact).
TEST(HfConvert, Gpt2WithoutPrefixAndWithGeluNew) {
  TempDir tmp;
  std::string dir = copy_fixture(tmp, "gpt2");
  {
    SafetensorsFile f = SafetensorsFile::open(dir + "/model.safetensors").value();
    SafetensorsWriter w;
    std::vector<Tensor> keep;
    for (const SafetensorsEntry& e : f.entries()) {
      keep.push_back(f.read(e.name).value());
      ASSERT_TRUE(w.add(e.name.substr(std::string("transformer.").size()), keep.back()).ok());
    }
    keep.push_back(Tensor::zeros({1, 1, 32, 32}));
    ASSERT_TRUE(w.add("h.0.attn.bias", keep.back()).ok());
    ASSERT_TRUE(w.write(dir + "/model.safetensors").ok());
  }
  edit_config(dir, [](nlohmann::json& j) { j["activation_function"] = "gelu_new"; });
  std::vector<std::string> lines;
  Status s = convert_hf_to_gale(to_gale(dir, tmp.file("gale")), [&](const std::string& l) { lines.push_back(l); });
  ASSERT_TRUE(s.ok()) << s.message();
  for (const std::string& l : lines) EXPECT_EQ(l.find("warning: "), std::string::npos) << l;
  // gelu_new is --openai-gelu: the converted model reproduces transformers' gelu_new logits of the
  // same weights, which differ from the exact-GeLU ones by far more than the tolerance.
  {
    auto lm = load_model(tmp.file("gale"));
    EXPECT_TRUE(lm->config.openai_gelu);
    Golden g = read_golden("gpt2");
    const Tensor logits = logits_of(*lm->model, g.tokens);
    EXPECT_GT(compare(logits, g).max_diff, 5 * kLogitTolerance);
    g.logits = SafetensorsFile::open(fixture("gpt2") + "/golden.safetensors").value().read("logits_gelu_new", DType::kF32).value();
    EXPECT_LT(compare(logits, g).max_diff, kLogitTolerance);
  }
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("back")), quiet).ok());
  std::ifstream config(tmp.file("back") + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(config)["activation_function"], "gelu_new");
  ASSERT_TRUE(convert_hf_to_gale(to_gale(fixture("gpt2"), tmp.file("ref")), quiet).ok());
  auto a = CheckpointReader::open(tmp.file("gale")), b = CheckpointReader::open(tmp.file("ref"));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->tensor_names(), b->tensor_names());
  for (const std::string& name : a->tensor_names()) {
    const Shape shape = b->global_shape(name).value();
    Tensor x = a->read(name, shape).value(), y = b->read(name, shape).value();
    EXPECT_EQ(0, std::memcmp(x.raw(), y.raw(), x.nbytes())) << name;
  }
}

}  // namespace
}  // namespace gale
