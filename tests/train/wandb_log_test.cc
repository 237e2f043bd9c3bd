// gale pretrain's W&B content: Megatron's wandb keys of the TensorBoard tags, 'samples vs steps',
// and the config (Megatron's vars(args)) from the command line.
#include "train/wandb_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "testing_wandb.h"

namespace gale {
namespace {

TEST(WandbLog, KeysOfTensorBoardTagsAreMegatrons) {
  for (const char* tag : {"learning-rate", "lm loss", "loss-scale", "grad-norm", "batch-size", "world-size",
                          "num-zeros", "params-norm", "iteration-time", "throughput", "lm loss validation",
                          "load_balancing_loss", "mtp_1 loss"})
    EXPECT_EQ(wandb_key_of_tensorboard_tag(tag), tag);
  for (const char* tag : {"lm loss vs samples", "learning-rate vs samples", "decoupled-learning-rate",
                          "mem-reserved-bytes", "forward-backward-time", "lm loss validation ppl"})
    EXPECT_EQ(wandb_key_of_tensorboard_tag(tag), "") << tag;
}

std::map<std::string, std::string> as_map(const WandbItems& items) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : items) EXPECT_TRUE(m.emplace(k, v).second) << "duplicate " << k;
  return m;
}

TEST(WandbLog, ConfigIsMegatronsVarsArgs) {
  const WandbItems items =
      wandb_config_items({"--num-layers", "2", "--lr=3e-3", "--use-flash-attn", "--no-position-embedding",
                          "--data-path", "1", "a", "--wandb-project", "p", "--mock-data", "--num-threads", "1"});
  const std::map<std::string, std::string> c = as_map(items);
  EXPECT_EQ(items.front().first, "num_layers");  // Megatron's order first
  EXPECT_EQ(c.at("num_layers"), "2");
  EXPECT_EQ(c.at("lr"), "0.003");
  EXPECT_EQ(c.at("use_flash_attn"), "true");
  EXPECT_EQ(c.at("add_position_embedding"), "false");
  EXPECT_EQ(c.at("data_path"), "[\"1\", \"a\"]");
  EXPECT_EQ(c.at("wandb_project"), "\"p\"");
  EXPECT_EQ(c.at("hidden_size"), "null");             // Megatron's default None
  EXPECT_EQ(c.at("tensor_model_parallel_size"), "1");  // Megatron's default 1
  EXPECT_EQ(c.at("wandb_exp_name"), "\"\"");
  EXPECT_EQ(c.at("num_threads"), "1");  // Gale's own flag
  EXPECT_GT(items.size(), 400u);
}

// "lm loss vs samples" (step = consumed samples) is Megatron's 'samples vs steps' at the iteration.
TEST(WandbLog, MirrorLogsSamplesVsSteps) {
  const std::string dir = ::testing::TempDir() + "gale_wandb_mirror_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  StatusOr<std::unique_ptr<WandbWriter>> w = WandbWriter::open(dir, "p", "e", {}, "mirror01");
  ASSERT_TRUE(w.ok()) << w.status().message();
  WandbScalarMirror mirror(w.value().get());
  mirror("lm loss", 2.0, 3);
  mirror("lm loss vs samples", 2.0, 12);
  mirror("forward-backward-time", 1.0, 3);
  mirror("grad-norm", 0.5, 3);
  const std::string file = w.value()->path();
  ASSERT_TRUE(w.value()->finish(0).ok());
  const auto rows = testing::wandb_history(file);
  ASSERT_EQ(rows.size(), 1u);
  const std::map<std::string, std::string>& row = rows.at(3);
  EXPECT_EQ(row.at("samples vs steps"), "12");
  EXPECT_EQ(row.at("lm loss"), "2");
  EXPECT_EQ(row.at("grad-norm"), "0.5");
  EXPECT_EQ(row.count("forward-backward-time"), 0u);
  EXPECT_EQ(row.count("lm loss vs samples"), 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
