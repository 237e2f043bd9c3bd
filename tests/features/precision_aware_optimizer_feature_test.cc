// Megatron's precision-aware optimizer in the registry: implemented, Megatron module, level 0 (active
// whenever one of its flags is given); Megatron's rules (every dtype fp32 without
// --use-precision-aware-optimizer; adam and the distributed optimizer with it; --main-grads-dtype vs
// --accumulate-allreduce-grads-in-fp32 under --bf16) and Gale's limits are one-line errors naming the
// flags; --grad-reduce-in-bf16 reduces in bf16 only under --bf16 and overrides
// --accumulate-allreduce-grads-in-fp32, as in Megatron.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

const std::vector<std::string> kPa = {"--use-precision-aware-optimizer", "--use-distributed-optimizer"};

std::vector<std::string> with_pa(std::vector<std::string> extra) {
  extra.insert(extra.begin(), kPa.begin(), kPa.end());
  return extra;
}

TEST(PrecisionAwareOptimizerFeature, ImplementedLevelZeroMegatronFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("precision-aware-optimizer");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(f->module(), FeatureModule::kMegatron);
  EXPECT_EQ(f->flag(), "--use-precision-aware-optimizer");
  EXPECT_FALSE(r.registry->active("precision-aware-optimizer"));
  EXPECT_FALSE(r.args.training.bf16_grad_reduce());
}

TEST(PrecisionAwareOptimizerFeature, ActiveWhenRequested) {
  for (const std::vector<std::string>& argv :
       {kPa, with_pa({"--exp-avg-dtype", "fp8", "--exp-avg-sq-dtype", "fp16"}),
        with_pa({"--bf16", "--reuse-fp32-param", "--exp-avg-dtype", "fp16"}),
        with_pa({"--bf16", "--main-grads-dtype", "bf16"}), std::vector<std::string>{"--bf16", "--grad-reduce-in-bf16"},
        // Megatron: --grad-reduce-in-bf16 turns --accumulate-allreduce-grads-in-fp32 off.
        std::vector<std::string>{"--bf16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"},
        std::vector<std::string>{"--grad-reduce-in-bf16"}}) {
    ResolvedFeatures r(argv);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("precision-aware-optimizer")) << argv[0];
  }
  EXPECT_TRUE(ResolvedFeatures({"--bf16", "--grad-reduce-in-bf16"}).args.training.bf16_grad_reduce());
  EXPECT_TRUE(ResolvedFeatures(with_pa({"--bf16", "--main-grads-dtype", "bf16"})).args.training.bf16_grad_reduce());
  // Without --bf16 Megatron's gradient buffer has the parameters' dtype: the flags change nothing.
  EXPECT_FALSE(ResolvedFeatures({"--grad-reduce-in-bf16"}).args.training.bf16_grad_reduce());
  EXPECT_FALSE(ResolvedFeatures(with_pa({"--main-grads-dtype", "bf16"})).args.training.bf16_grad_reduce());
  // Megatron: --optimizer-cpu-offload (a no-op in Gale) only with the precision-aware optimizer.
  EXPECT_TRUE(validated_pretrain_args(with_pa({"--optimizer-cpu-offload"})).ok());
  const Status offload = validated_pretrain_args({"--optimizer-cpu-offload"});
  ASSERT_FALSE(offload.ok());
  EXPECT_NE(offload.message().find("--optimizer-cpu-offload must be used with --use-precision-aware-optimizer"),
            std::string::npos)
      << offload.message();
  // --accumulate-allreduce-grads-in-fp32 is Gale's default behaviour, accepted alone.
  EXPECT_TRUE(ResolvedFeatures({"--bf16", "--accumulate-allreduce-grads-in-fp32"}).status.ok());
}

TEST(PrecisionAwareOptimizerFeature, RefusesWhatItCannotServe) {
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> expected;  // what the one-line error names
  };
  const Case cases[] = {
      {{"--exp-avg-dtype", "fp16"}, {"--exp-avg-dtype fp16", "--use-precision-aware-optimizer"}},
      {{"--exp-avg-sq-dtype", "fp8"}, {"--exp-avg-sq-dtype fp8", "--use-precision-aware-optimizer"}},
      {{"--main-grads-dtype", "bf16"}, {"--main-grads-dtype bf16", "--use-precision-aware-optimizer"}},
      {{"--main-params-dtype", "fp16"}, {"--main-params-dtype fp16", "--use-precision-aware-optimizer"}},
      {{"--use-precision-aware-optimizer"}, {"--use-precision-aware-optimizer", "--use-distributed-optimizer"}},
      {with_pa({"--optimizer", "sgd"}), {"--use-precision-aware-optimizer", "--optimizer adam", "--optimizer sgd"}},
      {with_pa({"--main-params-dtype", "fp16"}), {"--main-params-dtype fp16", "not supported yet"}},
      {with_pa({"--quant-states", "fp8"}), {"--use-precision-aware-optimizer", "--quant-states fp8"}},
      {with_pa({"--quant-grads"}), {"--use-precision-aware-optimizer", "--quant-grads"}},
      {with_pa({"--swap-optimizer"}), {"--use-precision-aware-optimizer", "--swap-optimizer"}},
      {with_pa({"--compress-optimizer"}), {"--use-precision-aware-optimizer", "--compress-optimizer"}},
      {with_pa({"--optimizer-selection", "fused_ema_adamw"}),
       {"--use-precision-aware-optimizer", "fused_ema_adamw", "not supported yet"}},
      {with_pa({"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads"}),
       {"--use-precision-aware-optimizer", "optim_grads", "not supported yet"}},
      {with_pa({"--bf16", "--accumulate-allreduce-grads-in-fp32", "--main-grads-dtype", "bf16"}),
       {"--main-grads-dtype bf16", "--accumulate-allreduce-grads-in-fp32"}},
      {{"--bf16", "--grad-reduce-in-bf16", "--quant-grads"}, {"--grad-reduce-in-bf16", "--quant-grads"}},
      {{"--bf16", "--grad-reduce-in-bf16", "--use-custom-fsdp", "--data-parallel-sharding-strategy",
        "optim_grads_params"},
       {"--grad-reduce-in-bf16", "optim_grads_params", "not supported yet"}},
      {{"--bf16", "--grad-reduce-in-bf16", "--use-distributed-optimizer", "--num-distributed-optimizer-instances",
        "2"},
       {"--grad-reduce-in-bf16", "--num-distributed-optimizer-instances 2", "not supported yet"}},
      {{"--bf16", "--grad-reduce-in-bf16", "--pipeline-model-parallel-size", "2", "--num-layers", "4",
        "--schedules-method", "dualpipev", "--dualpipev-dw-detach"},
       {"--grad-reduce-in-bf16", "--dualpipev-dw-detach", "not supported yet"}},
  };
  for (const Case& c : cases) {
    ResolvedFeatures r(c.flags);
    ASSERT_FALSE(r.status.ok()) << c.expected[0];
    const std::string m = r.status.message();
    for (const std::string& e : c.expected) EXPECT_NE(m.find(e), std::string::npos) << m << " lacks " << e;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace gale
