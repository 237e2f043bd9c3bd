// MindSpeed's --use-ascend-coc and Megatron's --tp-comm-overlap in the registry: the chunk count each
// flag combination installs (MindSpeed's --coc-mode resolution), level 2, inactive at TP 1, and the
// refusals (chunk counts and modes outside MindSpeed's, --coc-fused-kernel, LoRA, --tp-comm-overlap
// without sequence parallelism or TP, Transformer Engine userbuffer settings).
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<std::string> kTp2 = {"--tensor-model-parallel-size", "2"};
const std::vector<std::string> kTp2Sp = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};

int chunks_of(const std::vector<std::string>& flags) {
  ResolvedFeatures r(flags);
  EXPECT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_TRUE(r.registry->active("use-ascend-coc"));
  return r.ops.tp_comm_chunks;
}

TEST(CocFeature, OffByDefault) {
  ResolvedFeatures r(kTp2Sp);
  ASSERT_TRUE(r.status.ok());
  EXPECT_FALSE(r.registry->active("use-ascend-coc"));
  EXPECT_EQ(r.ops.tp_comm_chunks, 1);
  const Feature* f = r.registry->find("use-ascend-coc");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kFusedCompute);
}

TEST(CocFeature, ChunkCountFollowsMindSpeedsModes) {
  EXPECT_EQ(chunks_of(with(kTp2Sp, {"--use-ascend-coc", "--coc-parallel-num", "4"})), 4);
  EXPECT_EQ(chunks_of(with(kTp2, {"--use-ascend-coc", "--coc-parallel-num", "8"})), 8);
  EXPECT_EQ(chunks_of(with(kTp2, {"--use-ascend-coc", "--coc-parallel-num", "2", "--coc-mode", "-1"})), 2);
  EXPECT_EQ(chunks_of(with(kTp2, {"--use-ascend-coc"})), 1);  // default 1 chunk: mode -1 -> 0
  EXPECT_EQ(chunks_of(with(kTp2, {"--use-ascend-coc", "--coc-parallel-num", "4", "--coc-mode", "0"})), 1);
  EXPECT_EQ(chunks_of(with(kTp2, {"--use-ascend-coc", "--coc-parallel-num", "4", "--coc-mode", "1"})), 1);
  EXPECT_EQ(chunks_of(with(kTp2, {"--use-ascend-coc", "--coc-parallel-num", "4", "--coc-mode", "2"})), 4);
  EXPECT_EQ(chunks_of(with(kTp2, {"--use-ascend-coc", "--coc-mode", "2"})), 1);
}

TEST(CocFeature, TpCommOverlapRunsTheChunkedPath) {
  EXPECT_EQ(chunks_of(with(kTp2Sp, {"--tp-comm-overlap"})), 4);
  EXPECT_EQ(chunks_of(with(kTp2Sp, {"--tp-comm-overlap", "--coc-parallel-num", "2"})), 2);
}

TEST(CocFeature, InactiveBelowLevelTwoAndAtTpOne) {
  ResolvedFeatures level1(with(kTp2Sp, {"--optimization-level", "1", "--use-ascend-coc", "--coc-parallel-num", "4"}));
  ASSERT_TRUE(level1.status.ok());
  EXPECT_FALSE(level1.registry->active("use-ascend-coc"));
  EXPECT_EQ(level1.ops.tp_comm_chunks, 1);
  ResolvedFeatures tp1({"--use-ascend-coc", "--coc-parallel-num", "4"});
  ASSERT_TRUE(tp1.status.ok());
  EXPECT_FALSE(tp1.registry->active("use-ascend-coc"));
  EXPECT_EQ(tp1.ops.tp_comm_chunks, 1);
  ASSERT_EQ(tp1.notices.size(), 1u);
  EXPECT_NE(tp1.notices[0].find("--use-ascend-coc is not active: does nothing at --tensor-model-parallel-size 1"),
            std::string::npos)
      << tp1.notices[0];
}

TEST(CocFeature, Refusals) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {with(kTp2, {"--use-ascend-coc", "--coc-parallel-num", "3"}),
       "--coc-parallel-num: expected 1, 2, 4 or 8 (as MindSpeed), found 3"},
      {with(kTp2, {"--use-ascend-coc", "--coc-mode", "3"}), "--coc-mode: expected -1, 0 (original), 1 (rewrite) or 2"},
      {with(kTp2, {"--use-ascend-coc", "--coc-fused-kernel"}), "--coc-fused-kernel: not supported (Ascend LCAL"},
      {with(kTp2, {"--tp-comm-overlap"}),
       "--tp-comm-overlap: needs --sequence-parallel and --tensor-model-parallel-size > 1 (as Megatron), found "
       "sequence parallelism off at TP 2"},
      {{"--sequence-parallel", "--tp-comm-overlap"}, "found sequence parallelism on at TP 1"},
      {with(kTp2, {"--use-ascend-coc", "--coc-parallel-num", "2", "--lora-target-modules", "linear_qkv"}),
       "--use-ascend-coc: conflicts with --lora-target-modules (as MindSpeed-LLM"},
      {with(kTp2Sp, {"--tp-comm-overlap", "--tp-comm-overlap-cfg", "ub.yaml"}),
       "--tp-comm-overlap-cfg: not supported yet (Transformer Engine userbuffer settings"},
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
