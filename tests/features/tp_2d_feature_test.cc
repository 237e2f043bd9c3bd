// MindSpeed's --tp-2d in the registry: implemented (no longer a planned flag), a level-0 parallel
// feature (it decides which rank holds which piece), active at every optimization level when
// given, refusing the fused RMSNorm, CoC, the partial recomputations and MindSpeed's overlap flags.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

const std::vector<std::string> kTp2d = {"--tp-2d", "--tp-x", "2", "--tp-y", "2", "--tensor-model-parallel-size", "4"};

std::vector<std::string> with(std::vector<std::string> more) {
  std::vector<std::string> argv = kTp2d;
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

TEST(Tp2dFeature, ImplementedLevelZeroParallelFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("tp-2d");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(f->module(), FeatureModule::kParallel);
  EXPECT_EQ(f->flag(), "--tp-2d");
  EXPECT_FALSE(r.registry->active("tp-2d"));
}

TEST(Tp2dFeature, ActiveAtEveryLevelWhenGiven) {
  for (const char* level : {"0", "1", "2"}) {
    ResolvedFeatures r(with({"--optimization-level", level}));
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("tp-2d")) << "level " << level;
  }
}

TEST(Tp2dFeature, RefusesWhatItDoesNotSupport) {
  EXPECT_EQ(ResolvedFeatures(with({"--normalization", "RMSNorm", "--use-fused-rmsnorm"})).status.message(),
            "--tp-2d does not support --use-fused-rmsnorm");
  EXPECT_EQ(ResolvedFeatures(with({"--use-ascend-coc"})).status.message(), "--tp-2d does not support --use-ascend-coc");
  EXPECT_EQ(ResolvedFeatures(with({"--recompute-norm"})).status.message(), "--tp-2d does not support --recompute-norm");
  EXPECT_EQ(ResolvedFeatures(with({"--recompute-activation-function"})).status.message(),
            "--tp-2d does not support --recompute-activation-function");
  EXPECT_EQ(ResolvedFeatures(with({"--enable-overlap-ag-with-matmul"})).status.message(),
            "--enable-overlap-ag-with-matmul is not supported: Gale's --tp-2d runs its collectives unoverlapped");
  EXPECT_EQ(ResolvedFeatures(with({"--enable-backward-overlap-ag-with-matmul"})).status.message(),
            "--enable-backward-overlap-ag-with-matmul is not supported: Gale's --tp-2d runs its collectives "
            "unoverlapped");
}

}  // namespace
}  // namespace gale
