// DeepSeek-V3 multi-token-prediction layers through `gale convert` (train/hf_weights.h, hf_convert.h).
//
// transformers' DeepseekV3 ignores the MTP layers, so there is no golden model to compare with.
// Instead: an HF directory made here from the DeepSeek-V3 fixture with known MTP tensors
// (model.layers.{L+k}.*) converts into the right Gale parameters, checked value by value by name;
// HF -> Gale -> HF returns every tensor bit for bit; a Gale model with MTP layers exported and
// imported again computes the same MTP losses; --mtp-num-layers leaves MTP layers out; copies of
// the embedding or lm_head that differ from the main ones, and MTP models that no HF architecture
// Gale writes can hold, are one-line errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "ckpt/model_checkpoint.h"
#include "ckpt/safetensors.h"
#include "ckpt/temp_dir.h"
#include "comm/communicator.h"
#include "kernels/op_table.h"
#include "model/gpt_model.h"
#include "model/model_test_batches.h"
#include "train/checkpoint_args.h"
#include "train/hf_config.h"
#include "train/hf_convert.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using testing_util::TempDir;
namespace fs = std::filesystem;

constexpr int64_t kL = 3, kH = 32, kV = 100;  // the deepseek_v3 fixture: 3 layers (1 dense), hidden 32, 100 tokens

std::string fixture() { return std::string(GALE_TEST_DATA_DIR) + "/hf/deepseek_v3"; }
void quiet(const std::string&) {}

std::map<std::string, Tensor> tensors_of(const std::string& file) {
  auto f = SafetensorsFile::open(file);
  EXPECT_TRUE(f.ok()) << f.status().message();
  std::map<std::string, Tensor> out;
  for (const SafetensorsEntry& e : f->entries()) out[e.name] = f->read(e.name, DType::kF32).value();
  return out;
}

float value_at(const Tensor& t, int64_t i) { return t.data<float>()[i]; }

// The DeepSeek-V3 fixture with `D` MTP layers added as DeepSeek's files hold them. MTP layer k's
// decoder layer is layer 2's (a MoE layer) scaled by 1.25 + 0.25·k; its norms and eh_proj hold
// patterns of their own (eh_proj's embedding and hidden halves differ); embed_tokens and
// shared_head.head copy the main embedding and lm_head. `edit` may change the tensors before they
// are written.
std::string mtp_fixture(const TempDir& tmp, const std::string& name, int64_t D,
                        const std::function<void(std::map<std::string, Tensor>&)>& edit = nullptr) {
  const std::string dir = tmp.file(name);
  fs::create_directories(dir);
  fs::copy_file(fixture() + "/config.json", dir + "/config.json");
  nlohmann::json config;
  {
    std::ifstream in(dir + "/config.json");
    config = nlohmann::json::parse(in);
  }
  config["num_nextn_predict_layers"] = D;
  std::ofstream(dir + "/config.json") << config.dump(2);
  std::map<std::string, Tensor> t = tensors_of(fixture() + "/model.safetensors");
  const std::string layer2 = "model.layers.2.";
  std::vector<std::pair<std::string, Tensor>> added;
  for (int64_t k = 0; k < D; ++k) {
    const std::string p = "model.layers." + std::to_string(kL + k) + ".";
    const float scale = 1.25f + 0.25f * static_cast<float>(k);
    for (const auto& [n, src] : t)
      if (n.rfind(layer2, 0) == 0) {
        Tensor c = src.clone();
        for (int64_t i = 0; i < c.numel(); ++i) c.data<float>()[i] *= scale;
        added.push_back({p + n.substr(layer2.size()), c});
      }
    auto pattern = [&](const Shape& shape, float base, float step) {
      Tensor x = Tensor::empty(shape);
      for (int64_t i = 0; i < x.numel(); ++i)
        x.data<float>()[i] = base + step * static_cast<float>(std::sin(0.37 * static_cast<double>(i) + k));
      return x;
    };
    added.push_back({p + "enorm.weight", pattern({kH}, 1.0f, 0.1f)});
    added.push_back({p + "hnorm.weight", pattern({kH}, 0.5f, 0.2f)});
    added.push_back({p + "shared_head.norm.weight", pattern({kH}, 2.0f, 0.3f)});
    added.push_back({p + "eh_proj.weight", pattern({kH, 2 * kH}, 0.0f, 0.05f)});
    added.push_back({p + "embed_tokens.weight", t.at("model.embed_tokens.weight").clone()});
    added.push_back({p + "shared_head.head.weight", t.at("lm_head.weight").clone()});
  }
  for (auto& [n, x] : added) t[n] = x;
  if (edit) edit(t);
  SafetensorsWriter w;
  for (const auto& [n, x] : t) EXPECT_TRUE(w.add(n, x).ok()) << n;
  w.set_metadata("format", "pt");
  EXPECT_TRUE(w.write(dir + "/model.safetensors").ok());
  return dir;
}

