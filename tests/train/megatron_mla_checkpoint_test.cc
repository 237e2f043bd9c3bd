// Megatron-Core multi-latent-attention checkpoints (torch at TP 1 and 2, torch_dist) against Megatron's recorded logits.
//
// tests/data/megatron/mla_{qlora,noq}/ (tools/reference/megatron_mla_reference.py) hold a tiny MLA GPT
// model built with Megatron core_v0.12.1's GPTModel and MLA local spec: `qlora` with a query latent,
// --qk-layernorm (q_layernorm / kv_layernorm), RMSNorm and YaRN (factor 4, mscale_all_dim 0.8); `noq`
// with a direct linear_q_proj, no latent norms, LayerNorm and plain RoPE. Each is saved at TP 1 (tp1/),
// by a 2-process TP 2 model (tp2/, whose logits Megatron checked against TP 1's) and by that model's
// dist_checkpointing.save (torch_dist/). Reading any of them into Gale's model must reproduce
// Megatron's logits and per-token losses (mla_reference.json) within 1e-4; the three give identical
// tensors; Gale -> Megatron at TP 2 writes, rank for rank, the tp2/ state dicts.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/temp_dir.h"
#include "ckpt/torch_file.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_fixture.h"

namespace gale {
namespace {

using testing_util::TempDir;
using namespace megatron_fixture;
namespace fs = std::filesystem;

Reference read_mla_reference(const std::string& variant) {
  std::ifstream in(fixture("mla_reference.json"));
  const nlohmann::json j = nlohmann::json::parse(in).at(variant);
  Reference r;
  r.tokens = j["tokens"].get<std::vector<int32_t>>();
  r.labels = j["labels"].get<std::vector<int32_t>>();
  r.logits = j["logits"].get<std::vector<std::vector<double>>>();
  r.losses = j["losses"].get<std::vector<double>>();
  return r;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

class MlaCheckpoint : public ::testing::TestWithParam<const char*> {
 protected:
  std::string dir(const std::string& layout) const { return fixture(str_cat("mla_", GetParam(), "/", layout)); }
  bool q_latent() const { return std::string(GetParam()) == "qlora"; }
};

TEST_P(MlaCheckpoint, Tp1ReproducesMegatronsLogits) {
  auto m = read_megatron_checkpoint(dir("tp1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_TRUE(m->model.multi_latent_attention);
  EXPECT_EQ(m->model.q_lora_rank, q_latent() ? 16 : kUnset);
  EXPECT_EQ(m->model.kv_lora_rank, 12);
  EXPECT_EQ(m->model.qk_head_dim, 8);
  EXPECT_EQ(m->model.qk_pos_emb_head_dim, 4);
  EXPECT_EQ(m->model.v_head_dim, 6);
  EXPECT_EQ(m->model.qk_layernorm, q_latent());
  EXPECT_EQ(m->model.rotary_scaling_factor, q_latent() ? 4.0 : 1.0);
  const std::string attn = "decoder.layers.1.self_attention.";
  // Gale's names: the local spec's q_layernorm / kv_layernorm are the up projections' fused norms.
  EXPECT_EQ(m->tensors.count(attn + "linear_q_up_proj.layer_norm_weight"), q_latent() ? 1u : 0u);
  EXPECT_EQ(m->tensors.count(attn + "linear_kv_up_proj.layer_norm_weight"), q_latent() ? 1u : 0u);
  EXPECT_EQ(m->tensors.count(attn + "q_layernorm.weight") + m->tensors.count(attn + "kv_layernorm.weight"), 0u);
  EXPECT_EQ(m->tensors.at(attn + "linear_kv_down_proj.weight").shape(), (Shape{16, 32}));
  EXPECT_EQ(m->tensors.size(), q_latent() ? 25u : 24u);
  auto lm = build_model(m.value());
  const Comparison c = compare(*lm->model, read_mla_reference(GetParam()));
  EXPECT_LT(c.max_logit_diff, kLogitTolerance);
  EXPECT_LT(c.max_loss_diff, kLogitTolerance);
}

// Megatron's TP 2 files and its torch_dist save of them merge into the TP 1 tensors, bit for bit.
TEST_P(MlaCheckpoint, Tp2AndTorchDistMergeIntoTheTp1Tensors) {
  auto a = read_megatron_checkpoint(dir("tp1"));
  ASSERT_TRUE(a.ok()) << a.status().message();
  for (const char* layout : {"tp2", "torch_dist"}) {
    auto b = read_megatron_checkpoint(dir(layout));
    ASSERT_TRUE(b.ok()) << layout << ": " << b.status().message();
    EXPECT_EQ(b->tensor_parallel, 2) << layout;
    ASSERT_EQ(a->tensors.size(), b->tensors.size()) << layout;
    for (const auto& [name, t] : a->tensors) {
      ASSERT_TRUE(b->tensors.count(name)) << layout << " " << name;
      EXPECT_TRUE(same_tensor(t, b->tensors.at(name))) << layout << " " << name;
    }
  }
}

// Gale -> Megatron at TP 2 writes the fixture's rank files (same keys, `_extra_state` None entries
// included, same bytes; Megatron's MLA flags in args), and they read back.
TEST_P(MlaCheckpoint, WritesMegatronsTp2Files) {
  TempDir tmp;
  auto m = read_megatron_checkpoint(dir("tp1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  MegatronSaveOptions o;
  o.save_dir = tmp.file("mg");
  o.tensor_parallel = 2;
  Status s = write_fixture_as_megatron(*m, o);
  ASSERT_TRUE(s.ok()) << s.message();
  for (const char* rank : {"mp_rank_00", "mp_rank_01"})
    expect_same_rank_file(tmp.file(str_cat("mg/iter_0000007/", rank, "/model_optim_rng.pt")),
                          dir(str_cat("tp2/iter_0000007/", rank, "/model_optim_rng.pt")),
                          [](const PyValue& args, const PyValue& want) {
                            EXPECT_TRUE(args.attr("multi_latent_attention")->b);
                            for (const char* key : {"kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"})
                              EXPECT_EQ(args.attr(key)->i, want.attr(key)->i) << key;
                            EXPECT_EQ(args.attr("q_lora_rank")->kind, want.attr("q_lora_rank")->kind);
                            EXPECT_EQ(args.attr("qk_layernorm")->b, want.attr("qk_layernorm")->b);
                            for (const char* key : {"rotary_scaling_factor", "mscale", "mscale_all_dim"})
                              EXPECT_EQ(args.attr(key)->f, want.attr(key)->f) << key;
                          });
  auto back = read_megatron_checkpoint(tmp.file("mg"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->model.rope_type, q_latent() ? "yarn" : "rope");
  ASSERT_EQ(back->tensors.size(), m->tensors.size());
  for (const auto& [name, t] : m->tensors) EXPECT_TRUE(same_tensor(t, back->tensors.at(name))) << name;
}

INSTANTIATE_TEST_SUITE_P(Variants, MlaCheckpoint, ::testing::Values("qlora", "noq"));

// Rewrites mla_qlora/tp2 into `out` with `edit` applied to each rank's state dict (rank t) and args.
void rewrite_tp2(const std::string& out, const std::function<void(int64_t, PyValue&, PyValue&)>& edit) {
  for (int64_t t = 0; t < 2; ++t) {
    const std::string rank = str_cat("iter_0000007/mp_rank_0", t, "/model_optim_rng.pt");
    auto root = read_torch_file(fixture("mla_qlora/tp2/" + rank));
    ASSERT_TRUE(root.ok());
    edit(t, *const_cast<PyValue*>((*root)->get("model")), *const_cast<PyValue*>((*root)->get("args"))->state);
    fs::create_directories(fs::path(out + "/" + rank).parent_path());
    ASSERT_TRUE(write_torch_file(out + "/" + rank, **root).ok());
  }
  write_text(out + "/latest_checkpointed_iteration.txt", "7");
}

// Newer Transformer Engine specs keep the down projections whole on every rank ('duplicated') and
// fuse the latent norms into the up projections: the same model.
TEST(MegatronMlaCheckpoint, DuplicatedDownProjectionsAndFusedNormNames) {
  TempDir tmp;
  auto tp1 = read_torch_file(fixture("mla_qlora/tp1/iter_0000007/mp_rank_00/model_optim_rng.pt"));
  ASSERT_TRUE(tp1.ok());
  const PyValue* whole = (*tp1)->get("model");
  rewrite_tp2(tmp.file("te"), [&](int64_t, PyValue& sd, PyValue&) {
    for (int l = 0; l < 2; ++l) {
      const std::string a = str_cat("decoder.layers.", l, ".self_attention.");
      for (const char* down : {"linear_q_down_proj.weight", "linear_kv_down_proj.weight"})
        sd.set(a + down, PyValue::tensor(whole->get(a + down)->data));
      for (const auto& [local, fused] : {std::pair{"q_layernorm.weight", "linear_q_up_proj.layer_norm_weight"},
                                         std::pair{"kv_layernorm.weight", "linear_kv_up_proj.layer_norm_weight"}}) {
        PyValue renamed;
        renamed.kind = PyValue::kDict;
        for (const auto& [k, v] : sd.entries) renamed.set(k->s == a + local ? a + fused : k->s, v);
        sd.entries = renamed.entries;
      }
    }
  });
  auto a = read_megatron_checkpoint(fixture("mla_qlora/tp1"));
  auto b = read_megatron_checkpoint(tmp.file("te"));
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (const auto& [name, t] : a->tensors) EXPECT_TRUE(same_tensor(t, b->tensors.at(name))) << name;
  // Copies that differ are neither a split nor a duplicated tensor.
  rewrite_tp2(tmp.file("bad"), [&](int64_t t, PyValue& sd, PyValue&) {
    const std::string k = "decoder.layers.0.self_attention.linear_q_down_proj.weight";
    Tensor w = whole->get(k)->data.clone();
    if (t == 1) w.data<float>()[0] += 1.0f;
    sd.set(k, PyValue::tensor(w));
  });
  auto bad = read_megatron_checkpoint(tmp.file("bad"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tensor 'decoder.layers.0.self_attention.linear_q_down_proj.weight' of shape "
                                        "[32, 32]: expected 16 rows, or the same 16 rows on every tensor-parallel "
                                        "rank (a duplicated down projection); rank 1's differ from rank 0's"),
            std::string::npos)
      << bad.status().message();
}

// Megatron's --mla-down-proj-fusion model (FusedMLASelfAttention with Transformer Engine's
// LayerNormColumnParallelLinear) saves, per TP rank, linear_qkv_down_proj.weight = [its q_down
// rows; its kv_down rows] and the folded input norm as linear_qkv_down_proj.layer_norm_weight (no
// input_layernorm). Read, it is the unfused model: every tensor equal to the TP 1 checkpoint's.
TEST(MegatronMlaCheckpoint, FusedDownProjectionSplitsIntoTheUnfusedTensors) {
  TempDir tmp;
  rewrite_tp2(tmp.file("fused"), [](int64_t, PyValue& sd, PyValue&) {
    for (int l = 0; l < 2; ++l) {
      const std::string p = str_cat("decoder.layers.", l, ".");
      const std::string a = p + "self_attention.";
      const Tensor q = sd.get(a + "linear_q_down_proj.weight")->data, kv = sd.get(a + "linear_kv_down_proj.weight")->data;
      ASSERT_EQ(q.shape(), (Shape{8, 32}));  // this rank's half of q_lora_rank 16
      ASSERT_EQ(kv.shape(), (Shape{8, 32}));  // and of kv_lora_rank 12 + qk_pos_emb_head_dim 4
      Tensor fused = Tensor::empty({16, 32}, q.dtype());
      std::memcpy(fused.raw(), q.raw(), static_cast<size_t>(q.nbytes()));
      std::memcpy(static_cast<char*>(fused.raw()) + q.nbytes(), kv.raw(), static_cast<size_t>(kv.nbytes()));
      const PyRef norm = std::make_shared<PyValue>(*sd.get(p + "input_layernorm.weight"));
      PyValue kept;
      kept.kind = PyValue::kDict;
      for (const auto& [k, v] : sd.entries)
        if (k->s != a + "linear_q_down_proj.weight" && k->s != a + "linear_kv_down_proj.weight" &&
            k->s != p + "input_layernorm.weight" && k->s.find(a + "linear_q_down_proj._extra") != 0 &&
            k->s.find(a + "linear_kv_down_proj._extra") != 0)
          kept.set(k->s, v);
      sd.entries = kept.entries;
      sd.set(a + "linear_qkv_down_proj.weight", PyValue::tensor(fused));
      sd.set(a + "linear_qkv_down_proj.layer_norm_weight", norm);
    }
  });
  auto a = read_megatron_checkpoint(fixture("mla_qlora/tp1"));
  auto b = read_megatron_checkpoint(tmp.file("fused"));
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (const auto& [name, t] : a->tensors) {
    ASSERT_TRUE(b->tensors.count(name)) << name;
    EXPECT_TRUE(same_tensor(t, b->tensors.at(name))) << name;
  }
}

TEST(MegatronMlaCheckpoint, Refusals) {
  TempDir tmp;
  // Megatron's fused down projection (--mla-down-proj-fusion) beside the unfused ones: neither layout.
  rewrite_tp2(tmp.file("fused"), [](int64_t, PyValue& sd, PyValue&) {
    sd.set("decoder.layers.0.self_attention.linear_qkv_down_proj.weight", PyValue::tensor(Tensor::zeros({16, 32})));
  });
  auto m = read_megatron_checkpoint(tmp.file("fused"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor 'decoder.layers.0.self_attention.linear_qkv_down_proj.weight' (the fused "
                                      "q/kv down projection) next to 'decoder.layers.0.self_attention.linear_q_down_"
                                      "proj.weight': expected one of the fused or the unfused layout"),
            std::string::npos)
      << m.status().message();
  // qk_layernorm without a query latent: Gale's model norms linear_q_proj's input, Megatron's does not.
  rewrite_tp2(tmp.file("noq_norm"), [](int64_t, PyValue&, PyValue& args) { args.set("q_lora_rank", PyValue::none()); });
  m = read_megatron_checkpoint(tmp.file("noq_norm"));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("a multi-latent-attention model with qk_layernorm and no query latent "
                                      "(q_lora_rank None): not supported yet"),
            std::string::npos)
      << m.status().message();
  // A down projection of neither the whole nor a TP share's size.
  rewrite_tp2(tmp.file("size"), [](int64_t, PyValue& sd, PyValue&) {
    sd.set("decoder.layers.1.self_attention.linear_kv_down_proj.weight", PyValue::tensor(Tensor::zeros({6, 32})));
  });
  m = read_megatron_checkpoint(tmp.file("size"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor 'decoder.layers.1.self_attention.linear_kv_down_proj.weight' has shape "
                                      "[12, 32]; expected 16 rows (kv_lora_rank + qk_pos_emb_head_dim in args)"),
            std::string::npos)
      << m.status().message();
  // Writing: Gale's query norm without a query latent has no Megatron counterpart; the local spec's
  // column-parallel down projections need TP to divide the latents.
  auto q = read_megatron_checkpoint(fixture("mla_qlora/tp1"));
  ASSERT_TRUE(q.ok());
  MegatronSaveOptions o;
  o.save_dir = tmp.file("w");
  o.tensor_parallel = 4;
  ModelArgs odd = q->model;
  odd.q_lora_rank = 6;
  Status s = write_megatron_checkpoint(o, odd, {});
  EXPECT_NE(s.message().find("--target-tensor-parallel-size 4: expected it to divide --q-lora-rank (6)"),
            std::string::npos)
      << s.message();
  ModelArgs direct = q->model;
  direct.q_lora_rank = kUnset;
  o.tensor_parallel = 1;
  s = write_megatron_checkpoint(
      o, direct, {{"decoder.layers.0.self_attention.linear_q_proj.layer_norm_weight", Tensor::zeros({32})}});
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.message();
  EXPECT_NE(s.message().find("has no counterpart in Megatron's multi-latent attention"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace gale
