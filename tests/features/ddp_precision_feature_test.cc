// Megatron's --ddp-reduce-scatter-with-fp32-accumulation, --ddp-param-name-patterns-for-fp32-local-
// accumulation and --create-all-gather-group in the registry: parsed, active where they act, off with
// Megatron's warning where the gradients already accumulate in fp32, and the combinations Megatron
// (or Gale) does not support refused by name. What they do: tests/comm/reduce_scatter_fp32_accumulation_mpi_test.cc,
// tests/optim/ddp_precision_mpi_test.cc.
#include <gtest/gtest.h>

#include "features/resolved_features.h"
#include "train/ddp_precision.h"

namespace gale {
namespace {

bool has_notice(const ResolvedFeatures& r, const std::string& part) {
  for (const std::string& n : r.notices)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

TEST(DdpPrecisionFeature, ThreeMegatronLevelZeroFeatures) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (const char* name : {"ddp-reduce-scatter-with-fp32-accumulation",
                           "ddp-param-name-patterns-for-fp32-local-accumulation", "create-all-gather-group"}) {
    const Feature* f = r.registry->find(name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_TRUE(f->implemented());
    EXPECT_EQ(f->level(), 0);
    EXPECT_EQ(f->module(), FeatureModule::kMegatron);
    EXPECT_FALSE(r.registry->active(name));
  }
  EXPECT_FALSE(r.args.parallel.ddp_reduce_scatter_with_fp32_accumulation);
  EXPECT_TRUE(r.args.parallel.ddp_param_name_patterns_for_fp32_local_accumulation.empty());
  EXPECT_FALSE(r.args.parallel.create_all_gather_group);
}

TEST(DdpPrecisionFeature, ReduceScatterActiveWithBf16ReductionAndTheDistributedOptimizer) {
  for (const char* bf16_flag : {"--grad-reduce-in-bf16", "--main-grads-dtype"}) {
    std::vector<std::string> argv = {"--bf16", "--use-distributed-optimizer", "--ddp-reduce-scatter-with-fp32-accumulation",
                                     bf16_flag};
    if (std::string(bf16_flag) == "--main-grads-dtype")
      argv.insert(argv.end(), {"bf16", "--use-precision-aware-optimizer"});
    ResolvedFeatures r(argv);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("ddp-reduce-scatter-with-fp32-accumulation")) << bf16_flag;
    EXPECT_TRUE(reduce_scatter_with_fp32_accumulation(r.args));
  }
  // fp32 training: the f32 buffer is reduce-scattered by the all-to-all and a rank-ordered f32 sum.
  ResolvedFeatures f32({"--use-distributed-optimizer", "--ddp-reduce-scatter-with-fp32-accumulation"});
  ASSERT_TRUE(f32.status.ok());
  EXPECT_TRUE(f32.registry->active("ddp-reduce-scatter-with-fp32-accumulation"));
}

TEST(DdpPrecisionFeature, ReduceScatterOffWithMegatronsWarningWhenGradientsAccumulateInFp32) {
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{"--bf16", "--use-distributed-optimizer", "--ddp-reduce-scatter-with-fp32-accumulation"},
        std::vector<std::string>{"--use-distributed-optimizer", "--accumulate-allreduce-grads-in-fp32",
                                 "--ddp-reduce-scatter-with-fp32-accumulation"}}) {
    ResolvedFeatures r(argv);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_FALSE(r.registry->active("ddp-reduce-scatter-with-fp32-accumulation"));
    EXPECT_FALSE(reduce_scatter_with_fp32_accumulation(r.args));
    EXPECT_TRUE(has_notice(r, "Setting args.ddp_reduce_scatter_with_fp32_accumulation to False since "
                              "--accumulate-allreduce-grads-in-fp32 already reduces in fp32"));
  }
  ResolvedFeatures no_distopt({"--bf16", "--grad-reduce-in-bf16", "--ddp-reduce-scatter-with-fp32-accumulation"});
  ASSERT_TRUE(no_distopt.status.ok());
  EXPECT_FALSE(no_distopt.registry->active("ddp-reduce-scatter-with-fp32-accumulation"));
  EXPECT_TRUE(has_notice(no_distopt, "without --use-distributed-optimizer the gradients are all-reduced"));
}

