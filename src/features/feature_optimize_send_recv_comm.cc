// MindSpeed's --optimize-send-recv-comm (OptimizeSendRecvCommFeature) in the registry: the 1F1B schedule's gradients on a communicator of their own.
//
// What MindSpeed does (mindspeed/core/pipeline_parallel/optimize_send_recv_comm and
// flexible_schedules.py): when the run has no virtual pipeline stages, it replaces Megatron's 1F1B
// with a step list (warm-up forwards, forward/backward pairs, cool-down backwards) in which every
// forward receives its input from the previous stage, computes, and sends its output without
// waiting, and every backward likewise for the gradients; batched p2p is switched off (each
// transfer its own isend/irecv, instead of Megatron's send_forward_recv_backward pairs), and the
// gradients travel on a second process group over the same pipeline ranks ("pp_new_stream",
// created next to Megatron's groups), on their own stream, so the two directions never queue
// behind each other.
//
// What it does in Gale: Gale's pipeline transfers are already single non-blocking sends and
// receives completed in the background (schedule/pipeline_p2p.h: receives posted three steps ahead,
// sends never waited for by the step), in Megatron's 1F1B order. The flag adds the second
// communicator: build_engine makes "pp-backward" over ps.pp()'s ranks (Engine::pp_backward) and the
// 1F1B schedule's PipelineP2P sends and receives the gradients on it, the activations on ps.pp().
// Nothing a step computes changes, so losses and gradients are bitwise those of the run without
// (tests/parallel/optimize_send_recv_comm_mpi_test.cc, also with --variable-seq-lengths, which
// MindSpeed's version supports through its shape exchange and Gale's through the shapes every
// stage knows).
//
// Rules: level 2 (parallel module), as MindSpeed's. With interleaving (virtual pipeline stages)
// MindSpeed leaves its patch out without a word; Gale refuses the combination, and DualPipeV
// likewise, naming the flags. Without pipelining (--pipeline-model-parallel-size 1) nothing is
// sent: the feature is inactive with a notice.
#include "features/registry.h"

namespace gale {

namespace {

class OptimizeSendRecvCommFeature : public Feature {
 public:
  std::string name() const override { return "optimize-send-recv-comm"; }
  std::string flag() const override { return "--optimize-send-recv-comm"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed OptimizeSendRecvCommFeature (L2)"; }
  std::string description() const override {
    return "1F1B without interleaving: the gradients travel on a second communicator over the pipeline group "
           "(pp-backward), the activations on the pipeline group, each transfer a single non-blocking send/receive; "
           "bitwise the same results";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->parallel.optimize_send_recv_comm; }
  Status validate(const FeatureContext& ctx) const override {
    const ParallelArgs& p = ctx.args->parallel;
    if (p.schedules_method == "dualpipev")
      return InvalidArgument("--optimize-send-recv-comm applies to the 1F1B schedule without interleaving (as "
                             "MindSpeed's), found --schedules-method dualpipev");
    const bool interleaved = p.virtual_pipeline_model_parallel_size > 1 ||
                             p.num_layers_per_virtual_pipeline_stage != kUnset ||
                             (p.num_virtual_stages_per_pipeline_rank != kUnset && p.num_virtual_stages_per_pipeline_rank > 1);
    if (interleaved)
      return InvalidArgument("--optimize-send-recv-comm applies to the 1F1B schedule without interleaving (as "
                             "MindSpeed's), found virtual pipeline stages (",
                             p.num_layers_per_virtual_pipeline_stage != kUnset ? "--num-layers-per-virtual-pipeline-stage"
                             : p.num_virtual_stages_per_pipeline_rank != kUnset
                                 ? "--num-virtual-stages-per-pipeline-rank"
                                 : "--pipeline-model-parallel-layout",
                             ")");
    return Status::Ok();
  }
  bool applicable(const FeatureContext& ctx, std::string* why) const override {
    if (ctx.args->parallel.pipeline_model_parallel_size > 1) return true;
    *why = "no pipeline (--pipeline-model-parallel-size 1): nothing is sent between stages";
    return false;
  }
};

}  // namespace

void register_feature_optimize_send_recv_comm(FeatureRegistry& registry) {
  registry.add(std::make_unique<OptimizeSendRecvCommFeature>());
}

}  // namespace gale
