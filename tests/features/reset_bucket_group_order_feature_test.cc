// MindSpeed's --reset-bucket-group-order in the registry: implemented (no longer a planned flag), level 2
// in the communication module, active only with --overlap-param-gather, inactive with its reason below
// level 2. What it changes is tested in tests/optim/data_parallel_sync_mpi_test.cc (the prefetch order)
// and tests/parallel/reset_bucket_group_order_mpi_test.cc (a PP2 x DP2 run: the recorded orders,
// the same losses).
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

const std::vector<std::string> kOverlap = {"--use-distributed-optimizer", "--overlap-grad-reduce",
                                           "--overlap-param-gather"};

std::vector<std::string> with_overlap(std::vector<std::string> flags) {
  flags.insert(flags.end(), kOverlap.begin(), kOverlap.end());
  return flags;
}

TEST(ResetBucketGroupOrderFeature, ImplementedLevelTwoCommunicationFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("reset-bucket-group-order");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kCommunication);
  EXPECT_EQ(f->flag(), "--reset-bucket-group-order");
  EXPECT_FALSE(r.registry->active("reset-bucket-group-order"));
}

TEST(ResetBucketGroupOrderFeature, ActiveWithOverlapParamGather) {
  ResolvedFeatures r(with_overlap({"--reset-bucket-group-order"}));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.registry->active("reset-bucket-group-order"));
  EXPECT_TRUE(r.notices.empty());
}

TEST(ResetBucketGroupOrderFeature, RefusedWithoutOverlapParamGather) {
  ResolvedFeatures r({"--reset-bucket-group-order", "--use-distributed-optimizer", "--overlap-grad-reduce"});
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("--reset-bucket-group-order reorders the --overlap-param-gather prefetch: "
                                    "expected --overlap-param-gather"),
            std::string::npos)
      << r.status.message();
}

TEST(ResetBucketGroupOrderFeature, BelowLevelTwoItSaysWhyItIsInactive) {
  ResolvedFeatures r(with_overlap({"--optimization-level", "1", "--reset-bucket-group-order"}));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("reset-bucket-group-order"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_NE(r.notices[0].find("--reset-bucket-group-order is not active: it needs --optimization-level 2 (given 1)"),
            std::string::npos)
      << r.notices[0];
}

}  // namespace
}  // namespace gale
