// MindSpeed's log-line features in the registry: --op-cal-tflops (the FLOP-counting op table, only
// with --log-throughput, not with multi-head latent attention) and --async-log-allreduce.
#include <gtest/gtest.h>

#include "features/resolved_features.h"
#include "kernels/flop_counter.h"

namespace gale {
namespace {

TEST(OpCalTflopsFeature, OffUnlessRequested) {
  ResolvedFeatures r({"--log-throughput"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("op-cal-tflops"));
  EXPECT_FALSE(counts_flops(r.ops));  // zero cost: the kernels are called directly
  EXPECT_EQ(r.ops.impl.count("flop_count"), 0u);
}

TEST(OpCalTflopsFeature, WrapsTheKernelsTheOtherFeaturesInstalled) {
  ResolvedFeatures r({"--op-cal-tflops", "--log-throughput", "--use-flash-attn"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.registry->active("op-cal-tflops"));
  EXPECT_TRUE(counts_flops(r.ops));
  EXPECT_EQ(r.impl("flop_count"), "counted");
  EXPECT_NE(r.impl("attention"), "reference");  // flash attention installed, then wrapped
  EXPECT_TRUE(r.notices.empty());
}

TEST(OpCalTflopsFeature, NeedsLogThroughputAndSaysSo) {
  ResolvedFeatures r({"--op-cal-tflops"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("op-cal-tflops"));
  EXPECT_FALSE(counts_flops(r.ops));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_EQ(r.notices[0], "--op-cal-tflops is not active: its throughputs are printed only with --log-throughput");
}

TEST(OpCalTflopsFeature, BelowLevelTwoItIsNotActive) {
  ResolvedFeatures r({"--op-cal-tflops", "--log-throughput", "--optimization-level", "1"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("op-cal-tflops"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_EQ(r.notices[0], "--op-cal-tflops is not active: it needs --optimization-level 2 (given 1)");
}

TEST(OpCalTflopsFeature, MultiLatentAttentionIsAnError) {
  ResolvedFeatures r({"--op-cal-tflops", "--log-throughput", "--multi-latent-attention"});
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.message(),
            "--op-cal-tflops with --multi-latent-attention: not supported (MindSpeed's FLOP counter rejects "
            "multi-head latent attention too)");
}

TEST(AsyncLogAllreduceFeature, ActiveWithItsFlagAtLevelTwo) {
  ResolvedFeatures off({});
  ASSERT_TRUE(off.status.ok());
  EXPECT_FALSE(off.registry->active("async-log-allreduce"));
  ResolvedFeatures on({"--async-log-allreduce"});
  ASSERT_TRUE(on.status.ok()) << on.status.to_string();
  EXPECT_TRUE(on.registry->active("async-log-allreduce"));
  ResolvedFeatures low({"--async-log-allreduce", "--optimization-level", "0"});
  ASSERT_TRUE(low.status.ok());
  EXPECT_FALSE(low.registry->active("async-log-allreduce"));
  ASSERT_EQ(low.notices.size(), 1u);
  EXPECT_EQ(low.notices[0], "--async-log-allreduce is not active: it needs --optimization-level 2 (given 0)");
}

}  // namespace
}  // namespace gale
