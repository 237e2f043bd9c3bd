// MindSpeed's --optimize-send-recv-comm in the registry: implemented (no longer a planned flag),
// level 2 in the parallel module, active with a 1F1B pipeline, inactive with its reason without a
// pipeline or below level 2, refused with interleaving and DualPipeV (MindSpeed applies it to
// the schedule without interleaving only). What it changes is tested in
// tests/parallel/optimize_send_recv_comm_mpi_test.cc.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(OptimizeSendRecvCommFeature, ImplementedLevelTwoParallelFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("optimize-send-recv-comm");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kParallel);
  EXPECT_EQ(f->flag(), "--optimize-send-recv-comm");
  EXPECT_FALSE(r.registry->active("optimize-send-recv-comm"));
}

TEST(OptimizeSendRecvCommFeature, ActiveWithOneFOneB) {
  ResolvedFeatures r({"--optimize-send-recv-comm", "--pipeline-model-parallel-size", "2"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.registry->active("optimize-send-recv-comm"));
  EXPECT_TRUE(r.notices.empty());
}

TEST(OptimizeSendRecvCommFeature, WithoutAPipelineItSaysWhyItIsInactive) {
  ResolvedFeatures r({"--optimize-send-recv-comm"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("optimize-send-recv-comm"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_NE(r.notices[0].find("--optimize-send-recv-comm is not active: no pipeline (--pipeline-model-parallel-size 1)"),
            std::string::npos)
      << r.notices[0];
}

TEST(OptimizeSendRecvCommFeature, BelowLevelTwoItSaysWhyItIsInactive) {
  ResolvedFeatures r({"--optimization-level", "1", "--optimize-send-recv-comm", "--pipeline-model-parallel-size", "2"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("optimize-send-recv-comm"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_NE(r.notices[0].find("--optimize-send-recv-comm is not active: it needs --optimization-level 2 (given 1)"),
            std::string::npos)
      << r.notices[0];
}

TEST(OptimizeSendRecvCommFeature, RefusedWithInterleavingAndDualPipeV) {
  for (const auto& [flags, found] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--num-layers-per-virtual-pipeline-stage", "1"}, "virtual pipeline stages (--num-layers-per-virtual-pipeline-stage)"},
           {{"--num-virtual-stages-per-pipeline-rank", "2"}, "virtual pipeline stages (--num-virtual-stages-per-pipeline-rank)"},
           {{"--schedules-method", "dualpipev"}, "--schedules-method dualpipev"}}) {
    std::vector<std::string> argv = {"--optimize-send-recv-comm", "--pipeline-model-parallel-size", "2",
                                     "--num-layers", "4"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ResolvedFeatures r(argv);
    ASSERT_FALSE(r.status.ok()) << found;
    EXPECT_NE(r.status.message().find("--optimize-send-recv-comm applies to the 1F1B schedule without interleaving "
                                      "(as MindSpeed's), found " + found),
              std::string::npos)
        << r.status.message();
  }
}

}  // namespace
}  // namespace gale
