// Megatron's torch-format checkpoints of models with multi-token-prediction layers: reading, writing, round trips.
//
// tests/data/megatron/mtp/ (tools/reference/megatron_mtp_reference.py) holds Megatron core_v0.12.1's own TP 1
// checkpoint of the megatron_ckpt_reference.py model with --mtp-num-layers 2 and Megatron's per-depth MTP
// losses for 8 tokens. Reading it must give Gale's MTP model those losses (fp32 both sides: within 1e-4);
// writing it back at TP 1 must give Megatron's file key for key and byte for byte (the names, `_extra_state`
// entries and args Megatron loads strictly); at TP 2, PP 2 and TP 2 x PP 2 the MTP layers go to the last
// stage with eh_proj's rows split, and reading back gives every tensor bit for bit and the same losses.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/model_checkpoint.h"
#include "ckpt/temp_dir.h"
#include "ckpt/torch_file.h"
#include "kernels/op_table.h"
#include "model/gpt_model.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_fixture.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using testing_util::TempDir;
using namespace megatron_fixture;
namespace fs = std::filesystem;

struct MtpReference {
  std::vector<int32_t> tokens, labels;
  std::vector<double> mtp_losses;
};
MtpReference read_mtp_reference() {
  std::ifstream in(fixture("mtp/reference.json"));
  const nlohmann::json j = nlohmann::json::parse(in);
  return {j["tokens"].get<std::vector<int32_t>>(), j["labels"].get<std::vector<int32_t>>(),
          j["mtp_losses"].get<std::vector<double>>()};
}

// One training forward and backward of Gale's model of `m` (no dropout, as Megatron's fixture) on the
// reference tokens: the LM loss sum and each MTP depth's loss.
struct Losses {
  double lm = 0;
  std::vector<double> mtp;
};
Losses losses_of(const MegatronCheckpoint& m) {
  TempDir tmp;
  EXPECT_TRUE(save_megatron_as_gale(m, tmp.file("gale"), "fixture").ok());
  auto r = CheckpointReader::open(tmp.file("gale"));
  EXPECT_TRUE(r.ok()) << r.status().message();
  Arguments a;
  a.model = m.model;
  a.moe = m.moe;
  ModelConfig c = model_config_from_args(a);
  c.hidden_dropout = c.attention_dropout = 0.0f;
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  Status s = load_parameters(r.value(), model.params());
  EXPECT_TRUE(s.ok()) << s.message();
  const MtpReference ref = read_mtp_reference();
  MicroBatch mb;
  mb.B = 1;
  mb.S = static_cast<int64_t>(ref.tokens.size());
  mb.tokens = ref.tokens;
  mb.labels = ref.labels;
  mb.loss_mask.assign(ref.tokens.size(), 1.0f);
  mb.position_ids.resize(ref.tokens.size());
  std::iota(mb.position_ids.begin(), mb.position_ids.end(), 0);
  GPTModel::LossSums sums;
  model.forward(0, mb, Tensor(), true, &sums);
  model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  return {sums.loss_sum, model.take_mtp_losses()};
}

std::vector<NamedTensor> tensors_of(const MegatronCheckpoint& m) {
  std::vector<NamedTensor> out;
  for (const auto& [name, t] : m.tensors) out.push_back({name, t});
  return out;
}

