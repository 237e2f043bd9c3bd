// Megatron's fault-tolerance flags (--enable-ft-package, --calc-ft-timeouts) and the FT package's
// parameters under ft_launcher's names (--ft-param-*; train/ft_integration.h).
#include "train/arguments.h"
#include "train/ft_timeouts.h"

namespace gale {

namespace {
const char* const kFtParams[] = {"--ft-param-rank_section_timeouts", "--ft-param-rank_out_of_section_timeout",
                                 "--ft-param-safety_factor", "--ft-param-workload_check_interval"};
}

void add_ft_args(ArgParser& p, FtArgs& a) {
  p.group("fault tolerance");
  p.add_flag("--enable-ft-package", &a.enable_ft_package,
             "Megatron's fault tolerance: a watchdog per rank ends the whole job (exit code 75) when a section "
             "(setup, step, checkpointing) stays open, or the rank stays out of any section, longer than its timeout "
             "(needs --save; docs/fault-tolerance.md)");
  p.add_flag("--calc-ft-timeouts", &a.calc_ft_timeouts,
             "--enable-ft-package: recalculate the timeouts from the observed intervals after each save and at the "
             "end, and keep them in <save>/ft_state.json for the next run");
  p.add("--ft-param-rank_section_timeouts", &a.rank_section_timeouts,
        "--enable-ft-package: seconds each section may stay open, as ft_launcher's parameter: "
        "setup:S,step:S,checkpointing:S (none: no timeout; default setup:600,step:180,checkpointing:420)");
  p.add("--ft-param-rank_out_of_section_timeout", &a.rank_out_of_section_timeout,
        "--enable-ft-package: seconds a rank may stay out of any section (none: no timeout; default 300)");
  p.add("--ft-param-safety_factor", &a.safety_factor,
        "--calc-ft-timeouts: a timeout is this times the longest observed interval (default 5)");
  p.add("--ft-param-workload_check_interval", &a.workload_check_interval,
        "--enable-ft-package: seconds between the watchdog's checks (default 5)");
  p.add("--ft-num-warmup-iters", &a.num_warmup_iters,
        "--enable-ft-package: the first N training iterations (and of each evaluation, the first N) run outside the "
        "\"step\" section, and the out-of-section timeout applies only once N training iterations have ended "
        "(Megatron-LM main; default 5)");
}

Status validate_ft_args(const Arguments& a, const ArgParser& p) {
  const FtArgs& f = a.ft;
  if (f.num_warmup_iters < 0)
    return InvalidArgument("--ft-num-warmup-iters: expected a number of iterations >= 0, found ", f.num_warmup_iters);
  if (!f.enable_ft_package) {
    if (f.calc_ft_timeouts) return InvalidArgument("--calc-ft-timeouts needs --enable-ft-package");
    for (const char* flag : kFtParams)
      if (p.was_set(flag)) return InvalidArgument(flag, " needs --enable-ft-package");
    return Status::Ok();
  }
  if (a.checkpoint.save.empty())
    return InvalidArgument("--enable-ft-package needs --save (the fault-tolerance state is kept in <save>/ft_state.json)");
  std::map<std::string, std::optional<double>> sections;
  GALE_RETURN_IF_ERROR(parse_ft_section_timeouts(f.rank_section_timeouts, "--ft-param-rank_section_timeouts", &sections));
  std::optional<double> out_of_section;
  GALE_RETURN_IF_ERROR(
      parse_ft_timeout(f.rank_out_of_section_timeout, "--ft-param-rank_out_of_section_timeout", &out_of_section));
  if (!(f.safety_factor > 0.0))
    return InvalidArgument("--ft-param-safety_factor: expected a number > 0, found ", f.safety_factor);
  if (!(f.workload_check_interval > 0.0))
    return InvalidArgument("--ft-param-workload_check_interval: expected a number of seconds > 0, found ",
                           f.workload_check_interval);
  return Status::Ok();
}

}  // namespace gale
