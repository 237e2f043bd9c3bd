// Megatron-LM's own checkpoints (legacy torch format) against Megatron's recorded logits.
//
// tests/data/megatron/ (tools/reference/megatron_ckpt_reference.py) holds a tiny GPT model built
// with Megatron core_v0.12.1's GPTModel (local spec: 4 layers, hidden 32, 4 heads in 2 query
// groups, SwiGLU, LayerNorm, RoPE, untied output layer, vocabulary 50 padded to 64) saved at TP1
// (tp1/) and cut into TP2 x PP2 shards as Megatron's layers split them (tp2pp2/), with the logits
// and per-token losses Megatron's forward computed. Reading either into Gale's model must
// reproduce those logits within 1e-4 (fp32 on both sides over 8 tokens; the two forwards differ
// only in summation order: 2.4e-6 measured); the two layouts must give identical tensors; Gale ->
// Megatron at TP2 x PP2 must give back, rank for rank, the fixture's state dicts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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
#include "train/checkpoint_args.h"
#include "train/hf_convert.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_fixture.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using testing_util::TempDir;
using namespace megatron_fixture;
namespace fs = std::filesystem;

TEST(MegatronCheckpoint, Tp1ReproducesMegatronsLogits) {
  auto m = read_megatron_checkpoint(fixture("tp1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->iteration, 7);
  EXPECT_EQ(m->checkpoint_version, 3.0);
  EXPECT_EQ(m->consumed_train_samples, 56);
  EXPECT_EQ(m->vocab_size, 50);
  EXPECT_EQ(m->model.padded_vocab_size, 64);
  EXPECT_EQ(m->model.num_query_groups, 2);
  EXPECT_TRUE(m->model.swiglu);
  EXPECT_EQ(m->tensors.size(), 36u);
  auto lm = build_model(m.value());
  const Comparison c = compare(*lm->model, read_reference());
  EXPECT_LT(c.max_logit_diff, kLogitTolerance);
  EXPECT_LT(c.max_loss_diff, kLogitTolerance);
}

TEST(MegatronCheckpoint, Tp2Pp2ShardsMergeIntoTheTp1Tensors) {
  auto a = read_megatron_checkpoint(fixture("tp1"));
  auto b = read_megatron_checkpoint(fixture("tp2pp2"));
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  EXPECT_EQ(b->tensor_parallel, 2);
  EXPECT_EQ(b->pipeline_parallel, 2);
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (const auto& [name, t] : a->tensors) {
    ASSERT_TRUE(b->tensors.count(name)) << name;
    EXPECT_TRUE(same_tensor(t, b->tensors.at(name))) << name;
  }
  auto lm = build_model(b.value());
  const Comparison c = compare(*lm->model, read_reference());
  EXPECT_LT(c.max_logit_diff, kLogitTolerance);
}

// Virtual pipeline chunks ('model0', 'model1') in Megatron's interleaved layer order.
TEST(MegatronCheckpoint, VirtualPipelineChunksMergeInMegatronsLayerOrder) {
  auto a = read_megatron_checkpoint(fixture("tp1"));
  auto b = read_megatron_checkpoint(fixture("pp2vp2"));
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  EXPECT_EQ(b->pipeline_parallel, 2);
  EXPECT_EQ(b->virtual_chunks, 2);
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (const auto& [name, t] : a->tensors) {
    ASSERT_TRUE(b->tensors.count(name)) << name;
    EXPECT_TRUE(same_tensor(t, b->tensors.at(name))) << name;
  }
}

// The golden comparison sees a wrong merge: SwiGLU's fc1 concatenated rank by rank (each rank's
// [gate; up] kept together, the layout a plain column-parallel merge would give) changes the logits.
TEST(MegatronCheckpoint, GoldenComparisonDetectsAPlainFc1Merge) {
  auto b = read_megatron_checkpoint(fixture("tp2pp2"));
  ASSERT_TRUE(b.ok());
  MegatronCheckpoint m = std::move(b).value();
  Tensor& fc1 = m.tensors.at("decoder.layers.1.mlp.linear_fc1.weight");  // [2F, H] = [g0 g1 u0 u1]
  const int64_t quarter = fc1.size(0) / 4, row = fc1.size(1) * 4;
  Tensor wrong = fc1.clone();  // [g0 u0 g1 u1]
  char* w = static_cast<char*>(wrong.raw());
  const char* f = static_cast<const char*>(fc1.raw());
  std::memcpy(w + 1 * quarter * row, f + 2 * quarter * row, quarter * row);
  std::memcpy(w + 2 * quarter * row, f + 1 * quarter * row, quarter * row);
  fc1 = wrong;
  auto lm = build_model(m);
  EXPECT_GT(compare(*lm->model, read_reference()).max_logit_diff, 100 * kLogitTolerance);
}

// Gale -> Megatron at TP2 x PP2 writes, rank for rank, the state dicts of the fixture (same keys,
// the `_extra_state` None entries included, same bytes), with checkpoint_version 3.0, the iteration and the args Megatron checks.
TEST(MegatronCheckpoint, WritesTheFixturesShardsAtTp2Pp2) {
  TempDir tmp;
  auto m = read_megatron_checkpoint(fixture("tp1"));
  ASSERT_TRUE(m.ok());
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : m->tensors) tensors.push_back({name, t});
  MegatronSaveOptions o;
  o.save_dir = tmp.file("mg");
  o.tensor_parallel = 2;
  o.pipeline_parallel = 2;
  o.iteration = 7;
  o.vocab_size = 50;
  Status s = write_megatron_checkpoint(o, m->model, tensors);
  ASSERT_TRUE(s.ok()) << s.message();
  for (const char* rank : {"mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"}) {
    auto mine = read_torch_file(tmp.file(str_cat("mg/iter_0000007/", rank, "/model_optim_rng.pt")));
    auto theirs = read_torch_file(fixture(str_cat("tp2pp2/iter_0000007/", rank, "/model_optim_rng.pt")));
    ASSERT_TRUE(mine.ok() && theirs.ok()) << mine.status().message();
    const PyValue* a = (*mine)->get("model");
    const PyValue* b = (*theirs)->get("model");
    ASSERT_TRUE(a && b);
    ASSERT_EQ(a->entries.size(), b->entries.size()) << rank;
    for (const auto& [k, v] : b->entries) {
      const PyValue* x = a->get(k->s);
      ASSERT_TRUE(x != nullptr) << rank << " " << k->s;
      ASSERT_EQ(x->kind, v->kind) << rank << " " << k->s;  // tensors, and the linear layers' _extra_state None
      if (v->kind == PyValue::kTensor) EXPECT_TRUE(same_tensor(x->data, v->data)) << rank << " " << k->s;
    }
    EXPECT_EQ((*mine)->get("checkpoint_version")->f, 3.0);
    EXPECT_EQ((*mine)->get("iteration")->i, 7);
    const PyValue* args = (*mine)->get("args");
    ASSERT_TRUE(args && args->kind == PyValue::kObject);
    EXPECT_EQ(args->s, "argparse.Namespace");
    for (const char* key : {"num_layers", "hidden_size", "num_attention_heads", "padded_vocab_size",
                            "tensor_model_parallel_size", "pipeline_model_parallel_size", "make_vocab_size_divisible_by"})
      EXPECT_EQ(args->attr(key)->i, (*theirs)->get("args")->attr(key)->i) << key;
    // Megatron-Core's QK-clip args (MuonClip), with its defaults here.
    ASSERT_TRUE(args->attr("qk_clip") && args->attr("log_max_attention_logit"));
    EXPECT_EQ(args->attr("qk_clip")->kind, PyValue::kBool);
    EXPECT_FALSE(args->attr("qk_clip")->b);
    EXPECT_FALSE(args->attr("log_max_attention_logit")->b);
    EXPECT_EQ(args->attr("qk_clip_alpha")->f, 0.5);
    EXPECT_EQ(args->attr("qk_clip_threshold")->f, 100.0);
    ASSERT_TRUE(args->attr("qk_l2_norm"));  // Megatron main's TransformerConfig field, False here
    EXPECT_EQ(args->attr("qk_l2_norm")->kind, PyValue::kBool);
    EXPECT_FALSE(args->attr("qk_l2_norm")->b);
  }
  std::ifstream tracker(tmp.file("mg/latest_checkpointed_iteration.txt"));
  std::string it;
  tracker >> it;
  EXPECT_EQ(it, "7");
  // And it reads back.
  auto back = read_megatron_checkpoint(tmp.file("mg"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  for (const auto& [name, t] : m->tensors) EXPECT_TRUE(same_tensor(t, back->tensors.at(name))) << name;
}

// --qk-l2-norm is written into Megatron's args and read back from them.
TEST(MegatronCheckpoint, RecordsQkL2Norm) {
  TempDir tmp;
  auto m = read_megatron_checkpoint(fixture("tp1"));
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE(m->model.qk_l2_norm);
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : m->tensors) tensors.push_back({name, t});
  MegatronSaveOptions o;
  o.save_dir = tmp.file("mg");
  o.iteration = 3;
  o.vocab_size = 50;
  m->model.qk_l2_norm = true;
  Status s = write_megatron_checkpoint(o, m->model, tensors);
  ASSERT_TRUE(s.ok()) << s.message();
  auto file = read_torch_file(tmp.file("mg/iter_0000003/mp_rank_00/model_optim_rng.pt"));
  ASSERT_TRUE(file.ok()) << file.status().message();
  const PyValue* args = (*file)->get("args");
  ASSERT_TRUE(args && args->attr("qk_l2_norm"));
  EXPECT_TRUE(args->attr("qk_l2_norm")->b);
  auto back = read_megatron_checkpoint(tmp.file("mg"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->model.qk_l2_norm);
}

// Megatron's --bf16 runs save bf16 parameters: they are merged and cut in bf16, bit for bit, and
// stored as BFloat16Storage.
TEST(MegatronCheckpoint, Bf16TensorsStayBf16BothWays) {
  TempDir tmp;
  auto m = read_megatron_checkpoint(fixture("tp1"));
  ASSERT_TRUE(m.ok());
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : m->tensors) {
    Tensor b = Tensor::empty(t.shape(), DType::kBF16);
    for (int64_t i = 0; i < t.numel(); ++i) b.data<bf16>()[i] = float_to_bf16(t.data<float>()[i]);
    tensors.push_back({name, b});
  }
  MegatronSaveOptions o;
  o.save_dir = tmp.file("mg");
  o.tensor_parallel = 2;
  o.iteration = 3;
  o.vocab_size = 50;
  ASSERT_TRUE(write_megatron_checkpoint(o, m->model, tensors).ok());
  auto back = read_megatron_checkpoint(tmp.file("mg"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->iteration, 3);
  for (const NamedTensor& t : tensors) {
    ASSERT_TRUE(back->tensors.count(t.name)) << t.name;
    EXPECT_EQ(back->tensors.at(t.name).dtype(), DType::kBF16) << t.name;
    EXPECT_TRUE(same_tensor(t.tensor, back->tensors.at(t.name))) << t.name;
  }
  auto raw = read_torch_file(tmp.file("mg/iter_0000003/mp_rank_01/model_optim_rng.pt"));
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ((*raw)->get("model")->get("output_layer.weight")->items[0]->storage_type, "BFloat16Storage");
  // A bf16 Megatron checkpoint converts to a bf16 Gale checkpoint whose f32 reads equal the values.
  ASSERT_TRUE(save_megatron_as_gale(back.value(), tmp.file("gale"), "mg").ok());
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  const Tensor& qkv = back->tensors.at("decoder.layers.2.self_attention.linear_qkv.weight");
  Tensor f = r->read("decoder.layers.2.self_attention.linear_qkv.weight", qkv.shape()).value();
  for (int64_t i = 0; i < f.numel(); ++i) ASSERT_EQ(f.data<float>()[i], bf16_to_float(qkv.data<bf16>()[i])) << i;
}

TEST(MegatronCheckpoint, DetectsTheFormats) {
  EXPECT_EQ(detect_checkpoint_format(fixture("tp1")).value(), CheckpointFormat::kMegatronTorch);
  TempDir tmp;
  EXPECT_EQ(detect_checkpoint_format(tmp.path()).value(), CheckpointFormat::kNone);
  auto m = read_megatron_checkpoint(fixture("tp1"));
  ASSERT_TRUE(save_megatron_as_gale(m.value(), tmp.file("gale"), "fixture").ok());
  EXPECT_EQ(detect_checkpoint_format(tmp.file("gale")).value(), CheckpointFormat::kGale);
}

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(MegatronCheckpointErrors, TorchDistWithoutCommonPtIsRefusedNamingTheFile) {
  TempDir tmp;
  write(tmp.file("ckpt/latest_checkpointed_iteration.txt"), "100");
  write(tmp.file("ckpt/iter_0000100/.metadata"), "x");
  write(tmp.file("ckpt/iter_0000100/metadata.json"), R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})");
  write(tmp.file("ckpt/iter_0000100/__0_0.distcp"), "x");
  EXPECT_EQ(detect_checkpoint_format(tmp.file("ckpt")).value(), CheckpointFormat::kMegatronTorchDist);
  auto m = read_megatron_checkpoint(tmp.file("ckpt"));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), tmp.file("ckpt/iter_0000100/common.pt") +
                                      ": missing; Megatron's torch_dist checkpoint keeps args and iteration there");
}

