// MindSpeed's FSDP2 YAML file (--fsdp2-config-path): the keys Gale reads, those it accepts without
// effect, every refusal's message (naming the file and the key); and --use-torch-fsdp2's start-up
// rules, with and without the file (Megatron's flag alone).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/fsdp2_config.h"

namespace gale {
namespace {

using testing::expect_one_line_error;
using testing::PretrainCli;

std::string message(const std::string& text) {
  StatusOr<Fsdp2Config> c = parse_fsdp2_config(text, "f.yaml");
  return c.ok() ? "ok" : c.status().message();
}

TEST(Fsdp2Config, DefaultsAreMegatrons) {
  StatusOr<Fsdp2Config> c = parse_fsdp2_config("# nothing\n", "f.yaml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->sharding_size, 0);  // the whole data-parallel group
  EXPECT_TRUE(c->wrap_embedding);
  EXPECT_TRUE(c->wrap_layers);
  EXPECT_FALSE(c->wrap_head);  // the root
  EXPECT_TRUE(c->reshard_after_forward);
  EXPECT_EQ(c->num_to_forward_prefetch, 0);
  EXPECT_TRUE(c->accepted_without_effect.empty());
}

TEST(Fsdp2Config, MindSpeedsKeys) {
  StatusOr<Fsdp2Config> c = parse_fsdp2_config(
      "sharding_size: 2  # inside a node\n"
      "sub_modules_to_wrap:\n"
      "  - megatron.core.transformer.transformer_layer.TransformerLayer\n"
      "  - megatron.core.models.common.embeddings.rotary_pos_embedding.RotaryEmbedding\n"
      "  - head\n"
      "reshard_after_forward: False\n"
      "param_dtype: fp32\n"
      "reduce_dtype: 'fp32'\n"
      "cast_forward_inputs: True\n"
      "offload_to_cpu: true\n"
      "pin_memory: true\n"
      "num_to_forward_prefetch: 2\n"
      "ignored_modules:\n"
      "recompute_modules:\n",
      "f.yaml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->sharding_size, 2);
  EXPECT_FALSE(c->wrap_embedding);
  EXPECT_TRUE(c->wrap_layers);
  EXPECT_TRUE(c->wrap_head);
  EXPECT_FALSE(c->reshard_after_forward);
  EXPECT_EQ(c->num_to_forward_prefetch, 2);
  EXPECT_EQ(c->accepted_without_effect, (std::vector<std::string>{"offload_to_cpu", "pin_memory"}));
  EXPECT_EQ(parse_fsdp2_config("sharding_size: auto\n", "f.yaml")->sharding_size, 0);
  EXPECT_EQ(c->param_dtype, "fp32");
  EXPECT_EQ(c->reduce_dtype, "fp32");
  EXPECT_EQ(c->output_dtype, "");
  StatusOr<Fsdp2Config> half = parse_fsdp2_config("param_dtype: bfloat16\nreduce_dtype: float32\n", "f.yaml");
  ASSERT_TRUE(half.ok()) << half.status().to_string();
  EXPECT_EQ(half->param_dtype, "bf16");
  EXPECT_EQ(half->reduce_dtype, "fp32");
}

// PyTorch's MixedPrecisionPolicy against --bf16: reduce_dtype defaults to param_dtype, --bf16 is
// param_dtype bf16 (Megatron's Float16Module), param_dtype bf16 needs --bf16, fp32 with it is refused.
TEST(Fsdp2Config, MixedPrecisionPolicy) {
  auto precision = [](const std::string& yaml, bool bf16) {
    Arguments a;
    a.parallel.fsdp2_config_path = "f.yaml";
    a.training.bf16 = bf16;
    StatusOr<Fsdp2Config> c = parse_fsdp2_config(yaml, "f.yaml");
    EXPECT_TRUE(c.ok());
    return fsdp2_precision(*c, a);
  };
  auto flags = [&](const std::string& yaml, bool bf16) {
    StatusOr<Fsdp2Precision> p = precision(yaml, bf16);
    if (!p.ok()) return p.status().message();
    return std::string(p->param_bf16 ? "param bf16" : "param fp32") + (p->reduce_bf16 ? ", reduce bf16" : ", reduce fp32");
  };
  EXPECT_EQ(flags("", false), "param fp32, reduce fp32");
  EXPECT_EQ(flags("", true), "param bf16, reduce bf16");  // Megatron's --bf16: bf16 parameters, bf16 gradients
  EXPECT_EQ(flags("param_dtype: bf16\n", true), "param bf16, reduce bf16");
  EXPECT_EQ(flags("param_dtype: bf16\nreduce_dtype: fp32\n", true), "param bf16, reduce fp32");
  EXPECT_EQ(flags("reduce_dtype: fp32\n", true), "param bf16, reduce fp32");
  EXPECT_EQ(flags("reduce_dtype: bf16\n", false), "param fp32, reduce bf16");
  EXPECT_EQ(flags("param_dtype: fp32\nreduce_dtype: fp32\n", false), "param fp32, reduce fp32");
  EXPECT_EQ(flags("param_dtype: bf16\n", false),
            "--fsdp2-config-path f.yaml: param_dtype bf16 computes in bf16: expected --bf16 (Gale's bf16 arithmetic, "
            "whose GEMMs read the bf16 copy FSDP2 gathers), found fp32 training");
  EXPECT_EQ(flags("param_dtype: fp32\n", true),
            "--fsdp2-config-path f.yaml: param_dtype fp32 with --bf16: the model is bf16 (Megatron's Float16Module) "
            "and its GEMMs read bf16 weights: expected param_dtype bf16 or leave it out");
}

TEST(Fsdp2Config, Refusals) {
  EXPECT_EQ(message("sharding_size: 0\n"),
            "--fsdp2-config-path f.yaml: sharding_size: expected an integer ≥ 1 (or auto), found '0'");
  EXPECT_EQ(message("sharding_size: two\n"),
            "--fsdp2-config-path f.yaml: sharding_size: expected an integer ≥ 1 (or auto), found 'two'");
  EXPECT_EQ(message("reshard_after_forward: maybe\n"),
            "--fsdp2-config-path f.yaml: reshard_after_forward: expected true or false, found 'maybe'");
  EXPECT_NE(message("reshard_after_forward: 2\n").find("reshard_after_forward 2: not supported yet"), std::string::npos);
  EXPECT_EQ(message("num_to_forward_prefetch: -1\n"),
            "--fsdp2-config-path f.yaml: num_to_forward_prefetch: expected an integer ≥ 0, found '-1'");
  EXPECT_EQ(message("param_dtype: fp16\n"),
            "--fsdp2-config-path f.yaml: param_dtype fp16: not supported yet (fp16 needs loss scaling, which "
            "Megatron refuses with FSDP2 too; expected bf16 or fp32)");
  EXPECT_NE(message("reduce_dtype: fp16\n").find("reduce_dtype fp16: not supported yet"), std::string::npos);
  EXPECT_NE(message("output_dtype: float16\n").find("output_dtype float16: not supported yet"), std::string::npos);
  EXPECT_EQ(message("output_dtype: bf16\n"),
            "--fsdp2-config-path f.yaml: output_dtype bf16: not supported yet (Gale's units pass f32 hidden states "
            "to each other and --bf16 rounds only the GEMM inputs; expected fp32 or leave it out)");
  EXPECT_EQ(message("output_dtype: fp32\n"), "ok");
  EXPECT_NE(message("reduce_dtype: int8\n").find("reduce_dtype: expected fp32, bf16 or fp16, found 'int8'"),
            std::string::npos);
  EXPECT_NE(message("offload_to_cpu: sometimes\n").find("offload_to_cpu: expected true or false"), std::string::npos);
  EXPECT_EQ(message("sub_modules_to_wrap:\n  - mindspeed_mm.models.ae.base.AEModel\n"),
            "--fsdp2-config-path f.yaml: sub_modules_to_wrap: 'mindspeed_mm.models.ae.base.AEModel' names no Gale "
            "unit (expected embedding or …LanguageModelEmbedding, layers or …TransformerLayer, head, "
            "…RotaryEmbedding)");
  EXPECT_NE(message("sub_modules_to_wrap: layers\n").find("sub_modules_to_wrap: expected a list"), std::string::npos);
  EXPECT_NE(message("ignored_modules:\n  - embedding\n").find("f.yaml: ignored_modules: not supported yet"),
            std::string::npos);
  EXPECT_NE(message("ignored_modules:\n  - vit\n").find("ignored_modules: 'vit' names no Gale unit"), std::string::npos);
  EXPECT_NE(message("recompute_modules:\n  - head\n").find("f.yaml: recompute_modules: 'head': not supported yet"),
            std::string::npos);
  EXPECT_TRUE(parse_fsdp2_config("recompute_modules:\n  - megatron.core.transformer.transformer_layer.TransformerLayer\n",
                                 "f.yaml")
                  ->recompute_layers);
  EXPECT_EQ(message("sharding_size: 2\nsharding_sizes: 2\n"),
            "--fsdp2-config-path f.yaml: unknown key sharding_sizes (expected sharding_size, sub_modules_to_wrap, "
            "reshard_after_forward, param_dtype, reduce_dtype, output_dtype, cast_forward_inputs, ignored_modules, "
            "offload_to_cpu, pin_memory, num_to_forward_prefetch, recompute_modules)");
  EXPECT_NE(message("sharding_size: 2\nsharding_size: 4\n").find("f.yaml: key sharding_size given twice"),
            std::string::npos);
  StatusOr<Fsdp2Config> missing = read_fsdp2_config("/nonexistent/f.yaml");
  EXPECT_EQ(missing.status().message(), "--fsdp2-config-path /nonexistent/f.yaml: cannot read the file");
}

TEST(Fsdp2Args, StartUpRules) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("gale_fsdp2_" + std::to_string(::getpid()) + ".yaml")).string();
  {
    std::ofstream f(path);
    f << "sharding_size: 2\nreshard_after_forward: false\nnum_to_forward_prefetch: 1\n";
  }
  const std::vector<std::string> untie = {"--untie-embeddings-and-output-weights"};
  {
    PretrainCli alone;  // Megatron's flag alone: whole DP, Megatron's defaults
    ASSERT_TRUE(alone.parse_minimal({"--use-torch-fsdp2", untie[0], "--global-batch-size", "8"}, 4).ok());
    EXPECT_TRUE(alone.args.parallel.zero3());
    EXPECT_EQ(alone.args.parallel.fsdp2_sharding_size, 4);
    EXPECT_TRUE(alone.args.parallel.fsdp2_reshard_after_forward);
    EXPECT_FALSE(alone.args.parallel.fsdp2_wrap_head);
  }
  {
    PretrainCli file;
    ASSERT_TRUE(file.parse_minimal({"--use-torch-fsdp2", "--fsdp2-config-path", path, untie[0], "--num-layers", "4",
                                    "--global-batch-size", "8"},
                                   4)
                    .ok());
    EXPECT_EQ(file.args.parallel.fsdp2_sharding_size, 2);
    EXPECT_FALSE(file.args.parallel.fsdp2_reshard_after_forward);
    EXPECT_EQ(file.args.parallel.fsdp2_forward_prefetch, 1);
  }
  {
    std::ofstream f(path);
    f << "recompute_modules:\n  - layers\n";
  }
  {
    PretrainCli recompute;  // MindSpeed's checkpointing of every layer: full, uniform, one layer per group
    ASSERT_TRUE(recompute.parse_minimal({"--use-torch-fsdp2", "--fsdp2-config-path", path, untie[0]}, 2).ok());
    EXPECT_EQ(recompute.args.model.recompute_granularity, "full");
    EXPECT_EQ(recompute.args.model.recompute_method, "uniform");
    EXPECT_EQ(recompute.args.model.recompute_num_layers, 1);
  }
  expect_one_line_error({{"--use-torch-fsdp2", "--fsdp2-config-path", path, untie[0], "--recompute-granularity",
                          "selective"},
                         2, "recompute_modules and --recompute-granularity selective both set recomputation"});
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--recompute-granularity", "full", "--recompute-method",
                          "uniform", "--recompute-num-layers", "2"},
                         2, "--use-torch-fsdp2 with --recompute-granularity full --recompute-method uniform "
                            "--recompute-num-layers 2: not supported yet"});
  {
    std::ofstream f(path);
    f << "sharding_size: 2\nreshard_after_forward: false\nnum_to_forward_prefetch: 1\n";
  }
  expect_one_line_error({{"--fsdp2-config-path", path}, 2, "configures FSDP2: expected --use-torch-fsdp2"});
  expect_one_line_error({{"--use-torch-fsdp2"}, 2, "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights"});
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--fsdp2-config-path", path, "--global-batch-size", "6"}, 3,
                         "sharding_size 2 must divide the data-parallel size 3"});
  {
    PretrainCli bf16;  // Megatron's --bf16 with FSDP2: accepted (param_dtype bf16)
    ASSERT_TRUE(bf16.parse_minimal({"--use-torch-fsdp2", untie[0], "--bf16"}, 2).ok());
    EXPECT_TRUE(bf16.args.training.bf16);
  }
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--bf16", "--reuse-fp32-param"}, 2,
                         "--use-torch-fsdp2 with --bf16 --reuse-fp32-param: not supported yet"});
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--bf16", "--qat-scheme", "w8a16-mxfp8"}, 2,
                         "--use-torch-fsdp2 with --bf16 --qat-scheme: not supported yet"});
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--bf16", "--fp8-format", "e4m3"}, 2,
                         "--use-torch-fsdp2 with --bf16 --fp8-format: not supported yet"});
  expect_one_line_error({{"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params", "--bf16"}, 2,
                         "--data-parallel-sharding-strategy optim_grads_params with --bf16: not supported yet"});
  {
    std::ofstream f(path);
    f << "param_dtype: bf16\n";
  }
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--fsdp2-config-path", path}, 2,
                         "param_dtype bf16 computes in bf16: expected --bf16"});
  {
    PretrainCli both;
    ASSERT_TRUE(both.parse_minimal({"--use-torch-fsdp2", untie[0], "--fsdp2-config-path", path, "--bf16"}, 2).ok());
  }
  {
    std::ofstream f(path);
    f << "sharding_size: 2\nreshard_after_forward: false\nnum_to_forward_prefetch: 1\n";
  }
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--fp16"}, 2, "--use-torch-fsdp2 is not supported with --fp16"});
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--tensor-model-parallel-size", "2"}, 4,
                         "--use-torch-fsdp2 with --tensor-model-parallel-size 2: not supported yet"});
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--context-parallel-size", "2"}, 4,
                         "--use-torch-fsdp2 with --context-parallel-size 2: not supported yet"});
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--pipeline-model-parallel-size", "2"}, 4,
                         "--use-torch-fsdp2 is not supported with pipeline parallelism"});
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--use-distributed-optimizer"}, 2,
                         "--use-torch-fsdp2 is not supported with --use-distributed-optimizer"});
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--use-custom-fsdp", "--data-parallel-sharding-strategy",
                          "optim_grads_params"},
                         2, "--use-torch-fsdp2 and --use-custom-fsdp (Megatron-FSDP) both wrap the model"});
  const std::string lz =
      (std::filesystem::temp_directory_path() / ("gale_fsdp2_lz_" + std::to_string(::getpid()) + ".yaml")).string();
  {
    std::ofstream f(lz);
    f << "zero3_size: 2\nparam_dtype: fp32\nreduce_dtype: fp32\n";
  }
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--layerzero", "--layerzero-config", lz}, 2,
                         "--use-torch-fsdp2 and --layerzero both shard the model"});
  {
    std::ofstream f(path);
    f << "sharding_size: 2\nbogus: 1\n";
  }
  expect_one_line_error({{"--use-torch-fsdp2", untie[0], "--fsdp2-config-path", path}, 2,
                         "--fsdp2-config-path " + path + ": unknown key bogus"});
  std::filesystem::remove(path);
  std::filesystem::remove(lz);
}

}  // namespace
}  // namespace gale
