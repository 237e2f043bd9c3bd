// MindSpeed's --automated-pipeline in the registry: implemented (no longer a planned flag), level 2
// in the parallel module, its rules refused with one-line messages naming the flag, what was
// expected and what was found, and --automated-pipeline-perf refused as not supported yet. The
// feature itself: tests/train/automated_pipeline_test.cc and tests/cli/automated_pipeline_cli_test.cc.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

const std::vector<std::string> kBase = {"--automated-pipeline", "--pipeline-model-parallel-size", "2",
                                        "--num-layers", "4"};

TEST(AutomatedPipelineFeature, ImplementedLevelTwoParallelFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("automated-pipeline");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kParallel);
  EXPECT_EQ(f->flag(), "--automated-pipeline");
  EXPECT_FALSE(r.registry->active("automated-pipeline"));
}

TEST(AutomatedPipelineFeature, ActiveWithAPipelineAndOffBelowLevelTwo) {
  ResolvedFeatures r(kBase);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.registry->active("automated-pipeline"));
  ResolvedFeatures low = resolve(kBase, {"--optimization-level", "1"});
  ASSERT_TRUE(low.status.ok()) << low.status.to_string();
  EXPECT_FALSE(low.registry->active("automated-pipeline"));
  ASSERT_EQ(low.notices.size(), 1u);
  EXPECT_NE(low.notices[0].find("--automated-pipeline is not active: it needs --optimization-level 2"),
            std::string::npos)
      << low.notices[0];
}

TEST(AutomatedPipelineFeature, Refusals) {
  expect_one_line_refusal({"--automated-pipeline", "--num-layers", "4"},
                          "--automated-pipeline searches the pipeline split: needs --pipeline-model-parallel-size >= 2, "
                          "found 1");
  expect_one_line_refusal({"--automated-pipeline", "--pipeline-model-parallel-size", "4", "--num-layers", "2"},
                          "needs at least one layer per pipeline stage, found --num-layers 2 on 4 stages");
  expect_one_line_refusal(kBase, {"--save-memory-ratio", "1"},
                          "--save-memory-ratio: expected a fraction in [0, 1), found 1");
  expect_one_line_refusal(kBase, {"--num-layer-list", "1,3"},
                          "--automated-pipeline chooses the pipeline split itself: expected no --num-layer-list, found it set");
  expect_one_line_refusal(kBase, {"--decoder-first-pipeline-num-layers", "1"},
                          "expected no --decoder-first-pipeline-num-layers, found it set");
  expect_one_line_refusal(kBase, {"--pipeline-model-parallel-layout", "Et|ttL"},
                          "expected no --pipeline-model-parallel-layout, found it set");
  expect_one_line_refusal(kBase, {"--schedules-method", "dualpipev"},
                          "expected no --schedules-method dualpipev, found it");
  expect_one_line_refusal(kBase, {"--num-virtual-stages-per-pipeline-rank", "2"},
                          "expected no virtual stages, found --num-virtual-stages-per-pipeline-rank set");
  expect_one_line_refusal(kBase, {"--recompute-granularity", "full", "--recompute-method", "block"},
                          "--automated-pipeline chooses each stage's recomputation itself (MindSpeed drops "
                          "--recompute-granularity with a warning): expected no --recompute-granularity, found it set");
  expect_one_line_refusal(kBase, {"--noop-layers", "0"}, "expected no --noop-layers, found it set");
  expect_one_line_refusal({"--automated-pipeline-perf", "--pipeline-model-parallel-size", "2", "--num-layers", "4"},
                          "--automated-pipeline-perf: not supported yet");
  expect_one_line_refusal(kBase, {"--automated-pipeline-perf"}, "--automated-pipeline-perf: not supported yet");
}

}  // namespace
}  // namespace gale
