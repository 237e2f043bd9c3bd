// MindSpeed's --moe-zero-memory level0|level1 (MoEZeroMemoryFeature) in the registry: a MoE layer drops expert activations and re-communicates / recomputes them in backward.
//
// MindSpeed (GroupedMlpWithCompAndCommOverlapAll2All, MoELayerOverlapAll2All): level0 frees the
// experts' input (the dispatched tokens) after fc1 and the activation output after fc2; backward
// recomputes the activation from the kept fc1 output and gets the input back by permuting the
// layer input again and redoing the dispatch all-to-all (overlapped with the fc1 input-gradient
// GEMM). level1 frees the fc1 output as well, and the shared expert's fc1/activation outputs; at
// the start of backward it re-permutes, re-dispatches and recomputes fc1, the activation and the
// shared expert's. --moe-zero-memory-num-layers k: level1 only in the first k layers of each
// pipeline stage, level0 in the others (unset or 0: every layer, as MindSpeed's test of k).
//
// Gale (model/moe_layer.h, config.h MoeZeroMemory): MoeSaved keeps neither expert_in nor act
// (level0) nor fc1_out (level1); the routed backward re-gathers the permuted rows of the kept input
// x and re-dispatches them with the same plan (under expert TP, all-gathers them again), level1
// recomputes each expert's fc1 GEMM and activation with the forward's kernels, and a level1 layer's
// shared expert reruns its forward in backward (like --recompute-modules shared_experts). Same
// kernels on the same inputs: losses and gradients are bit-identical to no zero memory. The
// re-dispatch is issued with the output gradients' dispatch (level1 before it, level0 after it),
// so the shared expert's backward overlaps both. Differences: the layer count uses Gale's
// per-chunk convention (first k layers of each model chunk, as --recompute-activation-function-
// num-layers; MindSpeed interleaves chunks under virtual pipelining); Gale keeps the routing
// weights [T, k] (small) instead of recomputing their gradient inputs earlier; no NPU swap.
// Rules (one-line errors): level0 or level1; --moe-zero-memory-num-layers needs --moe-zero-memory
// and 0 <= k <= --num-layers / --pipeline-model-parallel-size; a MoE model; --moe-alltoall-
// overlap-comm (MindSpeed also accepts --moe-fb-overlap, not with --moe-zero-memory yet in Gale); the alltoall
// dispatcher. Tests: tests/model/moe_zero_memory_test.cc (bit identity, kept bytes level1 < level0
// < off), tests/parallel/moe_zero_memory_mpi_test.cc (EP2, TP2×EP2 with shared experts),
// tests/features/moe_zero_memory_feature_test.cc (rules).
#include "features/registry.h"

namespace gale {

namespace {

class MoeZeroMemoryFeature : public Feature {
 public:
  std::string name() const override { return "moe-zero-memory"; }
  std::string flag() const override { return "--moe-zero-memory"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed MoEZeroMemoryFeature (L2)"; }
  std::string description() const override {
    return "MoE activation memory: level0 drops the experts' input rows (re-dispatched in backward) and "
           "activations, level1 also their fc1 outputs and the shared expert's state (recomputed); "
           "[--moe-zero-memory-num-layers k]: level1 in the first k layers of each chunk; bit-identical; needs "
           "--moe-alltoall-overlap-comm";
  }
  void register_args(ArgParser& parser) override {
    parser.add_choice("--moe-zero-memory", &level_, {"disable", "level0", "level1"},
                      "MindSpeed: drop MoE expert activations in forward and re-communicate / recompute them in "
                      "backward (needs --moe-alltoall-overlap-comm)");
    parser.add("--moe-zero-memory-num-layers", &num_layers_,
               "with --moe-zero-memory level1: level1 only in the first N layers of each model chunk, level0 in the "
               "others (default or 0: every layer)");
  }
  bool requested(const FeatureContext& ctx) const override {
    return level_ != "disable" || ctx.parser->was_set("--moe-zero-memory-num-layers");
  }
  std::string not_requested_reason(const FeatureContext& ctx) const override {
    return "not requested (--moe-zero-memory level0 or level1)";
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    if (level_ == "disable")
      return InvalidArgument("--moe-zero-memory-num-layers needs --moe-zero-memory level0 or level1, found disable");
    if (ctx.parser->was_set("--moe-zero-memory-num-layers")) {
      const int64_t pp = a.parallel.pipeline_model_parallel_size, per_stage = a.model.num_layers / pp;
      if (num_layers_ < 0 || num_layers_ > per_stage)
        return InvalidArgument("--moe-zero-memory-num-layers: expected 0 to the layers per pipeline stage ", per_stage,
                               " (--num-layers / --pipeline-model-parallel-size), found ", num_layers_);
    }
    if (a.moe.num_experts <= 0)
      return InvalidArgument("--moe-zero-memory needs --num-experts (a MoE model), found no --num-experts");
    if (!ctx.parser->was_set("--moe-alltoall-overlap-comm"))
      return InvalidArgument("--moe-zero-memory needs --moe-alltoall-overlap-comm (as MindSpeed; its other option "
                             "--moe-fb-overlap is not supported with --moe-zero-memory yet), found it off");
    if (a.moe.moe_token_dispatcher_type != "alltoall")
      return InvalidArgument("--moe-zero-memory: expected --moe-token-dispatcher-type alltoall, found ",
                             a.moe.moe_token_dispatcher_type);
    return Status::Ok();
  }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    if (setup.recompute == nullptr) return Status::Ok();  // an engine without a model (gale features)
    setup.recompute->moe_zero_memory = level_ == "level1" ? MoeZeroMemory::kLevel1 : MoeZeroMemory::kLevel0;
    setup.recompute->moe_zero_memory_level1_layers = num_layers_ > 0 ? num_layers_ : RecomputePlan::kAllLayers;
    return Status::Ok();
  }

 private:
  std::string level_ = "disable";
  int64_t num_layers_ = -1;  // unset: every layer
};

}  // namespace

void register_feature_moe_zero_memory(FeatureRegistry& registry) {
  registry.add(std::make_unique<MoeZeroMemoryFeature>());
}

}  // namespace gale
