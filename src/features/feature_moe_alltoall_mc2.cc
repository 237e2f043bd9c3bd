// MindSpeed's --moe-alltoall-mc2 (MoEAlltoAllMC2Feature) in the registry: the MoE all-to-all dispatcher's fused dispatch and combine.
//
// What it does in Gale (model/moe_mc2.h): MindSpeed's MC2 kernels fuse the all-to-all exchange
// with the permutation and the expert GEMMs on the NPU; on Gale's CPU/MPI engine the fusion is
// the data movement around the experts:
//   dispatch: each permuted row written straight from x (backward: the output gradient q·dy, and
//             the routing-weight gradient with it) to its destination: this rank's experts'
//             expert-major input, or a send buffer of only the other ranks' rows; each (rank,
//             local expert) chunk received straight at its expert-major place (the plain path's
//             permuted tensor, source-major receive buffer and sort copy are gone);
//   combine:  the experts' output rows (backward: input gradients) sent straight from the
//             expert-major layout (no unsort copy), and the weighted un-permutation (backward: the
//             input gradients' sum) reduced token by token from where the rows land.
// Every token's rows are summed in the plain path's order with the same kernels, so losses and
// gradients are bit-identical to the plain alltoall dispatcher (tests/parallel/
// moe_alltoall_mc2_mpi_test.cc: EP2 and EP4, token dropping, padding to capacity, a shared
// expert, full recompute, TP2 with expert TP 1).
//
// Requirements and conflicts as MindSpeed's validate_args (one-line errors): a MoE model, the
// alltoall dispatcher (MindSpeed also alltoall_seq, which Gale does not have), expert-TP size 1;
// conflicts with --use-ascend-mc2, --moe-alltoall-overlap-comm (so also --moe-zero-memory, which
// needs it), --moe-allgather-overlap-comm, --moe-fb-overlap and --moe-tp-extend-ep.
// Differences from MindSpeed: token dropping (--moe-expert-capacity-factor, with or without
// --moe-pad-expert-input-to-capacity) is supported (MindSpeed: dropless only); a shared expert
// does not switch --moe-shared-expert-overlap on (it works with or without it). Not supported
// yet: --enable-expert-placement and --balanced-moe-experts.
#include <cmath>

#include "features/registry.h"

namespace gale {

namespace {

class MoeAlltoallMc2Feature : public Feature {
 public:
  std::string name() const override { return "moe-alltoall-mc2"; }
  std::string flag() const override { return "--moe-alltoall-mc2"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed MoEAlltoAllMC2Feature (L2)"; }
  std::string description() const override {
    return "MoE all-to-all dispatcher: fused dispatch (rows written straight into the exchange and received straight "
           "into the experts' layout) and combine (sent straight from the experts' rows, weighted and summed per "
           "token where they land); bit-identical results; needs alltoall and expert-TP 1";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--moe-alltoall-mc2", &on_,
                    "MindSpeed: fused dispatch and combine of the MoE all-to-all dispatcher (needs "
                    "--moe-token-dispatcher-type alltoall and expert-tensor-parallel size 1)");
  }
  bool requested(const FeatureContext& ctx) const override { return on_; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const MoeArgs& m = a.moe;
    if (m.num_experts <= 0)
      return InvalidArgument("--moe-alltoall-mc2 needs --num-experts (a MoE model), found no --num-experts");
    if (m.moe_token_dispatcher_type != "alltoall")
      return InvalidArgument("--moe-alltoall-mc2: expected --moe-token-dispatcher-type alltoall (as MindSpeed), found ",
                             m.moe_token_dispatcher_type);
    const int64_t etp = m.expert_tensor_parallel_size == kUnset ? a.parallel.tensor_model_parallel_size
                                                                : m.expert_tensor_parallel_size;
    if (etp != 1)
      return InvalidArgument("--moe-alltoall-mc2 needs expert-tensor-parallel size 1 (as MindSpeed; "
                             "--expert-tensor-parallel-size 1, or no --tensor-model-parallel-size), found ", etp);
    for (const char* other : {"--use-ascend-mc2", "--moe-alltoall-overlap-comm", "--moe-allgather-overlap-comm",
                              "--moe-fb-overlap"})
      if (ctx.parser->was_set(other))
        return InvalidArgument("--moe-alltoall-mc2 conflicts with ", other, " (as MindSpeed), found both");
    if (m.moe_tp_extend_ep)
      return InvalidArgument("--moe-alltoall-mc2 conflicts with --moe-tp-extend-ep (as MindSpeed), found both");
    for (const char* other : {"--enable-expert-placement", "--balanced-moe-experts"})
      if (ctx.parser->was_set(other)) return Unimplemented("--moe-alltoall-mc2 with ", other, ": not supported yet");
    return Status::Ok();
  }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    setup.ops->moe_alltoall_mc2 = true;
    return Status::Ok();
  }

 private:
  bool on_ = false;
};

}  // namespace

void register_feature_moe_alltoall_mc2(FeatureRegistry& registry) {
  registry.add(std::make_unique<MoeAlltoallMc2Feature>());
}

}  // namespace gale
