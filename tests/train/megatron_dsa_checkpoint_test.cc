// Megatron-Core main's DeepSeek sparse attention checkpoints (legacy torch format at TP 1 and 2) to and from Gale.
//
// tests/data/megatron/dsa/{tp1,tp2} (tools/reference/megatron_dsa_reference.py) hold the DeepSeek-V3.2
// fixture's weights (tests/data/hf/deepseek_v32) under the names and TP splits of Megatron main's DSA
// layer spec: the indexer under self_attention.core_attention.indexer (duplicated), q_layernorm /
// kv_layernorm unfused, the down projections duplicated. Reading either gives Gale's names and the
// reference logits (the HF fixture's golden, within 1e-4); TP 2 merges into the TP 1 tensors bit for
// bit; Gale -> Megatron at TP 2 writes the fixture's rank files (same keys, `_extra_state` entries,
// bytes, the DSA flags in args) and reads back bit for bit.
#include <filesystem>
#include <map>

#include "ckpt/safetensors.h"
#include "train/megatron_fixture.h"

namespace gale {
namespace {

using namespace megatron_fixture;

std::string dsa(const std::string& layout) { return fixture("dsa/" + layout); }

struct Golden {
  std::vector<int32_t> tokens;
  Tensor logits;  // [S, V]
};
Golden read_golden() {
  auto f = SafetensorsFile::open(std::string(GALE_TEST_DATA_DIR) + "/hf/deepseek_v32/golden.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().message();
  Golden g;
  Tensor t = f->read("tokens", DType::kI64).value();
  for (int64_t i = 0; i < t.numel(); ++i) g.tokens.push_back(static_cast<int32_t>(t.data<int64_t>()[i]));
  g.logits = f->read("logits", DType::kF32).value();
  return g;
}

// Largest |Gale − reference| over the real vocabulary.
double max_logit_diff(GPTModel& model, const Golden& g) {
  MicroBatch mb;
  mb.B = 1;
  mb.S = static_cast<int64_t>(g.tokens.size());
  mb.tokens = g.tokens;
  mb.position_ids.resize(g.tokens.size());
  std::iota(mb.position_ids.begin(), mb.position_ids.end(), 0);
  const Tensor l = model.forward_logits(mb, Tensor());
  const int64_t Vp = l.size(2), V = g.logits.size(1);
  double d = 0;
  for (int64_t s = 0; s < mb.S; ++s)
    for (int64_t v = 0; v < V; ++v)
      d = std::max(d, std::abs(static_cast<double>(l.data<float>()[s * Vp + v]) - g.logits.data<float>()[s * V + v]));
  return d;
}

TEST(MegatronDsaCheckpoint, Tp1AndTp2ReadIntoGalesNamesAndReproduceTheReference) {
  auto a = read_megatron_checkpoint(dsa("tp1"));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->model.experimental_attention_variant, "dsa");
  EXPECT_EQ(a->model.dsa_indexer_n_heads, 4);
  EXPECT_EQ(a->model.dsa_indexer_head_dim, 8);
  EXPECT_EQ(a->model.dsa_indexer_topk, 5);
  EXPECT_EQ(a->model.dsa_indexer_loss_coeff, 0.0);  // Megatron's None
  const std::string attn = "decoder.layers.1.self_attention.";
  for (const char* t : {"linear_wq_b.weight", "linear_wk.weight", "k_norm.weight", "k_norm.bias",
                        "linear_weights_proj.weight"}) {
    EXPECT_EQ(a->tensors.count(attn + "indexer." + t), 1u) << t;
    EXPECT_EQ(a->tensors.count(attn + "core_attention.indexer." + t), 0u) << t;
  }
  EXPECT_EQ(a->tensors.count(attn + "linear_q_up_proj.layer_norm_weight"), 1u);
  const Golden g = read_golden();
  EXPECT_LT(max_logit_diff(*build_model(*a)->model, g), 1e-4);

  auto b = read_megatron_checkpoint(dsa("tp2"));
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->tensor_parallel, 2);
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (const auto& [name, t] : a->tensors) {
    ASSERT_TRUE(b->tensors.count(name)) << name;
    EXPECT_TRUE(same_tensor(t, b->tensors.at(name))) << name;
  }
  EXPECT_LT(max_logit_diff(*build_model(*b)->model, g), 1e-4);
}

// Megatron's torch_dist of the same model saved at TP 1 and TP 2 (tools/reference/
// megatron_gdn_dsa_torch_dist_reference.py): the layers stacked along num_layers, the indexer's and the down
// projections' duplicated linears one replicated key each
// (decoder.layers.self_attention.core_attention.indexer.linear_wq_b.weight [L, NI*DI, Cq], ...), the up projections
// split by rows. Both read into the torch format's TP 1 tensors bit for bit and reproduce the reference.
TEST(MegatronDsaCheckpoint, TorchDistAtTp1AndTp2ReadsIntoTheTp1Tensors) {
  auto a = read_megatron_checkpoint(dsa("tp1"));
  ASSERT_TRUE(a.ok()) << a.status().message();
  const Golden g = read_golden();
  for (const char* layout : {"torch_dist_tp1", "torch_dist_tp2"}) {
    auto b = read_megatron_checkpoint(dsa(layout));
    ASSERT_TRUE(b.ok()) << layout << ": " << b.status().message();
    EXPECT_EQ(b->format, CheckpointFormat::kMegatronTorchDist);
    EXPECT_EQ(b->tensor_parallel, std::string(layout) == "torch_dist_tp2" ? 2 : 1);
    EXPECT_EQ(b->model.experimental_attention_variant, "dsa");
    EXPECT_EQ(b->model.dsa_indexer_topk, 5);
    ASSERT_EQ(a->tensors.size(), b->tensors.size()) << layout;
    for (const auto& [name, t] : a->tensors) {
      ASSERT_TRUE(b->tensors.count(name)) << layout << " " << name;
      EXPECT_TRUE(same_tensor(t, b->tensors.at(name))) << layout << " " << name;
    }
    EXPECT_LT(max_logit_diff(*build_model(*b)->model, g), 1e-4) << layout;
  }
}

TEST(MegatronDsaCheckpoint, WritesMegatronMainsTp2FilesAndReadsThemBack) {
  TempDir tmp;
  auto m = read_megatron_checkpoint(dsa("tp1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  MegatronSaveOptions o;
  o.save_dir = tmp.file("mg");
  o.tensor_parallel = 2;
  o.iteration = 7;
  o.vocab_size = 100;
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : m->tensors) tensors.push_back({name, t});
  Status s = write_megatron_checkpoint(o, m->model, tensors);
  ASSERT_TRUE(s.ok()) << s.message();
  for (const char* rank : {"mp_rank_00", "mp_rank_01"})
    expect_same_rank_file(tmp.file(str_cat("mg/iter_0000007/", rank, "/model_optim_rng.pt")),
                          dsa(str_cat("tp2/iter_0000007/", rank, "/model_optim_rng.pt")),
                          [](const PyValue& args, const PyValue& want) {
                            EXPECT_EQ(args.attr("experimental_attention_variant")->s, "dsa");
                            for (const char* key : {"dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk"})
                              EXPECT_EQ(args.attr(key)->i, want.attr(key)->i) << key;
                            EXPECT_EQ(args.attr("dsa_indexer_loss_coeff")->kind, PyValue::kNone);
                            EXPECT_FALSE(args.attr("dsa_indexer_use_sparse_loss")->b);
                          });
  auto back = read_megatron_checkpoint(tmp.file("mg"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->model.dsa_indexer_topk, 5);
  ASSERT_EQ(back->tensors.size(), m->tensors.size());
  for (const auto& [name, t] : m->tensors) EXPECT_TRUE(same_tensor(t, back->tensors.at(name))) << name;
}

// Megatron's earlier AbsorbedMLASelfAttention saved linear_k_up_proj / linear_v_up_proj (column-
// parallel) instead of linear_kv_up_proj: rank files holding them read into the same tensors; only
// one of them is an error.
TEST(MegatronDsaCheckpoint, SplitKvUpProjectionsCombinePerHead) {
  TempDir tmp;
  const int64_t NH = 2, Dn = 8, Dv = 6;  // per TP-2 rank: 4 heads / 2
  auto rewrite = [&](const std::string& out, bool drop_v) {
    for (int t = 0; t < 2; ++t) {
      const std::string rank = str_cat("iter_0000007/mp_rank_0", t, "/model_optim_rng.pt");
      auto root = read_torch_file(dsa("tp2/" + rank));
      ASSERT_TRUE(root.ok());
      PyValue& sd = *const_cast<PyValue*>((*root)->get("model"));
      PyValue edited;
      edited.kind = PyValue::kDict;
      for (const auto& [k, v] : sd.entries) {
        const size_t at = k->s.find("self_attention.linear_kv_up_proj.");
        if (at == std::string::npos) {
          edited.set(k->s, v);
          continue;
        }
        const std::string layer = k->s.substr(0, at) + "self_attention.";
        if (v->kind != PyValue::kTensor) {  // _extra_state
          edited.set(layer + "linear_k_up_proj._extra_state", PyValue::none());
          if (!drop_v) edited.set(layer + "linear_v_up_proj._extra_state", PyValue::none());
          continue;
        }
        const Tensor& kv = v->data;  // [NH·(Dn + Dv), Ckv], per head [k; v]
        const int64_t C = kv.shape()[1];
        Tensor k_up = Tensor::empty({NH * Dn, C}), v_up = Tensor::empty({NH * Dv, C});
        for (int64_t h = 0; h < NH; ++h) {
          std::memcpy(k_up.data<float>() + h * Dn * C, kv.data<float>() + h * (Dn + Dv) * C, Dn * C * sizeof(float));
          std::memcpy(v_up.data<float>() + h * Dv * C, kv.data<float>() + (h * (Dn + Dv) + Dn) * C,
                      Dv * C * sizeof(float));
        }
        edited.set(layer + "linear_k_up_proj.weight", PyValue::tensor(k_up));
        if (!drop_v) edited.set(layer + "linear_v_up_proj.weight", PyValue::tensor(v_up));
      }
      sd.entries = edited.entries;
      std::filesystem::create_directories(std::filesystem::path(out + "/" + rank).parent_path());
      ASSERT_TRUE(write_torch_file(out + "/" + rank, **root).ok());
    }
    std::ofstream(out + "/latest_checkpointed_iteration.txt") << "7";
  };
  rewrite(tmp.file("split"), false);
  auto a = read_megatron_checkpoint(dsa("tp1"));
  auto b = read_megatron_checkpoint(tmp.file("split"));
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (const auto& [name, t] : a->tensors) EXPECT_TRUE(same_tensor(t, b->tensors.at(name))) << name;
  rewrite(tmp.file("k_only"), true);
  auto bad = read_megatron_checkpoint(tmp.file("k_only"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layer 'decoder.layers.0.': expected linear_kv_up_proj.weight or both of "
                                        "Megatron's earlier linear_k_up_proj.weight and linear_v_up_proj.weight, found "
                                        "only one of the split ones"),
            std::string::npos)
      << bad.status().message();
}

// A DSA model's MTP layers (each with an indexer in Megatron main) are refused with MLA's, naming the flag.
TEST(MegatronDsaCheckpoint, MtpLayersAreRefused) {
  TempDir tmp;
  auto m = read_megatron_checkpoint(dsa("tp1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  ModelArgs with_mtp = m->model;
  with_mtp.mtp_num_layers = 1;
  MegatronSaveOptions o;
  o.save_dir = tmp.file("mg");
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : m->tensors) tensors.push_back({name, t});
  const Status s = write_megatron_checkpoint(o, with_mtp, tensors);
  EXPECT_EQ(s.message(), "writing Megatron's torch format of a model with --mtp-num-layers 1 and "
                         "--multi-latent-attention: not supported yet (expected MTP layers with standard attention)");
}

}  // namespace
}  // namespace gale
