// MindSpeed's --use-multiparameter-pipeline-model-parallel (MultiParameterFeature) in the registry: pipeline stages exchange a list of typed tensors.
//
// What MindSpeed does (mindspeed/features_manager/pipeline_parallel/multi_parameter.py and
// mindspeed/core/pipeline_parallel/multi_parameter/): Megatron's schedules' send/receive, forward
// and backward steps are patched to carry a list of tensors, configured in code as
// args.pipeline_tensor_shapes (one {shape, dtype} per tensor; by default the one hidden-states
// tensor [S/CP, B, H] in the training dtype), each sent as its own p2p message in list order; the
// backward step runs autograd from the outputs that require a gradient and sends back one
// gradient per input (zeros for those without one). It is meant for multimodal models, whose stages
// pass other per-sample tensors along with the hidden states. It supports 1F1B and interleaved 1F1B,
// and refuses DualPipeV and --moe-fb-overlap.
//
// What it does in Gale: the stages exchange the list of schedule/stage_tensors.h — the hidden
// states [Tl, H] (f32, with a gradient) and, with --reset-attention-mask, the document ids [B, S]
// (i32, no gradient) — through PipelineP2P's typed multi-tensor transfers (one message per tensor,
// in order; only the gradients of the tensors that require one travel back, so nothing is sent for
// the ids). The stages after the first take their attention's document ids from the transfer
// instead of their own data loading (Trainer::load_micro_batch reads them on the first pipeline
// rank only). Instead of a fixed shape list, each iteration starts with the stages agreeing on every
// transfer's list (names, shapes, types; PipelineP2P::agree_on_tensors), so a mismatch is an error
// naming both stages on every rank, not a hang or a corrupt receive. Results are bitwise those of
// the plain pipeline (tests/parallel/multiparameter_pipeline_mpi_test.cc).
//
// Rules: level 2, in the multimodal module of MindSpeed's feature table. Refused with --schedules-method dualpipev (as
// MindSpeed's; --moe-fb-overlap needs DualPipeV in Gale, so it is refused with it). With
// --context-parallel-size > 1 and --reset-attention-mask: not supported yet (the keys' document ids
// of the whole sequences would have to travel too). Without pipelining
// (--pipeline-model-parallel-size 1) nothing is sent: inactive with a notice.
#include "features/registry.h"

namespace gale {

namespace {

class MultiParameterPipelineFeature : public Feature {
 public:
  std::string name() const override { return "use-multiparameter-pipeline-model-parallel"; }
  std::string flag() const override { return "--use-multiparameter-pipeline-model-parallel"; }
  FeatureModule module() const override { return FeatureModule::kMultimodal; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed MultiParameterFeature (L2)"; }
  std::string description() const override {
    return "pipeline stages exchange a list of typed tensors: the hidden states and, with --reset-attention-mask, "
           "the document ids the later stages' attention uses (only the hidden states' gradients travel back); "
           "the stages agree on every transfer's list first; bitwise the same results";
  }
  bool requested(const FeatureContext& ctx) const override {
    return ctx.args->parallel.use_multiparameter_pipeline_model_parallel;
  }
  Status validate(const FeatureContext& ctx) const override {
    const ParallelArgs& p = ctx.args->parallel;
    if (p.schedules_method == "dualpipev")
      return InvalidArgument("--use-multiparameter-pipeline-model-parallel applies to the 1F1B and interleaved 1F1B "
                             "schedules (as MindSpeed's), found --schedules-method dualpipev");
    if (p.context_parallel_size > 1 && ctx.args->data.document_attention())
      return Unimplemented("--use-multiparameter-pipeline-model-parallel with --context-parallel-size ",
                           p.context_parallel_size,
                           " and ",
                           ctx.args->data.sft                                ? "--sft"
                           : ctx.args->data.dataloader_inter_document_masking ? "--dataloader-inter-document-masking"
                                                                       : "--reset-attention-mask",
                           ": not supported yet (the keys' document ids of the whole "
                           "sequences would have to travel with the hidden states)");
    return Status::Ok();
  }
  bool applicable(const FeatureContext& ctx, std::string* why) const override {
    if (ctx.args->parallel.pipeline_model_parallel_size > 1) return true;
    *why = "no pipeline (--pipeline-model-parallel-size 1): nothing is sent between stages";
    return false;
  }
};

}  // namespace

void register_feature_use_multiparameter_pipeline_model_parallel(FeatureRegistry& registry) {
  registry.add(std::make_unique<MultiParameterPipelineFeature>());
}

}  // namespace gale
