// Megatron-Core Gated DeltaNet (-2) GPT checkpoints in the torch format at TP 1, TP 2 and TP 2 x PP 2: read, written, refused.
//
// tests/data/megatron/{gdn,gdn2}/ (tools/reference/megatron_gdn_reference.py) hold a tiny GDN GPT
// model (4 layers, --linear-attention-freq [1,1,1,0], NK 2, NV 4, DK = DV = 4, K 4) laid out by
// Megatron main's rules: tp1/ the whole state dict, tp2/ (and, for gdn, tp2pp2/) cut from it with
// in_proj's sections and conv1d's q | k | v split over TP each on its own, dt_bias / A_log split
// contiguously, out_proj by columns. Gale must read every layout into the same whole tensors (its
// model's, conv1d.weight [C, K]), write Megatron's TP 2 (x PP 2) rank files byte for byte, and refuse
// what it does not read. gdn_reference.json holds the script's float64 forward of the tp1 model,
// written from Megatron's math: every layout read into Gale's model must give its logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/temp_dir.h"
#include "ckpt/torch_file.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_fixture.h"
#include "train/megatron_gdn_dist.h"
#include "train/megatron_gdn_names.h"

namespace gale {
namespace {

using testing_util::TempDir;
using namespace megatron_fixture;
namespace fs = std::filesystem;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class GdnCheckpoint : public ::testing::TestWithParam<const char*> {
 protected:
  std::string dir(const std::string& layout) const { return fixture(str_cat(GetParam(), "/", layout)); }
  bool gdn2() const { return std::string(GetParam()) == "gdn2"; }
  std::vector<std::string> layouts() const {
    return gdn2() ? std::vector<std::string>{"tp2"} : std::vector<std::string>{"tp2", "tp2pp2"};
  }
  // Megatron's torch_dist at TP 1 and 2 (and, for gdn, torch_dcp at TP 1) of the same weights
  // (tools/reference/megatron_gdn_dsa_torch_dist_reference.py).
  std::vector<std::string> dist_layouts() const {
    if (gdn2()) return {"torch_dist_tp1", "torch_dist_tp2"};
    return {"torch_dist_tp1", "torch_dist_tp2", "torch_dcp_tp1"};
  }
};

TEST_P(GdnCheckpoint, Tp1ReadsAsGalesModel) {
  auto m = read_megatron_checkpoint(dir("tp1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->model.experimental_attention_variant, GetParam());
  EXPECT_EQ(m->model.linear_attention_pattern, (std::vector<int>{1, 1, 1, 0}));
  EXPECT_EQ(m->model.linear_num_key_heads, 2);
  EXPECT_EQ(m->model.linear_num_value_heads, 4);
  EXPECT_EQ(m->model.linear_conv_kernel_dim, 4);
  const std::string g = "decoder.layers.1.self_attention.";
  EXPECT_EQ(m->tensors.at(g + "in_proj.weight").shape(), (Shape{gdn2() ? 80 : 56, 16}));
  EXPECT_EQ(m->tensors.at(g + "conv1d.weight").shape(), (Shape{32, 4}));  // Megatron's [32, 1, 4]
  EXPECT_EQ(m->tensors.at(g + "dt_bias").shape(), (Shape{gdn2() ? 8 : 4}));
  EXPECT_EQ(m->tensors.at(g + "A_log").shape(), (Shape{gdn2() ? 2 : 4}));
  // Transformer Engine's fused norm names stay (Gale's GDN model has them).
  EXPECT_TRUE(m->tensors.count("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight"));
  EXPECT_TRUE(m->tensors.count("decoder.layers.0.self_attention.in_proj.layer_norm_weight"));
  EXPECT_TRUE(m->tensors.count("decoder.layers.0.mlp.linear_fc1.layer_norm_weight"));
  EXPECT_FALSE(m->tensors.count("decoder.layers.3.input_layernorm.weight"));
  // The conv weights are the file's, unit dimension dropped.
  auto root = read_torch_file(dir("tp1/iter_0000007/mp_rank_00/model_optim_rng.pt"));
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(std::memcmp((*root)->get("model")->get(g + "conv1d.weight")->data.raw(),
                        m->tensors.at(g + "conv1d.weight").raw(), 32 * 4 * sizeof(float)),
            0);
  // Gale's model takes every tensor (load_parameters checks names and shapes) and runs.
  auto loaded = build_model(*m);
  MicroBatch mb;
  mb.B = 1;
  mb.S = 6;
  mb.tokens = {3, 14, 15, 9, 2, 6};
  mb.position_ids = {0, 1, 2, 3, 4, 5};
  Tensor logits = loaded->model->forward_logits(mb, Tensor());
  ASSERT_EQ(logits.numel(), 6 * 64);
  for (int64_t i = 0; i < logits.numel(); ++i) ASSERT_TRUE(std::isfinite(logits.data<float>()[i])) << i;
}

// The TP 2 (x PP 2) files merge into the TP 1 tensors bit for bit: each rank's in_proj is
// [q_r | k_r | v_r | z_r | β_r | α_r] (GDN2: ... f_r | b_r | w_r), its conv1d [q_r | k_r | v_r].
TEST_P(GdnCheckpoint, Tp2AndPp2MergeIntoTheTp1Tensors) {
  auto a = read_megatron_checkpoint(dir("tp1"));
  ASSERT_TRUE(a.ok()) << a.status().message();
  for (const std::string& layout : layouts()) {
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

// torch_dist's in_proj.weight.<section> / conv1d.weight.<section> keys (and torch_dcp's TP 1 state dict) read into
// the torch format's TP 1 tensors bit for bit; the saving layout's TP size is recorded.
TEST_P(GdnCheckpoint, TorchDistSectionsJoinIntoTheTp1Tensors) {
  auto a = read_megatron_checkpoint(dir("tp1"));
  ASSERT_TRUE(a.ok()) << a.status().message();
  for (const std::string& layout : dist_layouts()) {
    auto b = read_megatron_checkpoint(dir(layout));
    ASSERT_TRUE(b.ok()) << layout << ": " << b.status().message();
    EXPECT_EQ(b->format, layout.rfind("torch_dist", 0) == 0 ? CheckpointFormat::kMegatronTorchDist
                                                            : CheckpointFormat::kMegatronTorchDcp);
    EXPECT_EQ(b->tensor_parallel, layout.back() - '0') << layout;
    EXPECT_EQ(b->iteration, 7);
    EXPECT_EQ(b->model.linear_attention_pattern, (std::vector<int>{1, 1, 1, 0}));
    ASSERT_EQ(a->tensors.size(), b->tensors.size()) << layout;
    for (const auto& [name, t] : a->tensors) {
      ASSERT_TRUE(b->tensors.count(name)) << layout << " " << name;
      EXPECT_TRUE(same_tensor(t, b->tensors.at(name))) << layout << " " << name;
    }
  }
}

// Gale -> Megatron at TP 2 (x PP 2) writes the fixture's rank files (same keys, `_extra_state` None
// entries of in_proj / out_proj included, same bytes; the GDN args), and writing what it read again
// gives the same bytes.
TEST_P(GdnCheckpoint, WritesMegatronsRankFilesAndRoundTripsByteIdentically) {
  TempDir tmp;
  auto m = read_megatron_checkpoint(dir("tp1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  for (const std::string& layout : layouts()) {
    SCOPED_TRACE(layout);
    const bool pp2 = layout == "tp2pp2";
    MegatronSaveOptions o;
    o.save_dir = tmp.file("mg_" + layout);
    o.tensor_parallel = 2;
    o.pipeline_parallel = pp2 ? 2 : 1;
    Status s = write_fixture_as_megatron(*m, o);
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<std::string> ranks;
    for (int t = 0; t < 2; ++t)
      for (int p = 0; p < (pp2 ? 2 : 1); ++p) ranks.push_back(pp2 ? str_cat("mp_rank_0", t, "_00", p) : str_cat("mp_rank_0", t));
    for (const std::string& rank : ranks)
      expect_same_rank_file(tmp.file(str_cat("mg_", layout, "/iter_0000007/", rank, "/model_optim_rng.pt")),
                            dir(str_cat(layout, "/iter_0000007/", rank, "/model_optim_rng.pt")),
                            [](const PyValue& args, const PyValue& want) {
                              EXPECT_EQ(args.attr("experimental_attention_variant")->s,
                                        want.attr("experimental_attention_variant")->s);
                              EXPECT_EQ(args.attr("transformer_impl")->s, "transformer_engine");
                              const PyValue* freq = args.attr("linear_attention_freq");
                              ASSERT_EQ(freq->kind, PyValue::kList);
                              ASSERT_EQ(freq->items.size(), 4u);
                              for (int i = 0; i < 4; ++i)
                                EXPECT_EQ(freq->items[i]->i, want.attr("linear_attention_freq")->items[i]->i);
                              for (const char* key : {"linear_conv_kernel_dim", "linear_key_head_dim",
                                                      "linear_value_head_dim", "linear_num_key_heads",
                                                      "linear_num_value_heads"})
                                EXPECT_EQ(args.attr(key)->i, want.attr(key)->i) << key;
                            });
    // Read back and written again: byte-identical files.
    auto back = read_megatron_checkpoint(tmp.file("mg_" + layout));
    ASSERT_TRUE(back.ok()) << back.status().message();
    for (const auto& [name, t] : m->tensors) EXPECT_TRUE(same_tensor(t, back->tensors.at(name))) << name;
    o.save_dir = tmp.file("again_" + layout);
    ASSERT_TRUE(write_fixture_as_megatron(*back, o).ok());
    for (const std::string& rank : ranks) {
      const std::string f = str_cat("/iter_0000007/", rank, "/model_optim_rng.pt");
      EXPECT_EQ(file_bytes(tmp.file("mg_" + layout + f)), file_bytes(tmp.file("again_" + layout + f))) << rank;
    }
  }
}

// The script's float64 forward of Megatron's GatedDeltaNet GPT model (gdn_reference.json, written from
// Megatron's math on the tp1 state dict): Gale's model read from tp1, tp2 or tp2pp2 gives its logits
// and per-token losses, so the section order Gale merges to is the one Megatron's forward reads.
TEST_P(GdnCheckpoint, EveryLayoutReproducesTheReferenceLogits) {
  std::ifstream in(fixture("gdn_reference.json"));
  const nlohmann::json j = nlohmann::json::parse(in).at(GetParam());
  Reference ref;
  ref.tokens = j["tokens"].get<std::vector<int32_t>>();
  ref.labels = j["labels"].get<std::vector<int32_t>>();
  ref.logits = j["logits"].get<std::vector<std::vector<double>>>();
  ref.losses = j["losses"].get<std::vector<double>>();
  std::vector<std::string> all = layouts();
  all.insert(all.begin(), "tp1");
  for (const std::string& d : dist_layouts()) all.push_back(d);
  for (const std::string& layout : all) {
    auto m = read_megatron_checkpoint(dir(layout));
    ASSERT_TRUE(m.ok()) << m.status().message();
    auto loaded = build_model(*m);
    const Comparison c = compare(*loaded->model, ref);
    EXPECT_LT(c.max_logit_diff, kLogitTolerance) << layout;
    EXPECT_LT(c.max_loss_diff, kLogitTolerance) << layout;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GdnCheckpoint, ::testing::Values("gdn", "gdn2"));

// Rewrites gdn/tp2's rank files through `edit(rank, state dict, args)` into `out`.
void rewrite_tp2(const std::string& out, const std::function<void(int64_t, PyValue&, PyValue&)>& edit) {
  for (int64_t t = 0; t < 2; ++t) {
    const std::string rank = str_cat("iter_0000007/mp_rank_0", t, "/model_optim_rng.pt");
    auto root = read_torch_file(fixture("gdn/tp2/" + rank));
    ASSERT_TRUE(root.ok());
    edit(t, *const_cast<PyValue*>((*root)->get("model")), *const_cast<PyValue*>((*root)->get("args"))->state);
    fs::create_directories(fs::path(out + "/" + rank).parent_path());
    ASSERT_TRUE(write_torch_file(out + "/" + rank, **root).ok());
  }
  std::ofstream(out + "/latest_checkpointed_iteration.txt") << "7";
}

TEST(MegatronGdnCheckpoint, Refusals) {
  TempDir tmp;
  // Megatron's optimizer state of a GDN model: not read (pretrain names the way out).
  auto m = read_megatron_checkpoint(fixture("gdn/tp2"), kUnset, /*with_optimizer=*/true);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("optimizer state of a Gated DeltaNet model in the torch format: not supported "
                                      "yet; pass --no-load-optim (or --finetune)"),
            std::string::npos)
      << m.status().message();
  // in_proj rows that are not the args' sizes' 1/TP.
  rewrite_tp2(tmp.file("rows"), [](int64_t, PyValue&, PyValue& args) { args.set("linear_num_value_heads", PyValue::integer(8)); });
  m = read_megatron_checkpoint(tmp.file("rows"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor 'self_attention.in_proj.weight' has shape [28, 16] on each of 2 "
                                      "tensor-parallel ranks; expected 48 rows"),
            std::string::npos)
      << m.status().message();
  // A missing size in args.
  rewrite_tp2(tmp.file("nosize"), [](int64_t, PyValue&, PyValue& args) { args.set("linear_key_head_dim", PyValue::none()); });
  m = read_megatron_checkpoint(tmp.file("nosize"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("(args): args 'linear_key_head_dim' of a Gated DeltaNet model: expected a "
                                      "positive int, found none"),
            std::string::npos)
      << m.status().message();
  // A TP size that does not divide the key heads.
  auto tp1 = read_megatron_checkpoint(fixture("gdn/tp1"));
  ASSERT_TRUE(tp1.ok());
  MegatronSaveOptions o;
  o.save_dir = tmp.file("tp4");
  o.tensor_parallel = 4;
  tp1->model.num_attention_heads = 4;  // so that only the GDN heads refuse TP 4
  tp1->model.ffn_hidden_size = 32;
  Status s = write_fixture_as_megatron(*tp1, o);
  EXPECT_EQ(s.message(), "--target-tensor-parallel-size 4: expected it to divide the Gated DeltaNet key heads (2) and "
                         "value heads (4)");
}

// torch_dist's sections joined on their own (train/megatron_gdn_dist.h): Megatron's order whatever the dict's, and
// the refusals of sections that do not fit the args.
TEST(MegatronGdnCheckpoint, DistSectionsJoinInMegatronsOrderAndRefuseMisfits) {
  const MegatronGdnSizes s{2, 4, 4, 4, 4, false};  // sections q 8, k 8, v 16, z 16, beta 4, alpha 4
  const std::string base = "decoder.layers.0.self_attention.in_proj.weight";
  auto sections = [&](const std::vector<std::string>& names, const std::vector<int64_t>& rows) {
    PyRef d = PyValue::dict();
    d->set("decoder.layers.0.self_attention.dt_bias", PyValue::tensor(Tensor::empty({4}, DType::kF32)));
    float next = 0;
    for (size_t i = names.size(); i-- > 0;) {  // reversed: the join must not follow the dict's order
      Tensor t = Tensor::empty({rows[i], 2}, DType::kF32);
      for (int64_t e = 0; e < t.numel(); ++e) t.data<float>()[e] = 1000.f * static_cast<float>(i) + next++;
      d->set(base + "." + names[i], PyValue::tensor(t));
    }
    return d;
  };
  const std::vector<std::string> names = megatron_gdn_in_proj_section_names(false);
  EXPECT_EQ(names, (std::vector<std::string>{"query", "key", "value", "z", "beta", "alpha"}));
  EXPECT_EQ(megatron_gdn_in_proj_section_names(true),
            (std::vector<std::string>{"query", "key", "value", "z", "f", "b", "w"}));
  PyRef d = sections(names, s.in_proj_sections());
  ASSERT_TRUE(join_megatron_gdn_dist_sections(s, *d, "ckpt").ok());
  ASSERT_NE(d->get(base), nullptr);
  EXPECT_EQ(d->get(base + ".query"), nullptr);
  EXPECT_NE(d->get("decoder.layers.0.self_attention.dt_bias"), nullptr);
  const Tensor& w = d->get(base)->data;
  ASSERT_EQ(w.shape(), (Shape{56, 2}));
  int64_t row = 0;
  for (size_t i = 0; i < names.size(); ++i) {  // section i's rows hold 1000 * i + ...
    for (int64_t r = 0; r < s.in_proj_sections()[i]; ++r, ++row)
      EXPECT_EQ(static_cast<int64_t>(w.data<float>()[row * 2] / 1000.f), static_cast<int64_t>(i)) << row;
  }
  // A section missing, one of the wrong size, GDN2's sections under GDN args, sections beside the whole tensor.
  d = sections({"query", "key", "value", "z", "beta"}, {8, 8, 16, 16, 4});
  Status st = join_megatron_gdn_dist_sections(s, *d, "ckpt");
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("ckpt: tensor '" + base + ".alpha' missing"), std::string::npos) << st.message();
  d = sections(names, {8, 8, 16, 16, 4, 8});
  st = join_megatron_gdn_dist_sections(s, *d, "ckpt");
  EXPECT_NE(st.message().find(base + ".alpha' of shape [8, 2]: expected 4 rows (the args' Gated DeltaNet sizes), "
                                     "found 8"),
            std::string::npos)
      << st.message();
  d = sections(megatron_gdn_in_proj_section_names(true), {8, 8, 16, 16, 8, 8, 16});
  st = join_megatron_gdn_dist_sections(s, *d, "ckpt");
  EXPECT_NE(st.message().find("not a section of a Gated DeltaNet model's in_proj (expected query, key, value, z, "
                              "beta, alpha)"),
            std::string::npos)
      << st.message();
  d = sections(names, s.in_proj_sections());
  d->set(base, PyValue::tensor(Tensor::empty({56, 2}, DType::kF32)));
  st = join_megatron_gdn_dist_sections(s, *d, "ckpt");
  EXPECT_NE(st.message().find("expected one or the other"), std::string::npos) << st.message();
}

// Megatron's optimizer state of a GDN model in torch_dist: refused naming --no-load-optim, as the torch format's.
TEST(MegatronGdnCheckpoint, TorchDistOptimizerStateRefused) {
  auto m = read_megatron_checkpoint(fixture("gdn/torch_dist_tp2"), kUnset, /*with_optimizer=*/true);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("optimizer state of a Gated DeltaNet model in the torch_dist format: not "
                                      "supported yet; pass --no-load-optim (or --finetune)"),
            std::string::npos)
      << m.status().message();
}

// The split on its own: GDN2's seven sections, cut and merged back, TP 2.
TEST(MegatronGdnCheckpoint, SectionCutAndMergeAreInverse) {
  const MegatronGdnSizes s{2, 4, 4, 4, 4, true};
  Tensor whole = Tensor::empty({80, 3}, DType::kF32);
  for (int64_t i = 0; i < whole.numel(); ++i) whole.data<float>()[i] = static_cast<float>(i);
  std::vector<Tensor> parts;
  for (int t = 0; t < 2; ++t) {
    auto p = megatron_gdn_cut_tp("self_attention.in_proj.weight", whole, s, 2, t);
    ASSERT_TRUE(p.ok());
    ASSERT_EQ(p->shape(), (Shape{40, 3}));
    parts.push_back(*p);
  }
  // Rank 1's first rows are q's second half (rows 4..7), its f section starts after q, k, v, z halves.
  EXPECT_EQ(parts[1].data<float>()[0], 4 * 3);
  EXPECT_EQ(parts[1].data<float>()[(4 + 4 + 8 + 8) * 3], (8 + 8 + 16 + 16 + 4) * 3);
  auto back = megatron_gdn_merge_tp("self_attention.in_proj.weight", parts, s, "x");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(same_tensor(whole, *back));
}

}  // namespace
}  // namespace gale