HfToGaleOptions to_gale(const std::string& load, const std::string& save, int64_t mtp = kUnset) {
  HfToGaleOptions o;
  o.load_dir = load;
  o.save_dir = save;
  o.mtp_num_layers = mtp;
  return o;
}

GaleToHfOptions to_hf(const std::string& load, const std::string& save, int64_t mtp = kUnset) {
  GaleToHfOptions o;
  o.load_dir = load;
  o.save_dir = save;
  o.mtp_num_layers = mtp;
  return o;
}

// Reads Gale tensor `name` of a checkpoint (whole, f32).
Tensor gale_tensor(const CheckpointReader& r, const std::string& name) {
  auto shape = r.global_shape(name);
  if (!shape.ok()) {
    ADD_FAILURE() << "no tensor " << name;
    return Tensor();
  }
  return r.read(name, shape.value()).value();
}

void expect_same(const Tensor& gale, const Tensor& hf, const std::string& what, int64_t first_row = 0) {
  ASSERT_TRUE(gale.defined()) << what;
  const int64_t cols = hf.ndim() == 1 ? 1 : hf.size(1);
  ASSERT_GE(gale.numel(), (first_row * cols) + hf.numel()) << what;
  for (int64_t i = 0; i < hf.numel(); ++i)
    ASSERT_EQ(value_at(gale, first_row * cols + i), value_at(hf, i)) << what << " element " << i;
}

