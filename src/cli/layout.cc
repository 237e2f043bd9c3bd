// `gale layout`: print the rank layout (every process group) that a launch would use.
#include <cstdio>

#include "cli/subcommands.h"
#include "parallel/rank_grid.h"
#include "parallel/tp2d_groups.h"
#include "train/arg_parser.h"

namespace gale::cli {

int run_layout(int argc, char** argv) {
  ParallelSizes s;
  int64_t world = 0, tp = 1, pp = 1, cp = 1, ep = 1, etp = 0, max_lines = 64, tp_x = 1;
  bool tp_pp_dp = false, tp_2d = false;
  ArgParser p("gale layout", "Print Megatron's rank layout and process groups for a world size and parallel sizes.");
  p.add("--world-size", &world, "number of processes (required)");
  p.add("--tensor-model-parallel-size", &tp, "tensor-parallel size");
  p.add("--pipeline-model-parallel-size", &pp, "pipeline-parallel size");
  p.add("--context-parallel-size", &cp, "context-parallel size");
  p.add("--expert-model-parallel-size", &ep, "expert-parallel size");
  p.add("--expert-tensor-parallel-size", &etp, "tensor-parallel size of expert layers (default: TP)");
  p.add_flag("--use-tp-pp-dp-mapping", &tp_pp_dp, "order ranks tp-cp-ep-pp-dp instead of tp-cp-ep-dp-pp");
  p.add_flag("--tp-2d", &tp_2d, "also list the X and Y groups of 2-D tensor parallelism (--tp-x X)");
  p.add("--tp-x", &tp_x, "--tp-2d: the X axis of the grid (must divide the TP size)");
  p.add("--max-rank-lines", &max_lines, "ranks listed one per line before the listing is shortened");
  Status parsed = p.parse(argc, argv);
  if (p.help_requested()) {
    std::printf("%s", p.help_text().c_str());
    return 0;
  }
  if (parsed.ok() && world <= 0) parsed = InvalidArgument("--world-size is required (a positive integer)");
  if (parsed.ok() && tp_2d && (tp_x < 1 || tp % tp_x != 0))
    parsed = InvalidArgument("--tp-2d: --tp-x ", tp_x, " must divide --tensor-model-parallel-size ", tp);
  if (!parsed.ok()) {
    std::fprintf(stderr, "gale layout: %s\n", parsed.message().c_str());
    return 2;
  }
  s.world_size = static_cast<int>(world), s.tp = static_cast<int>(tp), s.pp = static_cast<int>(pp);
  s.cp = static_cast<int>(cp), s.ep = static_cast<int>(ep), s.etp = static_cast<int>(etp);
  s.use_tp_pp_dp_mapping = tp_pp_dp;
  StatusOr<RankLayout> layout = compute_rank_layout(s);
  if (!layout.ok()) {
    std::fprintf(stderr, "gale layout: %s\n", layout.status().message().c_str());
    return 2;
  }
  std::printf("%s", render_rank_layout(layout.value(), static_cast<int>(max_lines)).c_str());
  if (tp_2d) std::printf("%s", render_tp2d_groups(layout.value(), tp_x).c_str());
  return 0;
}

}  // namespace gale::cli
