// Megatron's torch_dist / torch_dcp checkpoints (saved by Megatron itself) against torch's listing and Megatron's logits.
//
// tests/data/megatron/torch_dist_tp1, torch_dist_tp2pp2, torch_dcp_tp1 and torch_dist_bf16_layers
// (tools/reference/megatron_torch_dist_reference.py) hold the weights of the legacy tp1/ fixture
// (the last in bf16, one key per layer),
// saved by Megatron core_v0.12.1 with dist_checkpointing.save (one gloo process, with an SGD
// optimizer's momentum; and four at TP 2 x PP 2) and with torch.distributed.checkpoint.save
// (--ckpt-format torch_dcp); torch_dist.json is
// torch's own reading of each .metadata (keys, kinds, global shapes, dtypes, chunk counts). Gale's
// DCP reader must list the same; the Megatron reader must give bit for bit the tp1 tensors (so the
// source layout does not matter) and Megatron's logits; broken checkpoints fail naming what is wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/dcp_reader.h"
#include "ckpt/temp_dir.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_fixture.h"

namespace gale {
namespace {

using testing_util::TempDir;
using namespace megatron_fixture;
namespace fs = std::filesystem;

const char* const kDirs[] = {"torch_dist_tp1", "torch_dist_tp2pp2", "torch_dcp_tp1"};

TEST(DcpReader, ListsWhatTorchReadsFromTheMetadata) {
  std::ifstream in(fixture("torch_dist.json"));
  const nlohmann::json want = nlohmann::json::parse(in);
  for (const char* dir : {"torch_dist_tp1", "torch_dist_tp2pp2", "torch_dcp_tp1", "torch_dist_bf16_layers"}) {
    SCOPED_TRACE(dir);
    auto c = DcpCheckpoint::open(fixture(str_cat(dir, "/iter_0000007")));
    ASSERT_TRUE(c.ok()) << c.status().message();
    nlohmann::json got = nlohmann::json::object();
    for (const auto& [key, info] : c->tensors()) {
      got[key] = {{"kind", "tensor"}, {"shape", info.shape}, {"dtype", info.torch_dtype},
                  {"chunks", info.chunks.size()}};
      EXPECT_TRUE(info.dtype_known) << key;
      EXPECT_EQ(info.dtype, std::string(dir) == "torch_dist_bf16_layers" ? DType::kBF16 : DType::kF32) << key;
    }
    for (const auto& [key, chunk] : c->objects()) got[key] = {{"kind", "bytes"}};
    EXPECT_EQ(got, want[dir]["keys"]);
  }
}

// --bf16 weights saved with one key per layer (Megatron's non-homogeneous layout): the tp1 tensors
// rounded to bf16, bit for bit.
TEST(MegatronDistCheckpoint, Bf16WeightsWithOneKeyPerLayer) {
  auto want = read_megatron_checkpoint(fixture("tp1"));
  auto m = read_megatron_checkpoint(fixture("torch_dist_bf16_layers"));
  ASSERT_TRUE(want.ok() && m.ok()) << m.status().message();
  auto c = DcpCheckpoint::open(fixture("torch_dist_bf16_layers/iter_0000007"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->tensors().count("decoder.layers.3.mlp.linear_fc1.weight"), 1u);
  ASSERT_EQ(m->tensors.size(), want->tensors.size());
  for (const auto& [name, t] : want->tensors) {
    ASSERT_TRUE(m->tensors.count(name)) << name;
    const Tensor& got = m->tensors.at(name);
    ASSERT_EQ(got.dtype(), DType::kBF16) << name;
    ASSERT_EQ(got.shape(), t.shape()) << name;
    const float* f = t.data<float>();
    const uint16_t* b = static_cast<const uint16_t*>(got.raw());
    int64_t differ = 0;
    for (int64_t k = 0; k < t.numel(); ++k) differ += b[k] != float_to_bf16(f[k]).bits;
    EXPECT_EQ(differ, 0) << name;
  }
}

// Every layout gives the legacy tp1 fixture's tensors bit for bit, and Megatron's logits;
// torch_dist_tp1's optimizer state (SGD momentum buffers) is skipped.
TEST(MegatronDistCheckpoint, EveryLayoutGivesTheTp1TensorsAndMegatronsLogits) {
  auto want = read_megatron_checkpoint(fixture("tp1"));
  ASSERT_TRUE(want.ok()) << want.status().message();
  auto with_optimizer = DcpCheckpoint::open(fixture("torch_dist_tp1/iter_0000007"));
  ASSERT_TRUE(with_optimizer.ok());
  EXPECT_EQ(with_optimizer->tensors().count("optimizer.state.momentum_buffer.decoder.layers.mlp.linear_fc1.weight"), 1u);
  for (const char* dir : kDirs) {
    SCOPED_TRACE(dir);
    auto m = read_megatron_checkpoint(fixture(dir));
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->format, std::string(dir).rfind("torch_dist", 0) == 0 ? CheckpointFormat::kMegatronTorchDist
                                                                      : CheckpointFormat::kMegatronTorchDcp);
    EXPECT_EQ(m->iteration, 7);
    EXPECT_EQ(m->checkpoint_version, 3.0);
    EXPECT_EQ(m->consumed_train_samples, 56);
    EXPECT_EQ(m->vocab_size, 50);
    EXPECT_EQ(m->model.num_layers, 4);
    EXPECT_EQ(m->model.padded_vocab_size, 64);
    EXPECT_EQ(m->tensor_parallel, std::string(dir) == "torch_dist_tp2pp2" ? 2 : 1);
    ASSERT_EQ(m->tensors.size(), want->tensors.size());
    for (const auto& [name, t] : want->tensors) {
      ASSERT_TRUE(m->tensors.count(name)) << name;
      EXPECT_TRUE(same_tensor(t, m->tensors.at(name))) << name;
    }
    auto lm = build_model(m.value());
    const Comparison c = compare(*lm->model, read_reference());
    EXPECT_LT(c.max_logit_diff, kLogitTolerance);
    EXPECT_LT(c.max_loss_diff, kLogitTolerance);
  }
}

TEST(MegatronDistCheckpoint, ArgsForUseCheckpointArgs) {
  for (const char* dir : kDirs) {
    std::string where;
    auto a = read_megatron_args(fixture(dir), kUnset, &where);
    ASSERT_TRUE(a.ok()) << a.status().message();
    EXPECT_EQ((*a)["num_layers"], 4) << dir;
    EXPECT_EQ((*a)["num_query_groups"], 2) << dir;
    EXPECT_NE(where.find(std::string(dir).rfind("torch_dist", 0) == 0 ? "/common.pt (args)" : "/.metadata (args)"),
              std::string::npos)
        << where;
  }
}

// A copy of a fixture whose .metadata has every `from` replaced by `to` (same length).
std::string patched_copy(const TempDir& tmp, const char* dir, const std::string& from, const std::string& to) {
  fs::copy(fixture(dir), tmp.file("c"), fs::copy_options::recursive);
  const std::string path = tmp.file("c/iter_0000007/.metadata");
  std::string bytes = testing_util::read_bytes(path);
  EXPECT_EQ(from.size(), to.size());
  size_t n = 0;
  for (size_t at; (at = bytes.find(from)) != std::string::npos; ++n) bytes.replace(at, from.size(), to);
  EXPECT_GT(n, 0u) << from;
  testing_util::write_bytes(path, bytes);
  return tmp.file("c");
}

TEST(MegatronDistCheckpointErrors, MissingOrTruncatedDistcpFile) {
  TempDir tmp;
  fs::copy(fixture("torch_dist_tp1"), tmp.file("c"), fs::copy_options::recursive);
  fs::remove(tmp.file("c/iter_0000007/__0_1.distcp"));
  auto m = read_megatron_checkpoint(tmp.file("c"));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find(tmp.file("c/iter_0000007/__0_1.distcp") + ": cannot open the file (holds '"),
            std::string::npos)
      << m.status().message();
  testing_util::write_bytes(tmp.file("c/iter_0000007/__0_1.distcp"), "short");
  m = read_megatron_checkpoint(tmp.file("c"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("__0_1.distcp: '"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("but the file holds 5"), std::string::npos) << m.status().message();
  fs::remove(tmp.file("c/iter_0000007/common.pt"));
  m = read_megatron_checkpoint(tmp.file("c"));
  EXPECT_EQ(m.status().message(), tmp.file("c/iter_0000007/common.pt") +
                                      ": missing; Megatron's torch_dist checkpoint keeps args and iteration there");
}

TEST(MegatronDistCheckpointErrors, UnsupportedDtypeIsNamed) {
  TempDir tmp;
  const std::string dir = patched_copy(tmp, "torch_dist_tp1", "float32", "complex");
  auto m = read_megatron_checkpoint(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("' has dtype torch.complex: not supported yet"), std::string::npos)
      << m.status().message();
}

TEST(MegatronDistCheckpointErrors, KeyWithoutAPlaceInGalesModelIsNamed) {
  TempDir tmp;
  const std::string dir = patched_copy(tmp, "torch_dist_tp1", "output_layer.weight", "output_lay3r.weight");
  auto m = read_megatron_checkpoint(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find(dir + "/iter_0000007: tensor 'output_lay3r.weight' in 'model' has no place in "
                                      "Gale's GPT model"),
            std::string::npos)
      << m.status().message();
}

TEST(MegatronDistCheckpointErrors, AChunkOutsideItsFile) {
  TempDir tmp;
  fs::copy(fixture("torch_dcp_tp1"), tmp.file("c"), fs::copy_options::recursive);
  auto c = DcpCheckpoint::open(tmp.file("c/iter_0000007"));
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->tensors().at("model.decoder.layers.0.mlp.linear_fc2.weight").shape, (Shape{32, 48}));
  // A chunk recorded past the end of its (cut) file: the byte range is checked before reading.
  DcpChunk chunk = c->tensors().at("model.decoder.final_layernorm.weight").chunks.at(0);
  fs::resize_file(tmp.file("c/iter_0000007/" + chunk.file), static_cast<uintmax_t>(chunk.offset));
  auto t = c->read_tensor("model.decoder.final_layernorm.weight");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("'model.decoder.final_layernorm.weight' is recorded at bytes ["),
            std::string::npos)
      << t.status().message();
}

// torch_dcp keeps one rank's local tensors per key: a checkpoint saved at TP 2 is refused, naming the sizes.
TEST(MegatronDistCheckpointErrors, ATorchDcpSavedAtTensorParallelTwoIsRefused) {
  TempDir tmp;
  fs::copy(fixture("torch_dcp_tp1"), tmp.file("c"), fs::copy_options::recursive);
  const std::string path = tmp.file("c/iter_0000007/__0_0.distcp");  // args.tensor_model_parallel_size 1 -> 2
  std::string bytes = testing_util::read_bytes(path);
  const std::string from = std::string("tensor_model_parallel_sizeq\x1fK\x01", 30);
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos);
  bytes[at + from.size() - 1] = 2;
  testing_util::write_bytes(path, bytes);
  auto m = read_megatron_checkpoint(tmp.file("c"));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find(": a torch_dcp checkpoint saved at tensor-parallel size 2 x pipeline-parallel "
                                      "size 1: not supported"),
            std::string::npos)
      << m.status().message();
}

TEST(MegatronDistCheckpointErrors, ATorchDcpDirectoryWithoutArgsIsRefused) {
  // A torch_dist directory without metadata.json reads as torch_dcp, whose args are a DCP object.
  TempDir tmp;
  fs::copy(fixture("torch_dist_tp1"), tmp.file("c"), fs::copy_options::recursive);
  fs::remove(tmp.file("c/iter_0000007/metadata.json"));
  EXPECT_EQ(detect_checkpoint_format(tmp.file("c")).value(), CheckpointFormat::kMegatronTorchDcp);
  auto m = read_megatron_checkpoint(tmp.file("c"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find(": expected Megatron's 'args' object, found none"), std::string::npos)
      << m.status().message();
}

}  // namespace
}  // namespace gale
