// MindSpeed-LLM's --stage and DPO flags (names and defaults of its argument parser) and their checks.
#include "train/arguments.h"

namespace gale {

void add_dpo_args(ArgParser& p, DpoArgs& a) {
  p.group("post-training (MindSpeed-LLM)");
  p.add("--stage", &a.stage,
        "post-training stage: sft (plain fine-tuning, the default behaviour) or dpo (offline Direct Preference "
        "Optimization against a frozen reference model; needs --is-pairwise-dataset)");
  p.add_flag("--is-pairwise-dataset", &a.is_pairwise_dataset,
             "--data-path is a pairwise dataset (PREFIX_packed_{chosen,rejected}_{input_ids,labels}_document, "
             "gale preprocess --handler-name AlpacaStylePairwiseHandler)");
  p.add("--dpo-beta", &a.dpo_beta, "DPO: the temperature beta of the preference loss (default 0.1)");
  p.add("--dpo-loss-type", &a.dpo_loss_type, "DPO: sigmoid (default), hinge or ipo");
  p.add("--dpo-label-smoothing", &a.dpo_label_smoothing,
        "DPO: the cDPO label smoothing of the sigmoid loss, in [0, 0.5] (default 0)");
  p.add("--pref-ftx", &a.pref_ftx, "DPO: coefficient of the SFT loss on the chosen responses (default 0)");
  p.add("--ref-model", &a.ref_model, "DPO: checkpoint directory of the reference model (default: the --load one)");
  p.add("--refer-model-iter", &a.refer_model_iter,
        "DPO: the iteration of the reference model's checkpoint directory it loads (default 1, MindSpeed-LLM's; "
        "without the flag, a directory without that iteration gives its latest)");
}

Status validate_dpo_args(Arguments& a, const ArgParser& p) {
  a.dpo.refer_model_iter_given = p.was_set("--refer-model-iter");
  const DpoArgs& d = a.dpo;
  if (!d.stage.empty() && d.stage != "sft" && d.stage != "dpo")
    return Unimplemented("--stage ", d.stage, ": not supported yet (Gale has sft and dpo)");
  const bool dpo_flag = p.was_set("--dpo-beta") || p.was_set("--dpo-loss-type") ||
                        p.was_set("--dpo-label-smoothing") || p.was_set("--pref-ftx") || p.was_set("--ref-model") ||
                        p.was_set("--refer-model-iter");
  if (!d.enabled()) {
    if (d.is_pairwise_dataset) return InvalidArgument("--is-pairwise-dataset needs --stage dpo");
    if (dpo_flag)
      return InvalidArgument("--dpo-beta, --dpo-loss-type, --dpo-label-smoothing, --pref-ftx, --ref-model and "
                             "--refer-model-iter need --stage dpo");
    return Status::Ok();
  }
  if (!d.is_pairwise_dataset)
    return InvalidArgument("--stage dpo: expected --is-pairwise-dataset (DPO trains on chosen/rejected pairs)");
  if (a.data.is_instruction_dataset)
    return InvalidArgument("--stage dpo: --is-instruction-dataset and --is-pairwise-dataset are exclusive");
  if (d.dpo_loss_type != "sigmoid" && d.dpo_loss_type != "hinge" && d.dpo_loss_type != "ipo")
    return InvalidArgument("--dpo-loss-type: expected sigmoid, hinge or ipo, found '", d.dpo_loss_type, "'");
  if (d.refer_model_iter < 0)
    return InvalidArgument("--refer-model-iter: expected an iteration (>= 0), found ", d.refer_model_iter);
  if (!(d.dpo_beta > 0.0)) return InvalidArgument("--dpo-beta: expected a positive number, found ", d.dpo_beta);
  if (d.dpo_label_smoothing < 0.0 || d.dpo_label_smoothing > 0.5)
    return InvalidArgument("--dpo-label-smoothing: expected a number in [0, 0.5], found ", d.dpo_label_smoothing);
  if (d.pref_ftx < 0.0) return InvalidArgument("--pref-ftx: expected a non-negative number, found ", d.pref_ftx);
  if (d.ref_model.empty() && a.checkpoint.load.empty())
    return InvalidArgument("--stage dpo: expected --ref-model or --load (the reference model's checkpoint), found "
                           "neither");
  // Pipeline parallelism (1F1B, interleaved 1F1B, DualPipeV) runs the reference model's forwards
  // and then the policy's through the layout's schedule (train/dpo.h dpo_iteration); --dist-train
  // refuses DPO itself (train/arguments_dist_train.cc, which validates its runs instead).
  if (a.model.mtp_num_layers != kUnset && a.model.mtp_num_layers > 0)
    return Unimplemented("--stage dpo with --mtp-num-layers: not supported yet");
  if (a.training.calculate_per_token_loss)
    return Unimplemented("--stage dpo with --calculate-per-token-loss: not supported (the DPO loss is per pair)");
  return Status::Ok();
}

}  // namespace gale
