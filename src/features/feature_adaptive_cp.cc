// MindSpeed's adaptive context parallelism (AdaptiveContextParallelFeature, --context-parallel-algo adaptive_cp_algo | hybrid_adaptive_cp_algo) in the registry.
//
// Ring attention over a layout of the sequence chosen from the micro-batch's attention mask
// (parallel/adaptive_cp.h): the mask's block structure (causal, per document with
// --reset-attention-mask, banded with --sliding-window) is counted over units of the sequence, the
// units are re-assigned to the cp ranks so that the busiest rank has the fewest non-empty
// (query rank, key rank) blocks and the least work (unless --adaptive-cp-only-reschedule, which
// keeps the sequence in order), and the ring skips the attention of every empty block in forward
// and backward (model/ring_attention.h; the blocks still travel). --adaptive-cp-without-coarse
// remaps single positions instead of units of S/1024; --adaptive-cp-dynamic-attn-mask computes the
// layout for every micro-batch (required with document masks; otherwise it is computed once);
// --attention-mask-on-cpu is accepted without effect. hybrid_adaptive_cp_algo (with
// --ulysses-degree-in-cp U) is hybrid_cp_algo whose rings over the CP/U Ulysses groups run on an
// adaptive layout (parallel/adaptive_cp.h hybrid_cp_layout). Not supported yet, refused naming the
// flag: --adaptive-cp-manually-set-mask-list and --use-multiparameter-pipeline-model-parallel with
// it; --cp-comm-type other than p2p is an error. The double ring (--cp-window-size) and the ring's
// key/value cache apply to its ring unchanged (the skip depends only on which rank's block is visiting). Differences from MindSpeed: MindSpeed takes a general [S, S] mask set by the
// user (--cp-attention-mask-type general), clusters its rows with PCA + k-means and schedules
// rounds that also move queries to idle ranks; Gale derives the mask from its own mask flags, uses
// a greedy swap search and keeps the ring (docs/parallelism.md §11.4). Level 0 like the other
// context-parallel options (the engine reads the flags with the layout; MindSpeed: L2).
// Tests: tests/parallel/adaptive_cp_test.cc (layouts and their block counts),
// tests/parallel/adaptive_cp_invariance_mpi_test.cc (CP2, CP4, TP2·CP2 + SP, PP2·CP2, hybrid CP4·U2
// against one process),
// tests/parallel/ring_attention_mpi_test.cc (skipped blocks), tests/train/arguments_parallel_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class AdaptiveCpFeature : public Feature {
 public:
  std::string name() const override { return "adaptive-cp"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed AdaptiveContextParallelFeature (L2)"; }
  std::string description() const override {
    return "--context-parallel-algo adaptive_cp_algo: ring attention over a layout chosen from the mask (causal, "
           "documents, sliding window; with --window-attn-skip-freq's full layers, no window): units of the sequence re-assigned to the cp ranks to minimise the busiest "
           "rank's non-empty blocks and work (--adaptive-cp-only-reschedule: in order; --adaptive-cp-without-coarse: "
           "single positions), the empty (query rank, key rank) blocks skipped in forward and backward; "
           "--adaptive-cp-dynamic-attn-mask: a layout per micro-batch (required with --reset-attention-mask); "
           "hybrid_adaptive_cp_algo (--ulysses-degree-in-cp U): Ulysses groups, their ring adaptive; "
           "--adaptive-cp-manually-set-mask-list not supported yet";
  }
  bool requested(const FeatureContext& ctx) const override {
    const ParallelArgs& p = ctx.args->parallel;
    const bool named = p.adaptive_cp || p.context_parallel_algo == "adaptive_cp_algo" ||
                       p.context_parallel_algo == "hybrid_adaptive_cp_algo";
    return named && p.context_parallel_size > 1;
  }
  std::string not_requested_reason(const FeatureContext& ctx) const override {
    return "not requested (algorithm adaptive_cp_algo with a context-parallel size above 1)";
  }
};

}  // namespace

void register_feature_adaptive_cp(FeatureRegistry& registry) { registry.add(std::make_unique<AdaptiveCpFeature>()); }

}  // namespace gale
