// MindSpeed's --qad-enable (QADQuantEngineFeature, key scenarios): quantisation-aware distillation.
//
// What: a second, frozen model — the teacher — is built with the trained model's architecture and
// loaded from the Gale checkpoint directory --qad-teacher-load (its latest iteration; every
// architecture argument recorded there must equal this run's, else the error names the checkpoint
// and the argument). It runs forward only (no gradients, no optimizer state, never saved: the
// student's checkpoints hold the student alone), unquantised and in the run's precision (bf16 GEMMs
// under --bf16, as MindSpeed's autocast teacher), on every training micro-batch. The loss the
// student differentiates is --kl-loss-weight · KL, KL being τ² · KL(softmax(teacher/τ) ‖
// softmax(student/τ)) per token (τ = --kl-temperature), the mean (default) or sum over the
// micro-batch's loss-masked tokens (--kl-loss-reduction); the cross-entropy lm loss is computed and
// logged but not differentiated (MindSpeed's KL-only QAD). The log line gets "kl loss" (the KL
// without its weight, averaged over micro-batches and data-parallel ranks) after lm loss; TensorBoard
// gets "kl loss". Usually with --qat-scheme (the student's logits then come from fake-quantised
// weights); QAD does not require it. Evaluation (validation/test) reports the plain lm loss.
// model/logits_kl.h (the KL and its gradient), GPTModel::set_distillation (model/gpt_model.h).
//
// How it differs from MindSpeed: MindSpeed reads a Megatron checkpoint with strict=False and
// warns about missing keys; Gale refuses a checkpoint that does not hold this architecture. MindSpeed
// runs the student's forward twice (once for the logged CE); Gale computes both from one forward.
//
// Rules: --qad-teacher-load is required; --kl-temperature > 0; --kl-loss-weight >= 0;
// --kl-loss-reduction mean|sum (the parser). Not supported yet (refused naming the flag):
// interleaved pipelines (virtual stages; also from --pipeline-model-parallel-layout, refused by
// pretrain), DualPipeV, the multi-parameter pipeline, context and 2-D tensor parallelism, MoE (as
// MindSpeed), --mtp-num-layers, LoRA, --stage dpo, --fp16, --calculate-per-token-loss. Data
// parallelism (and the distributed optimizer) work as for any loss; tensor parallelism (with or
// without sequence parallelism) computes the KL over the vocabulary slices with all-reduces over
// TP, as Megatron's vocab-parallel cross-entropy; under pipeline parallelism the last stage holds
// the whole teacher (MindSpeed refuses pipeline parallelism).
//
// Tests: tests/model/logits_kl_test.cc (KL and gradient vs finite differences and the numpy fixture
// of tools/reference/qad_kl_reference.py), tests/model/qad_test.cc (teacher = student: KL 0 and zero
// gradients, model gradients vs finite differences of the objective, the teacher unchanged by
// training), tests/features/qad_feature_test.cc (rules), tests/cli/qad_cli_test.cc (gale pretrain:
// the log line, DP 2 (also with the distributed optimizer), PP 2, TP 2 and TP 2 with SP = one process,
// the student's checkpoint without the teacher, a mismatched teacher checkpoint).
#include "features/registry.h"

namespace gale {

namespace {

class QadFeature : public Feature {
 public:
  std::string name() const override { return "qad-enable"; }
  std::string flag() const override { return "--qad-enable"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed QADQuantEngineFeature"; }
  std::string description() const override {
    return "quantisation-aware distillation: a frozen teacher loaded from --qad-teacher-load (same architecture) "
           "runs forward on every micro-batch; the student differentiates --kl-loss-weight x T^2 KL(teacher || "
           "student) of softmax(logits / T) (--kl-temperature T), mean or sum over masked tokens "
           "(--kl-loss-reduction); lm loss only logged, kl loss logged; TP/SP/DP/PP (the last stage holds the whole "
           "teacher); no virtual stages, DualPipeV, CP, MoE, MTP, LoRA, DPO, fp16";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->qad.qad_enable; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const QadArgs& q = a.qad;
    const ParallelArgs& p = a.parallel;
    if (q.qad_teacher_load.empty())
      return InvalidArgument("--qad-enable needs --qad-teacher-load (the teacher's checkpoint directory), found none");
    if (!(q.kl_temperature > 0.0))
      return InvalidArgument("--kl-temperature: expected a positive number, found ", q.kl_temperature);
    if (!(q.kl_loss_weight >= 0.0))
      return InvalidArgument("--kl-loss-weight: expected a non-negative number, found ", q.kl_loss_weight);
    if (q.kl_loss_reduction != "mean" && q.kl_loss_reduction != "sum")
      return InvalidArgument("--kl-loss-reduction: expected mean or sum, found '", q.kl_loss_reduction, "'");
    auto refuse = [](const std::string& what) {
      return Unimplemented("--qad-enable with ", what, ": not supported yet (QAD runs with tensor, sequence, "
                           "data and non-interleaved pipeline parallelism)");
    };
    if (p.num_layers_per_virtual_pipeline_stage != kUnset)
      return refuse("--num-layers-per-virtual-pipeline-stage (an interleaved pipeline)");
    if (p.num_virtual_stages_per_pipeline_rank != kUnset)
      return refuse("--num-virtual-stages-per-pipeline-rank (an interleaved pipeline)");
    if (!p.schedules_method.empty()) return refuse(str_cat("--schedules-method ", p.schedules_method));
    if (p.use_multiparameter_pipeline_model_parallel) return refuse("--use-multiparameter-pipeline-model-parallel");
    if (p.context_parallel_size > 1) return refuse(str_cat("--context-parallel-size ", p.context_parallel_size));
    if (p.tp_2d) return refuse("--tp-2d");
    if (a.moe.enabled()) return refuse("--num-experts (MoE)");
    if (a.model.mtp_num_layers != kUnset && a.model.mtp_num_layers > 0) return refuse("--mtp-num-layers");
    if (a.lora.enabled()) return refuse("--lora-target-modules (LoRA)");
    if (a.dpo.enabled()) return refuse("--stage dpo");
    if (a.training.fp16) return refuse("--fp16");
    if (a.training.calculate_per_token_loss) return refuse("--calculate-per-token-loss");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_qad(FeatureRegistry& registry) { registry.add(std::make_unique<QadFeature>()); }

}  // namespace gale
