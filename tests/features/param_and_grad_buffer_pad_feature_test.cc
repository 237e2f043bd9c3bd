// MindSpeed's --param-and-grad-buffer-pad in the registry: implemented (no longer a planned flag),
// level 2 in the memory module, its value checked (a positive multiple of the f32 element size) and
// the layouts it does not support yet refused by name. What it changes is tested in
// tests/optim/grad_buckets_pad_test.cc (the padded layout) and
// tests/parallel/param_and_grad_buffer_pad_mpi_test.cc (bit-identical training, checkpoints).
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

std::string refusal(const std::vector<std::string>& flags) {
  ResolvedFeatures r(flags);
  EXPECT_FALSE(r.status.ok());
  return r.status.message();
}

TEST(ParamAndGradBufferPadFeature, ImplementedLevelTwoMemoryFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("param-and-grad-buffer-pad");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kMemory);
  EXPECT_EQ(f->flag(), "--param-and-grad-buffer-pad");
  EXPECT_FALSE(r.registry->active("param-and-grad-buffer-pad"));
}

TEST(ParamAndGradBufferPadFeature, ActiveWithAByteMultiple) {
  for (const char* n : {"512", "256", "4"}) {
    ResolvedFeatures r({"--param-and-grad-buffer-pad", n});
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("param-and-grad-buffer-pad")) << n;
  }
}

TEST(ParamAndGradBufferPadFeature, RefusesValuesThatAreNotPositiveMultiplesOfFour) {
  for (const char* n : {"0", "-512", "6", "511"})
    EXPECT_NE(refusal({"--param-and-grad-buffer-pad", n})
                  .find(std::string("--param-and-grad-buffer-pad: expected a positive multiple of 4 bytes (the f32 "
                                    "element size of the parameter and gradient buffers), found ") +
                        n),
              std::string::npos)
        << n;
}

TEST(ParamAndGradBufferPadFeature, RefusesLayoutsNotSupportedYet) {
  EXPECT_NE(refusal({"--param-and-grad-buffer-pad", "512", "--bf16", "--reuse-fp32-param"})
                .find("--param-and-grad-buffer-pad with --reuse-fp32-param: not supported yet"),
            std::string::npos);
  EXPECT_NE(refusal({"--param-and-grad-buffer-pad", "512", "--use-torch-fsdp2", "--untie-embeddings-and-output-weights"})
                .find("--param-and-grad-buffer-pad with ZeRO-3/ZeRO-2"),
            std::string::npos);
  EXPECT_NE(refusal({"--param-and-grad-buffer-pad", "512", "--num-experts", "4", "--expert-model-parallel-size", "2"})
                .find("--param-and-grad-buffer-pad with --expert-model-parallel-size 2: not supported yet"),
            std::string::npos);
}

TEST(ParamAndGradBufferPadFeature, BelowLevelTwoItSaysWhyItIsInactive) {
  ResolvedFeatures r({"--optimization-level", "1", "--param-and-grad-buffer-pad", "512"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("param-and-grad-buffer-pad"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_NE(r.notices[0].find("--param-and-grad-buffer-pad is not active: it needs --optimization-level 2 (given 1)"),
            std::string::npos)
      << r.notices[0];
}

}  // namespace
}  // namespace gale