TEST(MegatronMtpCheckpoint, ReadsMegatronsMtpLayersAndReproducesItsMtpLosses) {
  auto m = read_megatron_checkpoint(fixture("mtp/tp1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->model.mtp_num_layers, 2);
  EXPECT_EQ(m->tensors.size(), 66u);  // 36 of the model without MTP, 15 per MTP layer
  EXPECT_EQ(m->tensors.at("mtp.layers.1.eh_proj.weight").shape(), (Shape{32, 64}));
  EXPECT_TRUE(m->tensors.count("mtp.layers.0.transformer_layer.mlp.linear_fc1.weight"));
  const Losses l = losses_of(m.value());
  const MtpReference ref = read_mtp_reference();
  ASSERT_EQ(l.mtp.size(), 2u);
  for (size_t k = 0; k < 2; ++k) EXPECT_NEAR(l.mtp[k], ref.mtp_losses[k], kLogitTolerance) << "depth " << k + 1;
}

// Gale -> Megatron at TP 1 gives Megatron's own file: the same keys (MTP names and `_extra_state` entries
// included), kinds and bytes, and args with mtp_num_layers.
TEST(MegatronMtpCheckpoint, WritesMegatronsOwnTp1File) {
  TempDir tmp;
  auto m = read_megatron_checkpoint(fixture("mtp/tp1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  MegatronSaveOptions o;
  o.save_dir = tmp.file("mg");
  ASSERT_TRUE(write_fixture_as_megatron(m.value(), o).ok());
  expect_same_rank_file(tmp.file("mg/iter_0000007/mp_rank_00/model_optim_rng.pt"),
                        fixture("mtp/tp1/iter_0000007/mp_rank_00/model_optim_rng.pt"),
                        [](const PyValue& mine, const PyValue& theirs) {
                          ASSERT_TRUE(mine.attr("mtp_num_layers"));
                          EXPECT_EQ(mine.attr("mtp_num_layers")->i, theirs.attr("mtp_num_layers")->i);
                          EXPECT_EQ(mine.attr("mtp_loss_scaling_factor")->f, 0.1);
                        });
}

// TP 2, PP 2 and TP 2 x PP 2: every tensor back bit for bit, the same LM and MTP losses; the MTP layers and
// the embedding's copy on the last stage only, eh_proj's rows split over TP.
TEST(MegatronMtpCheckpoint, RoundTripsAtTp2AndPp2) {
  auto m = read_megatron_checkpoint(fixture("mtp/tp1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const Losses want = losses_of(m.value());
  for (auto [tp, pp] : {std::pair<int64_t, int64_t>{2, 1}, {1, 2}, {2, 2}}) {
    SCOPED_TRACE(str_cat("TP ", tp, " PP ", pp));
    TempDir tmp;
    MegatronSaveOptions o;
    o.save_dir = tmp.file("mg");
    o.tensor_parallel = tp;
    o.pipeline_parallel = pp;
    Status s = write_fixture_as_megatron(m.value(), o);
    ASSERT_TRUE(s.ok()) << s.message();
    auto back = read_megatron_checkpoint(tmp.file("mg"));
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back->model.mtp_num_layers, 2);
    ASSERT_EQ(back->tensors.size(), m->tensors.size());
    for (const auto& [name, t] : m->tensors) EXPECT_TRUE(same_tensor(t, back->tensors.at(name))) << name;
    const Losses got = losses_of(back.value());
    EXPECT_EQ(got.lm, want.lm);
    EXPECT_EQ(got.mtp, want.mtp);
    const Tensor& eh = m->tensors.at("mtp.layers.0.eh_proj.weight");
    for (int64_t p = 0; p < pp; ++p)
      for (int64_t t = 0; t < tp; ++t) {
        const std::string rank = pp == 1 ? str_cat("mp_rank_0", t) : str_cat("mp_rank_0", t, "_00", p);
        auto f = read_torch_file(tmp.file(str_cat("mg/iter_0000007/", rank, "/model_optim_rng.pt")));
        ASSERT_TRUE(f.ok()) << f.status().message();
        const PyValue* sd = (*f)->get("model");
        const bool last = p == pp - 1;
        EXPECT_EQ(sd->get("mtp.layers.1.final_layernorm.weight") != nullptr, last) << rank;
        EXPECT_EQ(sd->get("mtp.layers.0.eh_proj._extra_state") != nullptr, last) << rank;
        EXPECT_EQ(sd->get("mtp.layers.1.transformer_layer.mlp.linear_fc2._extra_state") != nullptr, last) << rank;
        EXPECT_NE(sd->get("embedding.word_embeddings.weight"), nullptr) << rank;  // first stage, and the MTP copy
        if (!last) continue;
        const PyValue* e = sd->get("mtp.layers.0.eh_proj.weight");
        ASSERT_TRUE(e != nullptr) << rank;
        const Tensor& piece = e->data;
        ASSERT_EQ(piece.shape(), (Shape{32 / tp, 64})) << rank;
        EXPECT_EQ(0, std::memcmp(piece.raw(), eh.data<float>() + t * (32 / tp) * 64, piece.nbytes())) << rank;
      }
  }
}

// Tied embeddings at PP 2: the last stage holds the embedding (the MTP layers') and output_layer copies,
// read back as the one embedding.
TEST(MegatronMtpCheckpoint, TiedEmbeddingsRoundTripAtPp2) {
  auto m = read_megatron_checkpoint(fixture("mtp/tp1"));
  ASSERT_TRUE(m.ok());
  m->model.untie_embeddings_and_output_weights = false;
  m->tensors.erase("output_layer.weight");
  TempDir tmp;
  MegatronSaveOptions o;
  o.save_dir = tmp.file("mg");
  o.pipeline_parallel = 2;
  ASSERT_TRUE(write_fixture_as_megatron(m.value(), o).ok());
  auto f = read_torch_file(tmp.file("mg/iter_0000007/mp_rank_00_001/model_optim_rng.pt"));
  ASSERT_TRUE(f.ok());
  const PyValue* sd = (*f)->get("model");
  ASSERT_TRUE(sd->get("embedding.word_embeddings.weight") && sd->get("output_layer.weight"));
  EXPECT_TRUE(same_tensor(sd->get("embedding.word_embeddings.weight")->data,
                          m->tensors.at("embedding.word_embeddings.weight")));
  auto back = read_megatron_checkpoint(tmp.file("mg"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->tensors.size(), m->tensors.size());
  for (const auto& [name, t] : m->tensors) EXPECT_TRUE(same_tensor(t, back->tensors.at(name))) << name;
}

// Megatron main's torch format names the inner layer mtp_model_layer: read as transformer_layer.
TEST(MegatronMtpCheckpoint, ReadsMegatronMainsMtpModelLayerNames) {
  TempDir tmp;
  auto root = read_torch_file(fixture("mtp/tp1/iter_0000007/mp_rank_00/model_optim_rng.pt"));
  ASSERT_TRUE(root.ok());
  PyValue* model = const_cast<PyValue*>((*root)->get("model"));
  int renamed = 0;
  for (auto& [k, v] : model->entries)
    if (const size_t at = k->s.find(".transformer_layer."); at != std::string::npos) {
      k = PyValue::str(k->s.substr(0, at) + ".mtp_model_layer." + k->s.substr(at + 19));
      ++renamed;
    }
  EXPECT_EQ(renamed, 2 * 12);  // per MTP layer its inner layer's 8 tensors and 4 `_extra_state` entries
  fs::create_directories(tmp.file("c/iter_0000007/mp_rank_00"));
  ASSERT_TRUE(write_torch_file(tmp.file("c/iter_0000007/mp_rank_00/model_optim_rng.pt"), **root).ok());
  std::ofstream(tmp.file("c/latest_checkpointed_iteration.txt")) << "7";
  auto a = read_megatron_checkpoint(fixture("mtp/tp1"));
  auto b = read_megatron_checkpoint(tmp.file("c"));
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (const auto& [name, t] : a->tensors) {
    ASSERT_TRUE(b->tensors.count(name)) << name;
    EXPECT_TRUE(same_tensor(t, b->tensors.at(name))) << name;
  }
}

TEST(MegatronMtpCheckpointErrors, RefusesMoeMtpLayersAndStrayMtpTensors) {
  auto m = read_megatron_checkpoint(fixture("mtp/tp1"));
  ASSERT_TRUE(m.ok());
  MegatronSaveOptions o;
  o.save_dir = "unused";
  o.moe.num_experts = 4;
  Status s = write_megatron_checkpoint(o, m->model, {});
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("writing Megatron's torch format of a model with --mtp-num-layers 2 and --num-experts 4: "
                             "not supported yet"),
            std::string::npos)
      << s.message();
  TempDir tmp;
  o = MegatronSaveOptions();
  o.save_dir = tmp.file("mg");
  m->model.mtp_num_layers = 1;  // the files hold depths 0 and 1
  s = write_fixture_as_megatron(m.value(), o);
  EXPECT_NE(s.message().find("tensor 'mtp.layers.1.eh_proj.weight': expected MTP layers 0 .. 0 (--mtp-num-layers 1)"),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace gale