// (c) Each MTP tensor lands in its Gale parameter: checked by value, name by name.
TEST(HfConvertMtp, ImportPutsEachMtpTensorInItsGaleParameter) {
  TempDir tmp;
  const std::string hf = mtp_fixture(tmp, "hf", 1);
  Status s = convert_hf_to_gale(to_gale(hf, tmp.file("gale")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  const nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["mtp_num_layers"], 1);
  EXPECT_EQ(args["mtp_loss_scaling_factor"], 0.1);  // Megatron's default
  const std::map<std::string, Tensor> t = tensors_of(hf + "/model.safetensors");
  const std::string m = "mtp.layers.0.", l = "mtp.layers.0.transformer_layer.", h = "model.layers.3.";
  for (const auto& [gale, name] : std::vector<std::pair<std::string, std::string>>{
           {m + "enorm.weight", h + "enorm.weight"},
           {m + "hnorm.weight", h + "hnorm.weight"},
           {m + "final_layernorm.weight", h + "shared_head.norm.weight"},
           {m + "eh_proj.weight", h + "eh_proj.weight"},  // [H, 2H]: both halves in place
           {l + "input_layernorm.weight", h + "input_layernorm.weight"},
           {l + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight"},
           {l + "self_attention.linear_q_down_proj.weight", h + "self_attn.q_a_proj.weight"},
           {l + "self_attention.linear_kv_up_proj.layer_norm_weight", h + "self_attn.kv_a_layernorm.weight"},
           {l + "self_attention.linear_proj.weight", h + "self_attn.o_proj.weight"},
           {l + "mlp.router.weight", h + "mlp.gate.weight"},
           {l + "mlp.router.expert_bias", h + "mlp.gate.e_score_correction_bias"},
           {l + "mlp.experts.local_experts.5.linear_fc2.weight", h + "mlp.experts.5.down_proj.weight"},
           {l + "mlp.shared_experts.linear_fc2.weight", h + "mlp.shared_experts.down_proj.weight"}})
    expect_same(gale_tensor(r.value(), gale), t.at(name), gale);
  // fc1 = [gate; up]: the up rows after the gate rows (16 each).
  const Tensor fc1 = gale_tensor(r.value(), l + "mlp.experts.local_experts.5.linear_fc1.weight");
  expect_same(fc1, t.at(h + "mlp.experts.5.gate_proj.weight"), "expert 5 gate");
  expect_same(fc1, t.at(h + "mlp.experts.5.up_proj.weight"), "expert 5 up", 16);
  // The copies of the embedding and lm_head are not stored again; the main decoder is unchanged.
  for (const std::string& n : r->tensor_names()) {
    EXPECT_EQ(n.find("embed_tokens"), std::string::npos) << n;
    EXPECT_EQ(n.find("shared_head"), std::string::npos) << n;
  }
  expect_same(gale_tensor(r.value(), "decoder.layers.2.mlp.router.weight"), t.at("model.layers.2.mlp.gate.weight"),
              "layer 2 router");
  // The checkpoint builds and loads a model with one MTP layer.
  ModelArgs ma = model_args_from_json(args, "x").value();
  Arguments a;
  a.model = ma;
  a.moe = moe_args_from_json(args, "x", ma.num_layers).value();
  const ModelConfig c = model_config_from_args(a);
  EXPECT_EQ(c.mtp_num_layers, 1);
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  Status load = load_parameters(r.value(), model.params());
  EXPECT_TRUE(load.ok()) << load.message();
}

// (a) HF -> Gale -> HF returns every tensor bit for bit, the duplicated embedding and lm_head
// included, and config.json keeps num_nextn_predict_layers.
TEST(HfConvertMtp, RoundTripReturnsEveryTensorBitForBit) {
  TempDir tmp;
  const std::string hf = mtp_fixture(tmp, "hf", 2);
  Status s = convert_hf_to_gale(to_gale(hf, tmp.file("gale")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("back")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  const auto before = tensors_of(hf + "/model.safetensors"), after = tensors_of(tmp.file("back/model.safetensors"));
  EXPECT_EQ(after.size(), before.size());
  for (const auto& [name, a] : before) {
    ASSERT_TRUE(after.count(name)) << name;
    const Tensor& b = after.at(name);
    ASSERT_EQ(a.shape(), b.shape()) << name;
    EXPECT_EQ(0, std::memcmp(a.data<float>(), b.data<float>(), a.nbytes())) << name;
  }
  std::ifstream in(tmp.file("back/config.json"));
  EXPECT_EQ(nlohmann::json::parse(in)["num_nextn_predict_layers"], 2);
}

// --mtp-num-layers N converts the first N MTP layers (0: none) and leaves the others' tensors
// behind without an error, in both directions; more than the files hold is an error.
TEST(HfConvertMtp, MtpNumLayersLeavesLayersOut) {
  TempDir tmp;
  const std::string hf = mtp_fixture(tmp, "hf", 2);
  for (int64_t n : {0, 1}) {
    const std::string out = tmp.file("gale" + std::to_string(n));
    Status s = convert_hf_to_gale(to_gale(hf, out, n), quiet);
    ASSERT_TRUE(s.ok()) << s.message();
    auto r = CheckpointReader::open(out);
    const nlohmann::json args = r->section("args").value();
    EXPECT_EQ(args.contains("mtp_num_layers"), n > 0);
    int mtp0 = 0, mtp1 = 0;
    for (const std::string& name : r->tensor_names()) {
      mtp0 += name.rfind("mtp.layers.0.", 0) == 0;
      mtp1 += name.rfind("mtp.layers.1.", 0) == 0;
    }
    EXPECT_EQ(mtp0 > 0, n > 0);
    EXPECT_EQ(mtp1, 0);
  }
  Status s = convert_hf_to_gale(to_gale(hf, tmp.file("bad"), 3), quiet);
  EXPECT_EQ(s.message(), "--mtp-num-layers 3: expected 0 to the 2 multi-token-prediction layers of " + hf +
                             "/config.json (num_nextn_predict_layers)");
  // Export: all (2) by default, or fewer.
  ASSERT_TRUE(convert_hf_to_gale(to_gale(hf, tmp.file("gale")), quiet).ok());
  ASSERT_TRUE(convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("one"), 1), quiet).ok());
  const auto one = tensors_of(tmp.file("one/model.safetensors"));
  EXPECT_TRUE(one.count("model.layers.3.eh_proj.weight"));
  EXPECT_FALSE(one.count("model.layers.4.eh_proj.weight"));
  std::ifstream in(tmp.file("one/config.json"));
  EXPECT_EQ(nlohmann::json::parse(in)["num_nextn_predict_layers"], 1);
  s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("three"), 3), quiet);
  EXPECT_NE(s.message().find("--mtp-num-layers 3: expected 0 to the 2 multi-token-prediction layers of "),
            std::string::npos)
      << s.message();
}

