// MindSpeed's LayerZeRO YAML file (--layerzero-config): the keys Gale reads, those it accepts
// without effect, and every refusal's message; and --layerzero's start-up rules.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "pretrain_cli.h"
#include "train/layerzero_config.h"

namespace gale {
namespace {

using testing::expect_one_line_error;
using testing::PretrainCli;

std::string message(const std::string& text) {
  StatusOr<LayerZeroConfig> c = parse_layerzero_config(text, "z.yaml");
  return c.ok() ? "ok" : c.status().message();
}

TEST(LayerZeroConfig, MindSpeedsExampleWithFp32) {
  StatusOr<LayerZeroConfig> c = parse_layerzero_config(
      "zero3_size: 8  # inside a node\n"
      "transformer_layers:\n"
      "  - mindspeed_mm.models.predictor.dits.sat_dit.VideoDiTBlock\n"
      "backward_prefetch: 'BACKWARD_PRE'\n"
      "param_dtype: \"fp32\"\n"
      "reduce_dtype: fp32\n"
      "forward_prefetch: True\n"
      "limit_all_gathers: True\n"
      "ignored_modules:\n"
      "offload_grads: False\n",
      "z.yaml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->zero3_size, 8);
  EXPECT_EQ(c->accepted_without_effect.size(), 4u);  // transformer_layers, both prefetches, limit_all_gathers
}

TEST(LayerZeroConfig, Refusals) {
  const std::string fp32 = "param_dtype: fp32\nreduce_dtype: fp32\n";
  EXPECT_EQ(message(fp32), "--layerzero-config z.yaml: zero3_size is missing: expected an integer ≥ 1");
  EXPECT_EQ(message("zero3_size: 0\n" + fp32), "--layerzero-config z.yaml: zero3_size: expected an integer ≥ 1, found '0'");
  EXPECT_EQ(message("zero3_size: two\n" + fp32),
            "--layerzero-config z.yaml: zero3_size: expected an integer ≥ 1, found 'two'");
  EXPECT_EQ(message("zero3_size: 2\nparam_dtype: bf16\nreduce_dtype: fp32\n"),
            "--layerzero-config z.yaml: param_dtype bf16: not supported yet (Gale's LayerZeRO runs in fp32; set "
            "param_dtype: fp32)");
  EXPECT_NE(message("zero3_size: 2\nparam_dtype: fp32\n").find("reduce_dtype fp16 (MindSpeed's default when absent): "
                                                               "not supported yet"),
            std::string::npos);
  EXPECT_NE(message("zero3_size: 2\n" + fp32 + "offload_grads: true\n").find("offload_grads true: not supported yet"),
            std::string::npos);
  EXPECT_NE(message("zero3_size: 2\n" + fp32 + "ignored_modules:\n  - ae\n").find("ignored_modules: not supported yet"),
            std::string::npos);
  EXPECT_NE(message("zero3_size: 2\n" + fp32 + "ckpt_load_path: /x\n").find("ckpt_load_path: not supported yet"),
            std::string::npos);
  EXPECT_NE(message("zero3_size: 2\n" + fp32 + "zero3_sizes: 2\n").find("unknown key zero3_sizes"), std::string::npos);
  EXPECT_NE(message("zero3_size: 2\n" + fp32 + "zero3_size: 4\n").find("key zero3_size given twice"),
            std::string::npos);
  EXPECT_NE(message("- a\n").find("a list item '- a' outside a list key"), std::string::npos);
  StatusOr<LayerZeroConfig> missing = read_layerzero_config("/nonexistent/z.yaml");
  EXPECT_EQ(missing.status().message(), "--layerzero-config /nonexistent/z.yaml: cannot read the file");
}

TEST(LayerZeroArgs, StartUpRules) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("gale_layerzero_" + std::to_string(::getpid()) + ".yaml")).string();
  {
    std::ofstream f(path);
    f << "zero3_size: 2\nparam_dtype: fp32\nreduce_dtype: fp32\n";
  }
  PretrainCli ok;
  ASSERT_TRUE(ok.parse_minimal({"--layerzero", "--layerzero-config", path, "--global-batch-size", "8"}, 4).ok());
  EXPECT_TRUE(ok.args.parallel.zero3());
  EXPECT_EQ(ok.args.parallel.layerzero_zero3_size, 2);
  expect_one_line_error({{"--layerzero"}, 2, "--layerzero needs --layerzero-config FILE.yaml"});
  expect_one_line_error({{"--layerzero-config", path}, 2, "configures LayerZeRO: expected --layerzero"});
  expect_one_line_error({{"--layerzero", "--layerzero-config", path, "--global-batch-size", "6"}, 3,
                         "zero3_size 2 must divide the data-parallel size 3"});
  expect_one_line_error({{"--layerzero", "--layerzero-config", path, "--bf16"}, 2,
                         "--layerzero with --bf16: not supported yet"});
  expect_one_line_error({{"--layerzero", "--layerzero-config", path, "--tensor-model-parallel-size", "2"}, 4,
                         "--layerzero with --tensor-model-parallel-size 2: not supported yet"});
  expect_one_line_error({{"--layerzero", "--layerzero-config", path, "--use-custom-fsdp",
                          "--data-parallel-sharding-strategy", "optim_grads_params"},
                         2, "both shard the model: expected one of them"});
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace gale