TEST(DdpPrecisionFeature, ReduceScatterRefusals) {
  // --grad-reduce-in-bf16 refuses several instances itself; fp32 training reaches this rule.
  expect_one_line_refusal({"--use-distributed-optimizer", "--ddp-reduce-scatter-with-fp32-accumulation",
                           "--num-distributed-optimizer-instances", "2"},
                          "--ddp-reduce-scatter-with-fp32-accumulation: not supported with "
                          "--num-distributed-optimizer-instances > 1 (Megatron's rule), found 2");
  expect_one_line_refusal({"--use-distributed-optimizer", "--ddp-reduce-scatter-with-fp32-accumulation", "--quant-grads"},
                          "--ddp-reduce-scatter-with-fp32-accumulation: conflicts with --quant-grads");
  expect_one_line_refusal({"--ddp-reduce-scatter-with-fp32-accumulation", "--use-torch-fsdp2",
                           "--untie-embeddings-and-output-weights"},
                          "--ddp-reduce-scatter-with-fp32-accumulation with ZeRO-2/3 (--use-torch-fsdp2): not "
                          "supported yet");
}

TEST(DdpPrecisionFeature, PatternsNeedGradientsNotAlreadyInFp32) {
  ResolvedFeatures r({"--bf16", "--grad-reduce-in-bf16", "--ddp-param-name-patterns-for-fp32-local-accumulation",
                      "*.linear_fc1.weight", "all"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.registry->active("ddp-param-name-patterns-for-fp32-local-accumulation"));
  EXPECT_EQ(r.args.parallel.ddp_param_name_patterns_for_fp32_local_accumulation,
            (std::vector<std::string>{"*.linear_fc1.weight", "all"}));
  // Megatron's assert on ddp_config.grad_reduce_in_fp32.
  expect_one_line_refusal({"--bf16", "--ddp-param-name-patterns-for-fp32-local-accumulation", "all"},
                          "--ddp-param-name-patterns-for-fp32-local-accumulation: Only need to explicitly specify "
                          "param_name patterns for FP32 local accumulation if .main_grads aren't already in FP32 "
                          "(Megatron's rule); found the gradients accumulated in fp32 (--bf16 without "
                          "--grad-reduce-in-bf16 or --main-grads-dtype bf16)");
  expect_one_line_refusal({"--accumulate-allreduce-grads-in-fp32", "--ddp-param-name-patterns-for-fp32-local-accumulation",
                           "all"},
                          "aren't already in FP32 (Megatron's rule); found the gradients accumulated in fp32 "
                          "(--accumulate-allreduce-grads-in-fp32)");
  ResolvedFeatures bare({"--ddp-param-name-patterns-for-fp32-local-accumulation"});
  EXPECT_FALSE(bare.status.ok()) << "nargs='+': at least one pattern";
  // fp32 training: accepted (Megatron's rule passes) but nothing to promote.
  ResolvedFeatures f32({"--ddp-param-name-patterns-for-fp32-local-accumulation", "all"});
  ASSERT_TRUE(f32.status.ok());
  EXPECT_FALSE(f32.registry->active("ddp-param-name-patterns-for-fp32-local-accumulation"));
  EXPECT_TRUE(has_notice(f32, "nothing to promote"));
}

TEST(DdpPrecisionFeature, AllGatherGroup) {
  ResolvedFeatures r({"--use-distributed-optimizer", "--overlap-param-gather", "--overlap-grad-reduce",
                      "--create-all-gather-group"});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_TRUE(r.registry->active("create-all-gather-group"));
  ResolvedFeatures unused({"--create-all-gather-group"});
  ASSERT_TRUE(unused.status.ok());
  EXPECT_FALSE(unused.registry->active("create-all-gather-group"));
  EXPECT_TRUE(has_notice(unused, "no group is created"));
  expect_one_line_refusal({"--create-all-gather-group", "--use-torch-fsdp2", "--untie-embeddings-and-output-weights"},
                          "--create-all-gather-group with ZeRO-2/3 (--use-torch-fsdp2): not supported yet");
}

}  // namespace
}  // namespace gale
