// MindSpeed's --layerzero --layerzero-config FILE (LayerZeroFeature, level 2) in the registry.
//
// LayerZeRO is ZeRO-3 inside sub-groups of zero3_size consecutive data-parallel ranks (each
// layer's parameters all-gathered over the sub-group just before its forward and its backward,
// its gradients reduce-scattered there after its backward) plus ZeRO-1 over the whole
// data-parallel group: each sub-group shard is cut again into one piece per sub-group, the shard
// gradients are all-reduced across the sub-groups before the optimizer step, each rank updates
// its piece and the pieces are all-gathered back into the shard after it (optim/zero3_sync.h,
// Zero3Options::replicas). zero3_size = DP is plain ZeRO-3. The flags belong to the distributed
// argument group (train/arguments.cc); the YAML file's keys are read by train/layerzero_config.h
// (fp32 only; the keys MindSpeed has and Gale does not implement refused). The restrictions are
// ZeRO-3's (docs/parallelism.md §16). Level 2, as MindSpeed's. Tests:
// tests/optim/zero3_mpi_test.cc (Zero3.LayerZero*), tests/train/layerzero_config_test.cc.
#include "features/registry.h"
#include "features/simple_feature.h"

namespace gale {

void register_feature_layerzero(FeatureRegistry& registry) {
  SimpleFeatureSpec s;
  s.name = "layerzero";
  s.flag = "--layerzero";
  s.module = FeatureModule::kMultimodal;
  s.level = 2;
  s.counterpart = "MindSpeed LayerZeroFeature (L2)";
  s.description =
      "hierarchical ZeRO: ZeRO-3 inside sub-groups of zero3_size consecutive DP ranks (--layerzero-config), the "
      "optimizer state sharded over the whole DP group; DP only, fp32";
  s.requested = [](const Arguments& a) { return a.parallel.layerzero; };
  registry.add(std::make_unique<SimpleFeature>(std::move(s)));
}

}  // namespace gale