TEST(MegatronCheckpointErrors, MissingRankFileAndBadTracker) {
  TempDir tmp;
  fs::copy(fixture("tp2pp2"), tmp.file("c"), fs::copy_options::recursive);
  fs::remove_all(tmp.file("c/iter_0000007/mp_rank_01_001"));
  auto m = read_megatron_checkpoint(tmp.file("c"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor-parallel rank 1, pipeline rank 1 (mp_rank_01_001) is missing"),
            std::string::npos)
      << m.status().message();
  write(tmp.file("c/latest_checkpointed_iteration.txt"), "seven");
  m = read_megatron_checkpoint(tmp.file("c"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("expected an iteration number or 'release', found 'seven'"), std::string::npos)
      << m.status().message();
}

TEST(MegatronCheckpointErrors, TruncatedRankFileNamesTheFile) {
  TempDir tmp;
  fs::copy(fixture("tp1"), tmp.file("c"), fs::copy_options::recursive);
  const std::string pt = tmp.file("c/iter_0000007/mp_rank_00/model_optim_rng.pt");
  fs::resize_file(pt, fs::file_size(pt) / 2);
  auto m = read_megatron_checkpoint(tmp.file("c"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find(pt + ": expected a zip archive"), std::string::npos) << m.status().message();
}

// A tensor Gale's dense model has no place for (here a MoE router) is refused, naming the file and tensor.
TEST(MegatronCheckpointErrors, UnknownTensorsAreRefused) {
  TempDir tmp;
  fs::create_directories(tmp.file("c/iter_0000007/mp_rank_00"));
  auto root = read_torch_file(fixture("tp1/iter_0000007/mp_rank_00/model_optim_rng.pt"));
  ASSERT_TRUE(root.ok());
  PyValue* model = const_cast<PyValue*>((*root)->get("model"));
  model->set("decoder.layers.0.self_attention.linear_q_down_proj.weight", PyValue::tensor(Tensor::zeros({4, 32})));
  const std::string pt = tmp.file("c/iter_0000007/mp_rank_00/model_optim_rng.pt");
  ASSERT_TRUE(write_torch_file(pt, **root).ok());
  write(tmp.file("c/latest_checkpointed_iteration.txt"), "7");
  auto m = read_megatron_checkpoint(tmp.file("c"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find(pt + ": tensor 'decoder.layers.0.self_attention.linear_q_down_proj.weight' in "
                                           "'model' has no place in Gale's GPT model"),
            std::string::npos)
      << m.status().message();
}

TEST(MegatronCheckpointErrors, WriteChecksTheTargetSizes) {
  auto m = read_megatron_checkpoint(fixture("tp1"));
  ASSERT_TRUE(m.ok());
  MegatronSaveOptions o;
  o.save_dir = "unused";
  o.pipeline_parallel = 3;
  Status s = write_megatron_checkpoint(o, m->model, {});
  EXPECT_NE(s.message().find("--target-pipeline-parallel-size 3: the 4 layers do not split evenly"), std::string::npos)
      << s.message();
  o.pipeline_parallel = 1;
  o.tensor_parallel = 4;  // 2 query groups
  s = write_megatron_checkpoint(o, m->model, {});
  EXPECT_NE(s.message().find("query groups (2)"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace gale
