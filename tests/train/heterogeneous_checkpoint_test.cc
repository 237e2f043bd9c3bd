// Heterogeneous layers in checkpoints: the JSON recorded in the args section, the layers' own
// tensors saved with their shapes, and a resumed run continuing bit for bit.
#include <gtest/gtest.h>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/temp_dir.h"
#include "testing_checkpoint_run.h"

namespace gale {
namespace {

const char* kBlocks = R"({"block_configs": [
  {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_hidden_size": 48}},
  {"attention": {"no_op": true}, "ffn": {"replace_with_linear": true}},
  {"attention": {"replace_with_linear": true}, "ffn": {"no_op": true}}]})";

std::vector<std::string> flags(const std::string& dir, const std::vector<std::string>& extra = {}) {
  return testing::join({{"--num-layers", "3", "--hidden-size", "32", "--num-attention-heads", "4", "--group-query-attention",
          "--num-query-groups", "2", "--seq-length", "8", "--max-position-embeddings", "8", "--micro-batch-size", "2",
          "--global-batch-size", "4", "--train-iters", "4", "--lr", "1e-3", "--mock-data", "--eval-iters", "0",
          "--log-interval", "1000", "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
          "--heterogeneous-layers-config-encoded-json", kBlocks, "--save", dir, "--load", dir, "--save-interval", "100"}, extra});
}

TEST(HeterogeneousCheckpoint, RecordsTheLayersAndResumesBitForBit) {
  testing_util::TempDir dir;
  testing::CheckpointRun first(flags(dir.path()), make_self_communicator("world"), testing::kTinyVocab);
  first.train(2);
  ASSERT_TRUE(first.save().ok());
  const std::vector<double> continued = first.train(2);

  StatusOr<CheckpointReader> reader = CheckpointReader::open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  StatusOr<nlohmann::json> args = reader.value().section("args");
  ASSERT_TRUE(args.ok()) << args.status().message();
  EXPECT_EQ(args.value().value("heterogeneous_layers_config_encoded_json", ""), kBlocks);
  StatusOr<Shape> qkv = reader.value().global_shape("decoder.layers.0.self_attention.linear_qkv.weight");
  ASSERT_TRUE(qkv.ok());
  EXPECT_EQ(qkv.value(), (Shape{(4 + 2 * 1) * 8, 32}));  // one query group of 4 heads of 8
  EXPECT_TRUE(reader.value().has_tensor("decoder.layers.1.mlp.weight"));
  EXPECT_TRUE(reader.value().has_tensor("decoder.layers.2.self_attention.weight"));
  EXPECT_FALSE(reader.value().has_tensor("decoder.layers.2.pre_mlp_layernorm.weight"));

  testing::CheckpointRun resumed(flags(dir.path()), make_self_communicator("world"), testing::kTinyVocab);
  ASSERT_TRUE(resumed.load().ok());
  EXPECT_EQ(resumed.train(2), continued);
  EXPECT_EQ(resumed.values(), first.values());
}

// With an MTP layer (the flags' 2 query groups and FFN): its tensors saved with the model-wide
// shapes, and the resumed run continues bit for bit, MTP loss included.
TEST(HeterogeneousCheckpoint, MtpLayerResumesBitForBit) {
  testing_util::TempDir dir;
  const std::vector<std::string> mtp = {"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3"};
  testing::CheckpointRun first(flags(dir.path(), mtp), make_self_communicator("world"), testing::kTinyVocab);
  first.train(2);
  ASSERT_TRUE(first.save().ok());
  const std::vector<double> continued = first.train(2);
  const std::vector<std::vector<double>> continued_mtp(first.mtp_losses.end() - 2, first.mtp_losses.end());

  StatusOr<CheckpointReader> reader = CheckpointReader::open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  StatusOr<Shape> qkv = reader.value().global_shape("mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight");
  ASSERT_TRUE(qkv.ok());
  EXPECT_EQ(qkv.value(), (Shape{(4 + 2 * 2) * 8, 32}));
  EXPECT_TRUE(reader.value().has_tensor("mtp.layers.0.transformer_layer.mlp.linear_fc1.weight"));

  testing::CheckpointRun resumed(flags(dir.path(), mtp), make_self_communicator("world"), testing::kTinyVocab);
  ASSERT_TRUE(resumed.load().ok());
  EXPECT_EQ(resumed.train(2), continued);
  EXPECT_EQ(resumed.mtp_losses, continued_mtp);
  EXPECT_EQ(resumed.values(), first.values());
}

}  // namespace
}  // namespace gale
