// MindSpeed's --qat-scheme in the registry: key-scenario feature, level 2 (off below it), its
// schemes and block sizes, and every combination it refuses as a one-line error naming the flag.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

// A model whose every quantised input dimension is known to the feature (pretrain derives them;
// the resolver alone does not): hidden 64, attention 4 x 16, ffn 256.
std::vector<std::string> model(std::vector<std::string> extra) {
  std::vector<std::string> argv = {"--hidden-size", "64", "--num-attention-heads", "4", "--kv-channels", "16",
                                   "--ffn-hidden-size", "256"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(QatFeature, ImplementedLevelTwoKeyScenario) {
  ResolvedFeatures r(model({}));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("qat");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->flag(), "--qat-scheme");
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kKeyScenarios);
  EXPECT_EQ(f->counterpart(), "MindSpeed QATQuantEngineFeature (L2)");
  EXPECT_FALSE(r.registry->active("qat"));
  for (const char* scheme : {"w4a16-mxfp4", "w4a16-mxfp4-moe-only", "w8a16-mxfp8", "w8a16-mxfp8-moe-only"}) {
    std::vector<std::string> argv = {"--qat-scheme", scheme, "--qat-quant-block-size", "32"};
    if (std::string(scheme).find("moe-only") != std::string::npos)
      argv.insert(argv.end(), {"--num-experts", "4", "--moe-ffn-hidden-size", "64"});
    ResolvedFeatures on(model(argv));
    ASSERT_TRUE(on.status.ok()) << scheme << ": " << on.status.to_string();
    EXPECT_TRUE(on.registry->active("qat")) << scheme;
  }
  ResolvedFeatures b128(model({"--qat-scheme", "w8a16-mxfp8", "--qat-quant-block-size", "128", "--hidden-size", "128",
                               "--kv-channels", "32"}));
  ASSERT_TRUE(b128.status.ok()) << b128.status.to_string();
  ResolvedFeatures mla(model({"--qat-scheme", "w8a16-mxfp8", "--multi-latent-attention", "--kv-lora-rank", "64",
                              "--q-lora-rank", "32", "--v-head-dim", "16"}));
  ASSERT_TRUE(mla.status.ok()) << mla.status.to_string();
  // Uneven shares that the block divides: 3 heads of 32 over TP 2 (64 and 32 columns).
  ResolvedFeatures unaligned(model({"--qat-scheme", "w4a16-mxfp4", "--unaligned-linear", "--tensor-model-parallel-size",
                                    "2", "--num-attention-heads", "3", "--kv-channels", "32"}));
  ASSERT_TRUE(unaligned.status.ok()) << unaligned.status.to_string();
  ResolvedFeatures low(model({"--optimization-level", "1", "--qat-scheme", "w4a16-mxfp4"}));
  ASSERT_TRUE(low.status.ok()) << low.status.to_string();
  EXPECT_FALSE(low.registry->active("qat"));
}

TEST(QatFeature, UnknownSchemeIsRefusedByTheParser) {
  ResolvedFeatures r(model({"--qat-scheme", "w4a4-mxfp4"}));
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("--qat-scheme"), std::string::npos) << r.status.message();
}

TEST(QatFeature, RefusesWhatItCannotServe) {
  struct Case {
    std::vector<std::string> flags;
    std::string expected;
  };
  const Case cases[] = {
      {{"--qat-scheme", "w4a16-mxfp4", "--qat-quant-block-size", "64"},
       "--qat-quant-block-size: expected 32 or 128, found 64"},
      {{"--qat-scheme", "w4a16-mxfp4", "--fp16"}, "--qat-scheme w4a16-mxfp4 with --fp16: not supported yet"},
      {{"--qat-scheme", "w8a16-mxfp8", "--multi-latent-attention", "--kv-lora-rank", "48", "--v-head-dim", "32"},
       "input dimension of linear_kv_up_proj on each rank (--kv-lora-rank = 48)"},
      {{"--qat-scheme", "w8a16-mxfp8", "--multi-latent-attention", "--kv-lora-rank", "64", "--q-lora-rank", "40",
        "--v-head-dim", "32"},
       "input dimension of linear_q_up_proj on each rank (--q-lora-rank = 40)"},
      {{"--qat-scheme", "w8a16-mxfp8", "--multi-latent-attention", "--kv-lora-rank", "64", "--v-head-dim", "4",
        "--tensor-model-parallel-size", "2"},
       "input dimension of linear_proj on each rank (--num-attention-heads x --v-head-dim / "
       "--tensor-model-parallel-size = 8)"},
      {{"--qat-scheme", "w8a16-mxfp8", "--lora-target-modules", "linear_qkv"}, "LoRA): not supported yet"},
      {{"--qat-scheme", "w8a16-mxfp8", "--tp-2d"}, "with --tp-2d: not supported yet"},
      // --unaligned-linear: 3 heads of 16 over TP 2 give rank 1 one head, 16 columns of linear_proj.
      {{"--qat-scheme", "w8a16-mxfp8", "--unaligned-linear", "--tensor-model-parallel-size", "2",
        "--num-attention-heads", "3"},
       "input dimension of linear_proj on each rank (--num-attention-heads x --kv-channels / "
       "--tensor-model-parallel-size = 16 on rank 1)"},
      {{"--qat-scheme", "w4a16-mxfp4-moe-only"}, "it needs a MoE model (--num-experts), found none"},
      // hidden 64 is not a multiple of 128.
      {{"--qat-scheme", "w8a16-mxfp8", "--qat-quant-block-size", "128"},
       "--qat-quant-block-size 128 must divide the input dimension of linear_qkv / linear_fc1 on each rank "
       "(--hidden-size = 64)"},
      // Row-parallel: linear_proj's 4 x 16 over TP 4 is 16 per rank.
      {{"--qat-scheme", "w8a16-mxfp8", "--tensor-model-parallel-size", "4"},
       "input dimension of linear_proj on each rank (--num-attention-heads x --kv-channels / "
       "--tensor-model-parallel-size = 16)"},
      {{"--qat-scheme", "w4a16-mxfp4", "--ffn-hidden-size", "80"},
       "input dimension of linear_fc2 on each rank (--ffn-hidden-size / --tensor-model-parallel-size = 80)"},
      {{"--qat-scheme", "w4a16-mxfp4-moe-only", "--num-experts", "4", "--moe-ffn-hidden-size", "48",
        "--expert-tensor-parallel-size", "1"},
       "the experts' linear_fc2 on each rank (--moe-ffn-hidden-size / --expert-tensor-parallel-size = 48)"},
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
