// MindSpeed's --reuse-fp32-param in the registry: implemented (no longer a planned flag), memory
// module, level 2; active with --bf16 at level 2 only; each combination it cannot serve is a
// one-line error naming both flags.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(ReuseFp32ParamFeature, ImplementedLevelTwoMemoryFeature) {
  ResolvedFeatures r({"--bf16"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("reuse-fp32-param");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kMemory);
  EXPECT_EQ(f->flag(), "--reuse-fp32-param");
  EXPECT_EQ(f->counterpart(), "MindSpeed ReuseFP32Param (L2)");
  EXPECT_FALSE(r.registry->active("reuse-fp32-param"));  // not requested
}

TEST(ReuseFp32ParamFeature, ActiveWithBf16AtLevelTwoOnly) {
  ResolvedFeatures on({"--bf16", "--reuse-fp32-param"});
  ASSERT_TRUE(on.status.ok()) << on.status.to_string();
  EXPECT_TRUE(on.registry->active("reuse-fp32-param"));
  EXPECT_TRUE(on.notices.empty());
  ResolvedFeatures distopt({"--bf16", "--reuse-fp32-param", "--use-distributed-optimizer", "--optimizer", "sgd"});
  ASSERT_TRUE(distopt.status.ok()) << distopt.status.to_string();
  EXPECT_TRUE(distopt.registry->active("reuse-fp32-param"));
  for (const char* level : {"0", "1"}) {
    ResolvedFeatures low({"--optimization-level", level, "--bf16", "--reuse-fp32-param"});
    ASSERT_TRUE(low.status.ok()) << low.status.to_string();
    EXPECT_FALSE(low.registry->active("reuse-fp32-param"));
    ASSERT_EQ(low.notices.size(), 1u);
    EXPECT_NE(low.notices[0].find("--reuse-fp32-param is not active"), std::string::npos) << low.notices[0];
  }
}

TEST(ReuseFp32ParamFeature, RefusesWhatItCannotServe) {
  struct Case {
    std::vector<std::string> flags;
    std::string other;  // the flag the error names besides --reuse-fp32-param
  };
  const Case cases[] = {
      {{}, "--bf16"},
      {{"--fp16"}, "--fp16"},
      {{"--bf16", "--lora-target-modules", "linear_qkv"}, "--lora-target-modules"},
      {{"--bf16", "--num-experts", "4"}, "--num-experts"},
      {{"--bf16", "--multi-latent-attention", "--q-lora-rank", "16", "--kv-lora-rank", "16", "--qk-head-dim", "8",
        "--qk-pos-emb-head-dim", "8", "--v-head-dim", "8", "--position-embedding-type", "rope"},
       "--multi-latent-attention"},
      {{"--bf16", "--mtp-num-layers", "1"}, "--mtp-num-layers"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = c.flags;
    argv.push_back("--reuse-fp32-param");
    ResolvedFeatures r(argv);
    ASSERT_FALSE(r.status.ok()) << c.other;
    const std::string m = r.status.message();
    EXPECT_NE(m.find("--reuse-fp32-param"), std::string::npos) << m;
    EXPECT_NE(m.find(c.other), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace gale
