// Megatron's custom FSDP (--use-custom-fsdp, --use-megatron-fsdp) in the registry.
//
// Megatron-FSDP shards what --data-parallel-sharding-strategy says over the data-parallel group:
// no_shard (Megatron's default: nothing, plain data parallelism), optim (ZeRO-1: the optimizer
// state), optim_grads (ZeRO-2: and the gradients), optim_grads_params (ZeRO-3: and the
// parameters, all-gathered per layer before its forward and backward). Gale runs no_shard on its
// data-parallel gradient buckets (docs/parallelism.md §7), optim on its distributed optimizer
// (§8), which validate_parallel_args turns on, and optim_grads / optim_grads_params on
// optim/zero3_sync.h (build_engine; data parallelism only, fp32, the combinations it lacks refused
// at start-up; §16). The flags belong to the distributed argument group (train/arguments.cc); this
// file only lists the feature. Tests: tests/train/custom_fsdp_args_test.cc,
// tests/optim/zero3_mpi_test.cc, tests/cli/custom_fsdp_cli_test.cc.
#include "features/registry.h"
#include "features/simple_feature.h"

namespace gale {

void register_feature_custom_fsdp(FeatureRegistry& registry) {
  SimpleFeatureSpec s;
  s.name = "custom-fsdp";
  s.flag = "--use-custom-fsdp";
  s.module = FeatureModule::kMegatron;
  s.level = 0;
  s.counterpart = "Megatron-LM custom FSDP (Megatron-FSDP; --use-megatron-fsdp)";
  s.description =
      "--data-parallel-sharding-strategy no_shard (plain data parallelism), optim (ZeRO-1: the distributed "
      "optimizer), optim_grads (ZeRO-2: gradients and optimizer state sharded over DP) or optim_grads_params (ZeRO-3: "
      "and the parameters, each layer gathered for its forward and backward); ZeRO-2/3 with DP only, fp32";
  s.requested = [](const Arguments& a) { return a.parallel.use_custom_fsdp; };
  registry.add(std::make_unique<SimpleFeature>(std::move(s)));
}

}  // namespace gale
