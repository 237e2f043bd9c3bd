// MindSpeed's --context-parallel-kv-cache-policy (ContextParallelKvCacheFeature) in the registry: ring attention keeps the key/value blocks it received.
//
// Ring attention (megatron_cp_algo with --cp-comm-type p2p, and hybrid_cp_algo's ring sub-groups;
// model/ring_attention.h) passes every rank's key/value block around the ring in forward and, by
// default, again in backward. With --context-parallel-kv-cache-policy full forward keeps the N − 1
// blocks it received and backward sends only the gradient blocks; with half it keeps their keys
// and backward passes only the value halves around again. --context-parallel-cache-interval k
// caches every layer (k = 0) or the global layers 0, k + 1, 2(k + 1), ... (MindSpeed's 1-based
// layer_number % (k + 1) == 1). The results are those of the uncached ring (the same blocks in the
// same order); per cached layer backward sends N − 1 fewer blocks (full) or N − 1 fewer half blocks,
// for up to S_global·B·2·KV·HD floats of extra activation memory. Works with the double ring
// (--cp-window-size). Differences from MindSpeed: MindSpeed also takes the policy under Ulysses
// (there it keeps the pre-all-to-all keys and values and sends them again in backward); Gale
// refuses the policy outside a ring. MindSpeed's --use-ulysses-allgather-kv, part of the same
// feature class there, is implemented (model/core_attention.h, feature context-parallel-algo);
// MindSpeed requires flash
// attention (Gale's ring runs with either kernel). Level 0 (MindSpeed: L2), like the other
// context-parallel options: the engine reads the flags with the layout (train/engine.cc), so what
// runs does not depend on --optimization-level; the flags belong to the distributed argument group
// (train/arguments.cc, validated in train/arguments_parallel.cc).
// Tests: tests/parallel/ring_attention_mpi_test.cc (outputs, gradients and backward bytes per
// policy), tests/parallel/cp_extensions_invariance_mpi_test.cc, tests/parallel/
// comm_volume_mpi_test.cc, tests/train/arguments_parallel_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class ContextParallelKvCacheFeature : public Feature {
 public:
  std::string name() const override { return "context-parallel-kv-cache-policy"; }
  std::string flag() const override { return "--context-parallel-kv-cache-policy"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed ContextParallelKvCacheFeature (L2)"; }
  std::string description() const override {
    return "ring attention keeps the key/value blocks received in forward for backward: full (backward sends only "
           "gradients) or half (the keys; the values travel again); --context-parallel-cache-interval k caches every "
           "(k+1)-th layer; ring attention only (MindSpeed also takes it under Ulysses)";
  }
  bool requested(const FeatureContext& ctx) const override {
    return !ctx.args->parallel.context_parallel_kv_cache_policy.empty();
  }
};

}  // namespace

void register_feature_context_parallel_kv_cache(FeatureRegistry& registry) {
  registry.add(std::make_unique<ContextParallelKvCacheFeature>());
}

}  // namespace gale