// A copy of the embedding or lm_head in an MTP layer that differs from the main one is an error
// naming the file and both tensors; left out with --mtp-num-layers 0, it is not read.
TEST(HfConvertMtp, CopiesThatDifferFromTheMainTensorsAreOneLineErrors) {
  TempDir tmp;
  for (const std::string copy : {"embed_tokens.weight", "shared_head.head.weight"}) {
    const std::string name = "model.layers.4." + copy;
    const std::string hf = mtp_fixture(tmp, "hf_" + copy, 2, [&](std::map<std::string, Tensor>& t) {
      t.at(name).data<float>()[7] += 1.0f;
    });
    Status s = convert_hf_to_gale(to_gale(hf, tmp.file("out")), quiet);
    EXPECT_EQ(s.message(), hf + "/model.safetensors: tensor '" + name + "' differs from '" +
                               (copy == "embed_tokens.weight" ? "model.embed_tokens.weight" : "lm_head.weight") +
                               "' (Gale's multi-token-prediction layers share the main embedding and output layer; "
                               "convert with --mtp-num-layers 0 to leave them out)");
    EXPECT_FALSE(fs::exists(tmp.file("out/latest_checkpointed_iteration.txt")));
    s = convert_hf_to_gale(to_gale(hf, tmp.file("out"), 1), quiet);  // layer 4 left out
    EXPECT_TRUE(s.ok()) << s.message();
    fs::remove_all(tmp.file("out"));
  }
}

// A Gale checkpoint of a DeepSeek-V3-shaped model with random weights, 1 MTP layer and all 128
// vocabulary rows real (so the export drops no row).
std::string save_gale_mtp_model(const TempDir& tmp, ModelConfig* config) {
  std::ifstream in(fixture() + "/config.json");
  auto hf = hf_model_from_config(nlohmann::json::parse(in), "config.json", 128, 1);
  EXPECT_TRUE(hf.ok()) << hf.status().message();
  Arguments a;
  a.model = hf->model;
  a.moe = hf->moe;
  a.model.mtp_num_layers = 1;
  a.model.mtp_loss_scaling_factor = 0.3;
  *config = model_config_from_args(a);
  const OpTable ops = reference_ops();
  GPTModel model(*config, single_process_partition(*config), &ops);
  model.params().initialize(11);
  for (const ParamSpec& s : model.params().specs())  // a nonzero correction bias, as trained
    if (s.name.find("expert_bias") != std::string::npos)
      for (int64_t i = 0; i < s.local_numel(); ++i)
        model.params().param_data(model.params().find(s.name))[i] = 0.01f * static_cast<float>(i % 5);
  Comm self = make_self_communicator("world");
  CheckpointWriter w(tmp.file("trained"), 5, *self);
  EXPECT_TRUE(add_parameters(w, model.params()).ok());
  nlohmann::json sections;
  sections["gale_trainer_state_version"] = 1;
  sections["model"] = checkpoint_model_section(*config);
  sections["args"] = model_flags_json(a.model);
  add_moe_flags_json(a.moe, &sections["args"]);
  sections["args"]["vocab_size"] = config->vocab;
  sections["trainer"] = {{"iteration", 5}};
  EXPECT_TRUE(w.commit(sections).ok());
  return tmp.file("trained");
}

