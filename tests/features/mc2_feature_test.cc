// MindSpeed's --use-ascend-mc2 in the registry: what it installs (2 chunks, column-parallel inputs
// gathered again in backward), level 2, and MindSpeed's rules as one-line errors (TP > 1 and
// sequence parallelism required; CoC, --tp-comm-overlap, --unaligned-linear, MoE, MLA, LoRA refused).
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

std::vector<std::string> tp2_sp(const std::vector<std::string>& more) {
  std::vector<std::string> a = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(Mc2Feature, OffByDefault) {
  ResolvedFeatures r(tp2_sp({}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_FALSE(r.registry->active("use-ascend-mc2"));
  EXPECT_FALSE(r.ops.tp_regather_input);
  const Feature* f = r.registry->find("use-ascend-mc2");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kFusedCompute);
}

TEST(Mc2Feature, InstallsPipelinedRegatheringLinears) {
  ResolvedFeatures r(tp2_sp({"--use-ascend-mc2"}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_TRUE(r.registry->active("use-ascend-mc2"));
  EXPECT_TRUE(r.ops.tp_regather_input);
  EXPECT_EQ(r.ops.tp_comm_chunks, 2);
  EXPECT_NE(r.ops.impl.at("tp-comm").find("mc2"), std::string::npos);
}

TEST(Mc2Feature, InactiveBelowLevelTwo) {
  ResolvedFeatures r(tp2_sp({"--optimization-level", "1", "--use-ascend-mc2"}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_FALSE(r.registry->active("use-ascend-mc2"));
  EXPECT_FALSE(r.ops.tp_regather_input);
  EXPECT_EQ(r.ops.tp_comm_chunks, 1);
}

TEST(Mc2Feature, Refusals) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tensor-model-parallel-size", "2", "--use-ascend-mc2"},
       "--use-ascend-mc2: needs --tensor-model-parallel-size > 1 and --sequence-parallel (as MindSpeed), found TP 2 "
       "with sequence parallelism off"},
      {{"--use-ascend-mc2"}, "found TP 1 with sequence parallelism off"},
      {tp2_sp({"--use-ascend-mc2", "--use-ascend-coc", "--coc-parallel-num", "2"}),
       "--use-ascend-mc2: conflicts with --use-ascend-coc"},
      {tp2_sp({"--use-ascend-mc2", "--tp-comm-overlap"}), "--use-ascend-mc2: conflicts with --tp-comm-overlap"},
      {tp2_sp({"--use-ascend-mc2", "--unaligned-linear"}), "--use-ascend-mc2: conflicts with --unaligned-linear"},
      {tp2_sp({"--use-ascend-mc2", "--num-experts", "4"}), "--use-ascend-mc2: not supported with MoE (--num-experts 4"},
      {tp2_sp({"--use-ascend-mc2", "--multi-latent-attention"}),
       "--use-ascend-mc2: not supported with --multi-latent-attention"},
      {tp2_sp({"--use-ascend-mc2", "--lora-target-modules", "linear_qkv"}),
       "--use-ascend-mc2: conflicts with --lora-target-modules"},
  };
  for (const auto& [flags, expected] : cases) {
    ResolvedFeatures r(flags);
    ASSERT_FALSE(r.status.ok()) << expected;
    EXPECT_NE(r.status.message().find(expected), std::string::npos) << r.status.message();
    EXPECT_EQ(r.status.message().find('\n'), std::string::npos) << r.status.message();
  }
}

}  // namespace
}  // namespace gale
