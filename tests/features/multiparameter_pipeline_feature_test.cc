// MindSpeed's --use-multiparameter-pipeline-model-parallel in the registry: implemented (no longer a
// planned flag), level 2 in the multimodal module, active with a pipeline (1F1B or interleaved),
// inactive with its reason without one or below level 2, refused with DualPipeV (as MindSpeed's)
// and, as not supported yet, with context parallelism and --reset-attention-mask. What it changes
// is tested in tests/parallel/multiparameter_pipeline_mpi_test.cc and
// tests/schedule/pipeline_multi_p2p_mpi_test.cc.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

constexpr const char* kFlag = "--use-multiparameter-pipeline-model-parallel";

TEST(MultiParameterPipelineFeature, ImplementedLevelTwoMultimodalFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("use-multiparameter-pipeline-model-parallel");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kMultimodal);
  EXPECT_EQ(f->flag(), kFlag);
  EXPECT_EQ(f->counterpart(), "MindSpeed MultiParameterFeature (L2)");
  EXPECT_FALSE(r.registry->active("use-multiparameter-pipeline-model-parallel"));
}

TEST(MultiParameterPipelineFeature, ActiveWithOneFOneBAndInterleaving) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, std::vector<std::string>{"--num-layers-per-virtual-pipeline-stage", "1"},
        std::vector<std::string>{"--reset-attention-mask"}}) {
    std::vector<std::string> argv = {kFlag, "--pipeline-model-parallel-size", "2", "--num-layers", "4"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ResolvedFeatures r(argv);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("use-multiparameter-pipeline-model-parallel"));
    EXPECT_TRUE(r.notices.empty());
  }
}

TEST(MultiParameterPipelineFeature, WithoutAPipelineItSaysWhyItIsInactive) {
  ResolvedFeatures r({kFlag});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("use-multiparameter-pipeline-model-parallel"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_NE(r.notices[0].find(std::string(kFlag) +
                              " is not active: no pipeline (--pipeline-model-parallel-size 1): nothing is sent between "
                              "stages"),
            std::string::npos)
      << r.notices[0];
}

TEST(MultiParameterPipelineFeature, BelowLevelTwoItSaysWhyItIsInactive) {
  ResolvedFeatures r({"--optimization-level", "1", kFlag, "--pipeline-model-parallel-size", "2"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("use-multiparameter-pipeline-model-parallel"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_NE(r.notices[0].find(std::string(kFlag) + " is not active: it needs --optimization-level 2 (given 1)"),
            std::string::npos)
      << r.notices[0];
}

TEST(MultiParameterPipelineFeature, RefusedWithDualPipeV) {
  ResolvedFeatures r({kFlag, "--pipeline-model-parallel-size", "2", "--num-layers", "4", "--schedules-method",
                      "dualpipev"});
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find(std::string(kFlag) +
                                    " applies to the 1F1B and interleaved 1F1B schedules (as MindSpeed's), found "
                                    "--schedules-method dualpipev"),
            std::string::npos)
      << r.status.message();
}

TEST(MultiParameterPipelineFeature, ContextParallelDocumentIdsNotSupportedYet) {
  ResolvedFeatures r({kFlag, "--pipeline-model-parallel-size", "2", "--context-parallel-size", "2",
                      "--reset-attention-mask"});
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status.message().find(std::string(kFlag) +
                                    " with --context-parallel-size 2 and --reset-attention-mask: not supported yet"),
            std::string::npos)
      << r.status.message();
  // Without document ids the list is the hidden states alone: context parallelism is fine.
  ResolvedFeatures plain({kFlag, "--pipeline-model-parallel-size", "2", "--context-parallel-size", "2"});
  EXPECT_TRUE(plain.status.ok()) << plain.status.to_string();
}

}  // namespace
}  // namespace gale
