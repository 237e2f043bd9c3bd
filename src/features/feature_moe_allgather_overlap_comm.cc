// MindSpeed's --moe-allgather-overlap-comm (MoEAllGatherOverLapFeature) in the registry: the MoE all-gather dispatcher's exchanges overlap independent compute.
//
// What it does in Gale (model/moe_layer.h): the all-gather dispatcher (--moe-token-dispatcher-type
// allgather under expert parallelism) issues its collectives on the expert-EP group as
// non-blocking operations (Communicator::all_gather_async / reduce_scatter_async) and computes
// what does not depend on them before waiting:
//   forward:  the routing's all-gathers (chosen experts, weights) are issued first and the hidden
//             states' after them; the shared expert (model/moe_shared_expert.h) runs while all three
//             are in flight and the local experts' row layout is computed before the hidden states
//             are waited for;
//   backward: the shared expert's backward runs while the output gradients are all-gathered; the
//             routing-weight gradients' reduce-scatter is issued before the experts' backward, and
//             the token gradients' after every expert's fc1 input-gradient GEMM, so the experts'
//             fc1 weight-gradient GEMMs overlap it (MindSpeed's dx/dw sub-graph split).
// Only the order of independent work changes, so losses and gradients are bit-identical to the
// plain path (tests/parallel/moe_allgather_overlap_mpi_test.cc: EP2, also with --recompute-modules
// moe and dropped tokens, and TP2+SP × EP2 with and without expert TP).
//
// Requirements as MindSpeed's validate_args (one-line errors): a MoE model, --moe-token-dispatcher-
// type allgather, --moe-permutation-async-comm and --moe-grouped-gemm (both accepted without effect
// in Gale). Differences from MindSpeed: the exchange progresses on its group's communication thread
// (comm/mpi_communicator.h) rather than an NPU stream; MindSpeed also swaps some activations
// (its help: "async communication&swap"), Gale keeps them. Without expert parallelism there is no
// exchange, and the flag changes nothing. MindSpeed's conflict with --use-ascend-mc2
// holds already: Gale's --use-ascend-mc2 refuses every MoE model.
#include "features/registry.h"

namespace gale {

namespace {

class MoeAllgatherOverlapCommFeature : public Feature {
 public:
  std::string name() const override { return "moe-allgather-overlap-comm"; }
  std::string flag() const override { return "--moe-allgather-overlap-comm"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed MoEAllGatherOverLapFeature (L2)"; }
  std::string description() const override {
    return "MoE all-gather dispatcher: non-blocking all-gathers and reduce-scatters overlapped with the shared expert "
           "(forward and backward), the experts' backward and their fc1 weight-gradient GEMMs; bit-identical "
           "results; needs allgather, --moe-grouped-gemm, --moe-permutation-async-comm";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--moe-allgather-overlap-comm", &on_,
                    "MindSpeed: overlap the MoE all-gather dispatcher's all-gathers and reduce-scatters with the shared "
                    "expert and the experts' backward (needs --moe-token-dispatcher-type allgather, --moe-grouped-gemm, "
                    "--moe-permutation-async-comm)");
  }
  bool requested(const FeatureContext& ctx) const override { return on_; }
  Status validate(const FeatureContext& ctx) const override {
    const MoeArgs& m = ctx.args->moe;
    if (m.num_experts <= 0)
      return InvalidArgument("--moe-allgather-overlap-comm needs --num-experts (a MoE model), found no --num-experts");
    if (m.moe_token_dispatcher_type != "allgather")
      return InvalidArgument("--moe-allgather-overlap-comm: expected --moe-token-dispatcher-type allgather (as "
                             "MindSpeed), found ", m.moe_token_dispatcher_type);
    if (!m.moe_permutation_async_comm || !m.moe_grouped_gemm)
      return InvalidArgument("--moe-allgather-overlap-comm needs --moe-permutation-async-comm and --moe-grouped-gemm "
                             "(as MindSpeed), found ", m.moe_permutation_async_comm ? "" : "no --moe-permutation-async-comm",
                             !m.moe_permutation_async_comm && !m.moe_grouped_gemm ? " and " : "",
                             m.moe_grouped_gemm ? "" : "no --moe-grouped-gemm");
    return Status::Ok();
  }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    setup.ops->moe_allgather_overlap = true;
    return Status::Ok();
  }

 private:
  bool on_ = false;
};

}  // namespace

void register_feature_moe_allgather_overlap_comm(FeatureRegistry& registry) {
  registry.add(std::make_unique<MoeAllgatherOverlapCommFeature>());
}

}  // namespace gale
