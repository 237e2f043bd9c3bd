// MindSpeed's --moe-alltoall-overlap-comm (MoEAlltoAllOverLapFeature) in the registry: the MoE all-to-all exchanges overlap independent compute.
//
// What it does in Gale (model/moe_layer.h, model/moe_dispatch.h): the all-to-all dispatcher issues
// its exchanges as non-blocking all_to_allv operations (dispatch_rows_async / combine_rows_async,
// Communicator::all_to_allv_async) and runs compute that does not depend on them before waiting:
//   forward:  the shared expert (model/moe_shared_expert.h) while the routed rows are dispatched
//             (what --moe-shared-expert-overlap does);
//   backward: the shared expert's backward (and, under --moe-zero-memory level1, its rerun) while
//             the output gradients are dispatched, and the experts' fc1 weight-gradient GEMMs while
//             the input gradients are combined back (they are issued after the fc1 input-gradient
//             GEMMs, MindSpeed's dx/dw split in GroupedMlpWithCompAndCommOverlapAll2All).
// Only the order of independent work changes, so losses and gradients are bit-identical to the
// plain path (tests: tests/parallel/moe_zero_memory_mpi_test.cc under EP2 and TP2×EP2,
// tests/model/moe_zero_memory_test.cc single-process).
//
// Requirements as MindSpeed's validate_args (one-line errors): a MoE model, the alltoall dispatcher
// (MindSpeed: alltoall_seq, which Gale does not have; its documentation says alltoall),
// --moe-permutation-async-comm and --moe-grouped-gemm (both accepted without effect in Gale).
// Differences from MindSpeed: tensor parallelism (and expert TP) is allowed without
// --moe-tp-extend-ep (Gale's shared expert and expert-TP exchanges run on their own groups, which
// may interleave with the EP exchange); the exchange progresses on its group's communication
// thread (comm/mpi_communicator.h) rather than an NPU stream; MindSpeed's forward also overlaps the
// shared expert's TP all-gather, which in Gale stays inside the shared expert's own forward.
#include "features/registry.h"

namespace gale {

namespace {

class MoeAlltoallOverlapCommFeature : public Feature {
 public:
  std::string name() const override { return "moe-alltoall-overlap-comm"; }
  std::string flag() const override { return "--moe-alltoall-overlap-comm"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed MoEAlltoAllOverLapFeature (L2)"; }
  std::string description() const override {
    return "MoE all-to-all dispatcher: non-blocking dispatch/combine overlapped with the shared expert (forward "
           "and backward) and the experts' fc1 weight-gradient GEMMs; bit-identical results; needs alltoall, "
           "--moe-grouped-gemm, --moe-permutation-async-comm";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--moe-alltoall-overlap-comm", &on_,
                    "MindSpeed: overlap the MoE all-to-all dispatch/combine with the shared expert and the experts' "
                    "weight-gradient GEMMs (needs --moe-token-dispatcher-type alltoall, --moe-grouped-gemm, "
                    "--moe-permutation-async-comm)");
  }
  bool requested(const FeatureContext& ctx) const override { return on_; }
  Status validate(const FeatureContext& ctx) const override {
    const MoeArgs& m = ctx.args->moe;
    if (m.num_experts <= 0)
      return InvalidArgument("--moe-alltoall-overlap-comm needs --num-experts (a MoE model), found no --num-experts");
    if (m.moe_token_dispatcher_type != "alltoall")
      return InvalidArgument("--moe-alltoall-overlap-comm: expected --moe-token-dispatcher-type alltoall (as MindSpeed), "
                             "found ", m.moe_token_dispatcher_type);
    if (!m.moe_permutation_async_comm || !m.moe_grouped_gemm)
      return InvalidArgument("--moe-alltoall-overlap-comm needs --moe-permutation-async-comm and --moe-grouped-gemm "
                             "(as MindSpeed), found ", m.moe_permutation_async_comm ? "" : "no --moe-permutation-async-comm",
                             !m.moe_permutation_async_comm && !m.moe_grouped_gemm ? " and " : "",
                             m.moe_grouped_gemm ? "" : "no --moe-grouped-gemm");
    return Status::Ok();
  }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    setup.ops->moe_alltoall_overlap = true;
    return Status::Ok();
  }

 private:
  bool on_ = false;
};

}  // namespace

void register_feature_moe_alltoall_overlap_comm(FeatureRegistry& registry) {
  registry.add(std::make_unique<MoeAlltoallOverlapCommFeature>());
}

}  // namespace gale
