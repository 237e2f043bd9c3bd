// MindSpeed's --moe-allgather-overlap-comm in the registry: an implemented level-2 feature, what it
// installs (the op table's switch), and every refusal as one line naming the flags.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

const std::vector<std::string> kMoe = {"--num-layers", "4", "--num-experts", "4", "--moe-token-dispatcher-type",
                                       "allgather", "--moe-grouped-gemm", "--moe-permutation-async-comm"};

TEST(MoeAllgatherOverlapFeature, OffByDefaultAndInstallsTheSwitch) {
  ResolvedFeatures plain(kMoe);
  ASSERT_TRUE(plain.status.ok()) << plain.status.to_string();
  const Feature* f = plain.registry->find("moe-allgather-overlap-comm");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->flag(), "--moe-allgather-overlap-comm");
  EXPECT_FALSE(plain.registry->active("moe-allgather-overlap-comm"));
  EXPECT_FALSE(plain.ops.moe_allgather_overlap);
  ResolvedFeatures on = resolve(kMoe, {"--moe-allgather-overlap-comm"});
  ASSERT_TRUE(on.status.ok()) << on.status.to_string();
  EXPECT_TRUE(on.registry->active("moe-allgather-overlap-comm"));
  EXPECT_TRUE(on.ops.moe_allgather_overlap);
  EXPECT_FALSE(on.ops.moe_alltoall_overlap);
}

TEST(MoeAllgatherOverlapFeature, RefusalsNameTheFlags) {
  expect_one_line_refusal({"--moe-allgather-overlap-comm"}, "--moe-allgather-overlap-comm needs --num-experts");
  expect_one_line_refusal({"--num-experts", "4", "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm",
                "--moe-permutation-async-comm", "--moe-allgather-overlap-comm"},
               "expected --moe-token-dispatcher-type allgather (as MindSpeed), found alltoall");
  expect_one_line_refusal({"--num-experts", "4", "--moe-grouped-gemm", "--moe-allgather-overlap-comm"},
               "needs --moe-permutation-async-comm and --moe-grouped-gemm (as MindSpeed), found no "
               "--moe-permutation-async-comm");
  expect_one_line_refusal({"--num-experts", "4", "--moe-permutation-async-comm", "--moe-allgather-overlap-comm"},
               "found no --moe-grouped-gemm");
  expect_one_line_refusal({"--num-experts", "4", "--moe-allgather-overlap-comm"},
               "found no --moe-permutation-async-comm and no --moe-grouped-gemm");
}

}  // namespace
}  // namespace gale
