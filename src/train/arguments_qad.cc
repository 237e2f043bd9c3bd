// MindSpeed's quantisation-aware distillation flags (QADQuantEngineFeature; features/feature_qad.cc).
#include "train/arguments.h"

namespace gale {

void add_qad_args(ArgParser& p, QadArgs& a) {
  p.group("quantisation-aware distillation");
  p.add_flag("--qad-enable", &a.qad_enable,
             "distil a frozen teacher (--qad-teacher-load) into the trained model: the loss differentiated is "
             "--kl-loss-weight x KL(teacher || student) of the output distributions (the lm loss is only logged); "
             "MindSpeed's QAD, usually with --qat-scheme");
  p.add_false("--no-qad-enable", &a.qad_enable, "turn --qad-enable off");
  p.add("--qad-teacher-load", &a.qad_teacher_load,
        "--qad-enable: the teacher's Gale checkpoint directory (its latest iteration; same architecture flags)");
  p.add("--kl-temperature", &a.kl_temperature,
        "--qad-enable: temperature T of the softmaxes; the per-token KL is multiplied by T^2 (default 1, > 0)");
  p.add("--kl-loss-weight", &a.kl_loss_weight, "--qad-enable: weight of the KL term in the loss (default 1, >= 0)");
  p.add_choice("--kl-loss-reduction", &a.kl_loss_reduction, {"mean", "sum"},
               "--qad-enable: the KL over a micro-batch's loss-masked tokens: their mean (default) or sum");
}

Status validate_qad_args(const Arguments& a, const ArgParser& p) {
  if (a.qad.qad_enable) return Status::Ok();  // the feature (features/feature_qad.cc) checks the rest
  for (const char* flag : {"--qad-teacher-load", "--kl-temperature", "--kl-loss-weight", "--kl-loss-reduction"})
    if (p.was_set(flag)) return InvalidArgument(flag, " needs --qad-enable (quantisation-aware distillation)");
  return Status::Ok();
}

}  // namespace gale
