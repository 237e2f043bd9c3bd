// Megatron's rerun state machine flags (train/rerun_state_machine.h).
#include "train/arguments.h"

namespace gale {

void add_rerun_args(ArgParser& p, RerunArgs& a) {
  p.group("rerun state machine");
  p.add_choice("--rerun-mode", &a.rerun_mode, {"disabled", "validate_results", "report_stats"},
               "Megatron's rerun state machine: validate_results reruns an iteration whose loss or gradients fail a "
               "check, to tell a transient fault from a reproducible result (exit 16: resume on other hardware to "
               "decide; exit 17: failed); report_stats reruns every iteration once and reports how much the checked "
               "values vary; disabled (the default, as Megatron core_v0.12) only checks");
  p.add("--error-injection-rate", &a.error_injection_rate,
        "--rerun-mode validate_results: inject an unexpected result once per N validations, at random (0: never)");
  p.add_choice("--error-injection-type", &a.error_injection_type, {"correct_result", "transient_error", "persistent_error"},
               "--error-injection-rate: what the injected result behaves as on its reruns (default transient_error)");
  p.add_flag("--check-for-spiky-loss", &a.check_for_spiky_loss,
             "flag a micro-batch loss at least 10x the largest of the first 100 (not fatal: reported, and with "
             "--rerun-mode validate_results rerun once)");
  p.add_flag("--check-for-large-grads", &a.check_for_large_grads,
             "flag a local gradient norm at least 10x the largest of the first 100 (not fatal, as --check-for-spiky-loss)");
  p.add("--result-rejected-tracker-filename", &a.result_rejected_tracker_filename,
        "append a line per rejected result and per rerun outcome to this file (Megatron's tracker format)");
}

Status validate_rerun_args(const Arguments& a, const ArgParser& p) {
  const RerunArgs& r = a.rerun;
  if (r.error_injection_rate < 0)
    return InvalidArgument("--error-injection-rate: expected a count >= 0, found ", r.error_injection_rate);
  if (r.error_injection_rate > 0 && r.rerun_mode != "validate_results")
    return InvalidArgument("--error-injection-rate ", r.error_injection_rate,
                           " needs --rerun-mode validate_results (injected results are only validated there), found '",
                           r.rerun_mode, "'");
  if (p.was_set("--error-injection-type") && r.error_injection_rate == 0)
    return InvalidArgument("--error-injection-type needs --error-injection-rate > 0");
  if (r.rerun_mode == "disabled") return Status::Ok();
  // A rerun repeats the forward and backward passes from the same parameters and samples; state
  // that these passes update and a rerun would update twice is not restored yet.
  const std::pair<bool, const char*> stateful[] = {
      {a.moe.moe_router_enable_expert_bias, "--moe-router-enable-expert-bias (the bias update after the backward)"},
      {a.moe.uses_load_balancing_type("quantile_balancing"),
       "--moe-router-load-balancing-type quantile_balancing (the qb_beta update after the backward)"},
      {a.training.smart_swap, "--smart-swap (its warm-up sampling)"},
      {p.was_set("--enable-expert-placement"), "--enable-expert-placement (its token counts)"},
      {p.was_set("--balanced-moe-experts"), "--balanced-moe-experts (its token counts)"},
  };
  for (const auto& [on, what] : stateful)
    if (on) return Unimplemented("--rerun-mode ", r.rerun_mode, " with ", what, ": not supported yet");
  return Status::Ok();
}

}  // namespace gale