// One training forward of `ckpt`'s model (built from its args) on a fixed batch: the LM loss sum
// and the MTP losses.
std::pair<double, std::vector<double>> training_losses(const std::string& ckpt) {
  auto r = CheckpointReader::open(ckpt);
  EXPECT_TRUE(r.ok()) << r.status().message();
  const nlohmann::json args = r->section("args").value();
  Arguments a;
  a.model = model_args_from_json(args, ckpt).value();
  a.moe = moe_args_from_json(args, ckpt, a.model.num_layers).value();
  ModelConfig c = model_config_from_args(a);
  EXPECT_EQ(c.mtp_num_layers, 1);
  c.seq_length = 12;  // not the 16384 positions
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  Status s = load_parameters(r.value(), model.params());
  EXPECT_TRUE(s.ok()) << s.message();
  const MicroBatch mb = testing::masked_batch(c, 2, 3, /*documents=*/false);
  GPTModel::LossSums sums;
  model.set_num_microbatches(1);
  model.forward(0, mb, Tensor(), /*training=*/true, &sums);
  return {sums.loss_sum, model.take_mtp_losses()};
}

// (b) A Gale model with an MTP layer, exported to HF and imported again, computes the same LM and
// MTP losses as before (same parameters bit for bit, same flags).
TEST(HfConvertMtp, ExportedAndImportedModelComputesTheSameMtpLoss) {
  TempDir tmp;
  ModelConfig c;
  const std::string trained = save_gale_mtp_model(tmp, &c);
  Status s = convert_gale_to_hf(to_hf(trained, tmp.file("hf")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  const auto hf = tensors_of(tmp.file("hf/model.safetensors"));
  EXPECT_TRUE(hf.count("model.layers.3.eh_proj.weight"));
  EXPECT_EQ(0, std::memcmp(hf.at("model.layers.3.embed_tokens.weight").data<float>(),
                           hf.at("model.embed_tokens.weight").data<float>(), hf.at("model.embed_tokens.weight").nbytes()));
  EXPECT_EQ(0, std::memcmp(hf.at("model.layers.3.shared_head.head.weight").data<float>(),
                           hf.at("lm_head.weight").data<float>(), hf.at("lm_head.weight").nbytes()));
  s = convert_hf_to_gale(to_gale(tmp.file("hf"), tmp.file("imported")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  const auto [lm_a, mtp_a] = training_losses(trained);
  const auto [lm_b, mtp_b] = training_losses(tmp.file("imported"));
  ASSERT_EQ(mtp_a.size(), 1u);
  EXPECT_GT(mtp_a[0], 1.0);
  EXPECT_EQ(mtp_a, mtp_b);
  EXPECT_EQ(lm_a, lm_b);
}

// MTP layers are written only as DeepSeek-V3's: another model with --mtp-num-layers is refused on
// the way out, naming the flag that leaves them out.
TEST(HfConvertMtp, MtpModelsNoHfArchitectureHoldsAreRefused) {
  ModelArgs m;
  m.num_layers = 2;
  m.hidden_size = 32;
  m.ffn_hidden_size = 64;
  m.num_attention_heads = 4;
  m.num_kv_heads = 4;
  m.kv_channels = 8;
  m.normalization = "RMSNorm";
  m.swiglu = true;
  m.position_embedding_type = "rope";
  m.add_bias_linear = false;
  m.padded_vocab_size = 128;
  m.max_position_embeddings = 64;
  ASSERT_TRUE(hf_model_from_args(m, MoeArgs{}, 100, "ckpt").ok());
  m.mtp_num_layers = 1;
  auto r = hf_model_from_args(m, MoeArgs{}, 100, "ckpt");
  EXPECT_EQ(r.status().message(),
            "ckpt: the model has --mtp-num-layers 1 (multi-token prediction), which Gale writes only as "
            "DeepseekV3ForCausalLM's num_nextn_predict_layers (pass --mtp-num-layers 0 to leave the MTP layers out)");
}

}  // namespace
}  // namespace gale
