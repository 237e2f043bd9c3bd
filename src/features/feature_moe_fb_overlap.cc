// MindSpeed's --moe-fb-overlap (MoEFwdBwdOverlapFeature) in the registry: DualPipeV's paired forward and backward interleaved at the MoE all-to-alls.
//
// What it does in Gale: in DeepSeek's DualPipeV order the steady state pairs a forward of one chunk
// and micro-batch with a backward of the other chunk and another micro-batch (phase 4: (F0, B1),
// (F1, B0); phase 5: (F1, B0); schedule/pipeline_order.h dualpipev_order's `fb_overlap`). The
// executor (schedule/pipeline_schedules.cc) receives both inputs, then runs the forward and the
// backward as two fibers on the rank's thread (core/interleave.h), switching at each MoE all-to-all
// of the alltoall dispatcher (model/moe_layer.cc): one issues its dispatch or combine, the other
// computes until its own next exchange, and only then is the first exchange waited for; then both
// outputs are sent. Each micro-batch's operations and each parameter's accumulation order are
// unchanged, so losses, gradients and parameters are bitwise those of plain DualPipeV
// (tests/parallel/moe_fb_overlap_mpi_test.cc).
//
// Requirements as MindSpeed's validate_args and feature (one-line errors): a MoE model, the alltoall
// dispatcher, --moe-grouped-gemm, expert-tensor-parallel size 1, no --overlap-grad-reduce, no
// --moe-alltoall-overlap-comm (MindSpeed: mutually exclusive) and no --moe-tp-extend-ep; the
// schedule must be --schedules-method dualpipev: MindSpeed's other carrier, the interleaved 1F1B
// schedule (--num-layers-per-virtual-pipeline-stage), is not supported yet, nor are plain 1F1B
// and no pipelining (refused, as MindSpeed). --moe-zero-memory stays refused with it (it needs
// --moe-alltoall-overlap-comm in Gale). Differences from MindSpeed: the pair's sub-layer pieces are
// split only at the all-to-alls (MindSpeed also splits attention from the MLP and the dx from the
// dw GEMMs), and the exchanges progress on the EP group's communication thread rather than an NPU
// stream.
#include "features/registry.h"

namespace gale {

namespace {

class MoeFbOverlapFeature : public Feature {
 public:
  std::string name() const override { return "moe-fb-overlap"; }
  std::string flag() const override { return "--moe-fb-overlap"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed MoEFwdBwdOverlapFeature (L2)"; }
  std::string description() const override {
    return "DualPipeV's overlapped forward/backward pairs interleaved at each MoE all-to-all (one micro-batch's "
           "exchange in flight while the other computes); bit-identical results; needs --schedules-method dualpipev, "
           "alltoall, --moe-grouped-gemm, ETP 1, no --overlap-grad-reduce / --moe-alltoall-overlap-comm "
           "(interleaved 1F1B not supported yet)";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--moe-fb-overlap", &on_,
                    "MindSpeed: interleave the forward and backward of DualPipeV's overlapped pairs so that each MoE "
                    "all-to-all of one micro-batch is in flight while the other computes (needs --schedules-method "
                    "dualpipev, --moe-token-dispatcher-type alltoall, --moe-grouped-gemm)");
  }
  bool requested(const FeatureContext& ctx) const override { return on_; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const MoeArgs& m = a.moe;
    if (m.num_experts <= 0)
      return InvalidArgument("--moe-fb-overlap needs --num-experts (a MoE model), found no --num-experts");
    if (m.moe_token_dispatcher_type != "alltoall")
      return InvalidArgument("--moe-fb-overlap: expected --moe-token-dispatcher-type alltoall (as MindSpeed), found ",
                             m.moe_token_dispatcher_type);
    if (!m.moe_grouped_gemm)
      return InvalidArgument("--moe-fb-overlap needs --moe-grouped-gemm (as MindSpeed), found no --moe-grouped-gemm");
    const int64_t etp =
        m.expert_tensor_parallel_size == kUnset ? a.parallel.tensor_model_parallel_size : m.expert_tensor_parallel_size;
    if (etp != 1)
      return InvalidArgument("--moe-fb-overlap needs expert-tensor-parallel size 1 (as MindSpeed: "
                             "--expert-tensor-parallel-size 1, or no --tensor-model-parallel-size), found ", etp);
    if (a.parallel.overlap_grad_reduce)
      return InvalidArgument("--moe-fb-overlap conflicts with --overlap-grad-reduce (as MindSpeed), found it set");
    if (ctx.parser->was_set("--moe-alltoall-overlap-comm"))
      return InvalidArgument("--moe-fb-overlap conflicts with --moe-alltoall-overlap-comm (as MindSpeed), found it set");
    if (m.moe_tp_extend_ep)
      return InvalidArgument("--moe-fb-overlap conflicts with --moe-tp-extend-ep (as MindSpeed), found it set");
    if (a.parallel.schedules_method != "dualpipev") {
      if (a.parallel.virtual_pipeline_model_parallel_size > 1 || a.parallel.num_layers_per_virtual_pipeline_stage > 0)
        return InvalidArgument("--moe-fb-overlap with the interleaved 1F1B schedule (--num-layers-per-virtual-"
                               "pipeline-stage) is not supported yet: expected --schedules-method dualpipev");
      return InvalidArgument("--moe-fb-overlap needs a schedule that pairs forwards with backwards: expected "
                             "--schedules-method dualpipev (the interleaved 1F1B schedule is not supported yet), "
                             "found ", a.parallel.schedules_method.empty() ? "no --schedules-method"
                                                                           : "--schedules-method " +
                                                                                 a.parallel.schedules_method);
    }
    return Status::Ok();
  }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    setup.ops->moe_fb_overlap = true;
    return Status::Ok();
  }

 private:
  bool on_ = false;
};

}  // namespace

void register_feature_moe_fb_overlap(FeatureRegistry& registry) { registry.add(std::make_unique<MoeFbOverlapFeature>()); }

}  // namespace gale
