// --phase-transition-iterations (Megatron-LM main's phased training): the flag and its checks.
#include "train/arguments.h"
#include "train/phase_transitions.h"

namespace gale {

void add_phase_args(ArgParser& p, DataArgs& a) {
  p.add("--phase-transition-iterations", &a.phase_transition_iterations,
        "comma-separated iterations where phase transitions occur: the run saves (with --save) and exits at "
        "each; the next run's training data (its own --data-path) starts at its first sample. Requires a fixed "
        "global batch size across phases");
}

Status validate_phase_args(Arguments& a, const ArgParser& p) {
  DataArgs& d = a.data;
  d.phase_transitions.clear();
  if (d.phase_transition_iterations.empty()) return Status::Ok();  // Megatron: falsy, off
  GALE_ASSIGN_OR_RETURN(d.phase_transitions, parse_phase_transition_iterations(d.phase_transition_iterations));
  const TrainingArgs& t = a.training;
  // Megatron's validate_args before its step schedules replaced --rampup-batch-size; its help text
  // now: "Requires fixed global batch size across phases".
  if (!t.rampup_batch_size.empty())
    return InvalidArgument("--phase-transition-iterations with --rampup-batch-size: multi-phase training does not "
                           "support batch size ramp-up (the phases need a fixed global batch size)");
  // Megatron counts the last phase up to args.train_samples, which is None with --train-iters (its
  // get_train_valid_test_num_samples then fails comparing None with an integer).
  if (t.train_samples == kUnset)
    return InvalidArgument("--phase-transition-iterations needs sample-based training (--train-samples), not "
                           "--train-iters: Megatron counts the last phase up to --train-samples");
  (void)p;
  return Status::Ok();
}

}  // namespace gale
