// Megatron's FP8 flags in the registry: a level-0 Megatron feature, every recipe and format
// accepted, and Megatron's validation rules (its messages) plus Gale's refusals as one-line errors.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

std::vector<std::string> model(std::vector<std::string> extra) {
  std::vector<std::string> argv = {"--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                                   "--ffn-hidden-size", "256"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(Fp8Feature, ImplementedMegatronFeature) {
  ResolvedFeatures r(model({}));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("fp8");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->flag(), "--fp8-format");
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(f->module(), FeatureModule::kMegatron);
  EXPECT_FALSE(r.registry->active("fp8"));
  for (const char* format : {"e4m3", "hybrid"})
    for (const char* recipe : {"delayed", "tensorwise", "mxfp8"}) {
      ResolvedFeatures on(model({"--fp8-format", format, "--fp8-recipe", recipe, "--fp8-margin", "1",
                                 "--fp8-amax-history-len", "16", "--fp8-amax-compute-algo", "max", "--no-fp8-wgrad",
                                 "--fp8-interval", "2"}));
      ASSERT_TRUE(on.status.ok()) << format << " " << recipe << ": " << on.status.to_string();
      EXPECT_TRUE(on.registry->active("fp8"));
    }
  ResolvedFeatures bf16_layers(model({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
                                      "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "2",
                                      "--num-layers-at-end-in-bf16", "0", "--bf16"}));
  ASSERT_TRUE(bf16_layers.status.ok()) << bf16_layers.status.to_string();
}

TEST(Fp8Feature, RefusesWithMessages) {
  struct Case {
    std::vector<std::string> flags;
    std::string expected;
  };
  const Case cases[] = {
      {{"--fp8-format", "e5m2"}, "--fp8-format"},
      {{"--fp8-format", "e4m3", "--fp8-recipe", "blockwise"},
       "--fp8-recipe: expected delayed, tensorwise or mxfp8, found \"blockwise\""},
      {{"--fp8-format", "e4m3", "--fp8-amax-compute-algo", "mean"}, "--fp8-amax-compute-algo"},
      {{"--fp8-format", "e4m3", "--fp8-amax-history-len", "0"}, "--fp8-amax-history-len: expected at least 1, found 0"},
      {{"--fp8-format", "e4m3", "--first-last-layers-bf16"},
       "Delayed scaling does not support first / last layer in BF16."},
      {{"--fp8-format", "e4m3", "--fp8-recipe", "mxfp8", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16",
        "3", "--pipeline-model-parallel-size", "2"},
       "num_layers_at_start_in_bf16 (3) must be between 0 and number of layers per pipeline stage (2)."},
      {{"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
        "--num-layers-at-end-in-bf16", "-1"},
       "num_layers_at_end_in_bf16 (-1) must be between 0 and number of layers per pipeline stage (4)."},
      {{"--fp8-format", "e4m3", "--fp8-param-gather"},
       "--fp8-param-gather only supported with distributed optimizer or torch fsdp2"},
      {{"--fp8-param-gather", "--use-distributed-optimizer"}, "fp8_param must be used together with fp8 mode."},
      {{"--fp8-format", "e4m3", "--fp8-recipe", "mxfp8", "--fp8-param-gather", "--use-distributed-optimizer"},
       "MXFP8 currently does not support fp8_param."},
      {{"--fp8-format", "e4m3", "--fp8-param-gather", "--use-distributed-optimizer"},
       "--fp8-param-gather: not supported yet"},
      {{"--fp8-format", "hybrid", "--fp16"}, "--fp8-format hybrid with --fp16: not supported yet"},
      {{"--fp8-format", "e4m3", "--qat-scheme", "w8a16-mxfp8"}, "conflicts with --qat-scheme w8a16-mxfp8"},
      {{"--fp8-format", "e4m3", "--lora-target-modules", "linear_qkv"}, "LoRA (--lora-target-modules): not supported yet"},
      {{"--fp8-format", "e4m3", "--tp-2d"}, "with --tp-2d: not supported yet"},
      {{"--fp8-format", "e4m3", "--num-experts", "4", "--moe-ffn-hidden-size", "64", "--expert-model-parallel-size",
        "2"},
       "--fp8-recipe delayed with --expert-model-parallel-size 2: not supported yet"},
  };
  for (const Case& c : cases) {
    ResolvedFeatures r(model(c.flags));
    ASSERT_FALSE(r.status.ok()) << c.expected;
    const std::string m = r.status.message();
    EXPECT_NE(m.find(c.expected), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace gale
