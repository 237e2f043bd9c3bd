// Context parallelism (Megatron's --context-parallel-size, MindSpeed's --context-parallel-algo) in the registry.
//
// Level 0: splitting the sequence over a cp group is Megatron-core functionality, like TP and PP,
// so it runs at every --optimization-level (MindSpeed files its ContextParallelFeature under level
// 2 only because it patches Megatron's own CP with its ring kernels). Gale implements MindSpeed's
// default algorithm, megatron_cp_algo, with Megatron-Core's default --cp-comm-type p2p (ring
// attention: key/value blocks passed around the cp group, each transfer overlapped with the
// previous block's attention; model/ring_attention.h) or --cp-comm-type allgather (keys and values
// all-gathered; MindSpeed's kvallgather_cp_algo, Llama 3's all-gather CP, names the same path and
// resolves to it); ulysses_cp_algo (DeepSpeed-Ulysses: all-to-alls between the sequence and the
// head split); and hybrid_cp_algo (--ulysses-degree-in-cp U: Ulysses within sub-groups of U
// consecutive cp ranks, ring attention across them; parallel/hybrid_cp_groups.h). Megatron's
// --cp-comm-type a2a and a2a+p2p select the last two (train/arguments_parallel.cc resolves them).
// MindSpeed's --cp-window-size W (same feature class there) runs the ring as a double ring: windows
// of W consecutive ranks of the ring group pass the blocks among themselves, and each round's
// first block travels to the next window meanwhile (LoongTrain; model/ring_attention.h), with
// megatron_cp_algo's ring and hybrid_cp_algo's rings (1 <= W < ring size, W dividing it).
// Ulysses with fewer query groups per TP rank than its degree (the degree a multiple of them) hands
// each group's key and value to the ranks of its heads (MindSpeed's repeat all-to-all), and
// MindSpeed's --use-ulysses-allgather-kv (one group per TP rank) sends only the queries through the
// all-to-all and all-gathers the keys and values (model/core_attention.h).
// Tests: tests/parallel/invariance_mpi_test.cc, cp_extensions_invariance_mpi_test.cc,
// ulysses_gqa_invariance_mpi_test.cc,
// ring_attention_mpi_test.cc, comm_volume_mpi_test.cc, tests/train/arguments_parallel_test.cc.
// The flags belong to the distributed argument group (train/arguments.cc), which validates them.
#include "features/registry.h"

namespace gale {

namespace {

class ContextParallelFeature : public Feature {
 public:
  std::string name() const override { return "context-parallel-algo"; }
  std::string flag() const override { return "--context-parallel-algo"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 0; }
  std::string counterpart() const override {
    return "Megatron context parallelism; MindSpeed ContextParallelFeature / UlyssesContextParallelFeature (L2), "
           "hybrid_cp_algo, kvallgather_cp_algo";
  }
  std::string description() const override {
    return "--context-parallel-size N: each sequence cut into 2N chunks (rank r: chunks r and 2N-1-r); "
           "megatron_cp_algo passes key/value blocks around the cp ring, overlapping each send/recv with "
           "attention (--cp-comm-type p2p, default) or all-gathers them (allgather; kvallgather_cp_algo: the same "
           "all-gather of keys and values, queries local, dK/dV reduce-scattered), "
           "ulysses_cp_algo trades the sequence split for a head split with all-to-alls (with fewer query groups "
           "than ranks each group's key and value go to the ranks of its heads; --use-ulysses-allgather-kv with one "
           "group per TP rank: queries by all-to-all, keys and values all-gathered), "
           "hybrid_cp_algo (--ulysses-degree-in-cp U) runs Ulysses within groups of U consecutive cp ranks and "
           "the ring across the CP/U groups; Megatron's --cp-comm-type a2a runs as ulysses_cp_algo and a2a+p2p "
           "(--hierarchical-context-parallel-sizes A P) as hybrid_cp_algo with U = A; --cp-window-size W runs either "
           "ring as a double ring (windows of W ranks, an outer ring across them)";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->parallel.context_parallel_size > 1; }
  std::string not_requested_reason(const FeatureContext& ctx) const override {
    return "not requested (--context-parallel-size 1)";
  }
};

}  // namespace

void register_feature_context_parallel(FeatureRegistry& registry) {
  registry.add(std::make_unique<ContextParallelFeature>());
}

}  // namespace gale
