// Pipeline schedules compared on one model (run under mpirun; the ranks form one pipeline):
//
//   mpirun -np 4 build/bench/pipeline_bench [--layers 8] [--hidden 256] [--seq 256] [--micro-batches 8]
//                                           [--reps 3]
//
// For GPipe's order (all forwards, then all backwards), Megatron's 1F1B and interleaved 1F1B with
// 2 chunks per rank, it reports, per schedule: seconds per iteration (best of --reps, slowest
// rank), the activation memory each rank held at its peak (allocator high-water mark during the
// iteration minus what was live before, in MiB; first and last stage and the maximum), and the
// time ranks spent blocked on pipeline transfers (exposed p2p wait, mean over ranks). The model
// is a GPT with micro-batch 1; dropout off.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "core/allocator.h"
#include "core/log.h"
#include "schedule/schedules.h"
#include "bench_engine.h"
#include "bench_flags.h"
#include "synthetic_batches.h"
#include "train/engine.h"

namespace gale {
namespace {

struct Options {
  int layers = 8, hidden = 256, seq = 256, micro_batches = 8, reps = 3;
};

Options parse(int argc, char** argv) {
  Options o;
  bench::parse_int_flags("pipeline_bench", argc, argv,
                         {{"--layers", &o.layers}, {"--hidden", &o.hidden}, {"--seq", &o.seq},
                          {"--micro-batches", &o.micro_batches}, {"--reps", &o.reps}});
  return o;
}

std::unique_ptr<Engine> build(const Options& o, const Comm& world, int vpp, Arguments* args) {
  std::vector<std::string> flags = {
      "--num-layers", std::to_string(o.layers), "--hidden-size", std::to_string(o.hidden),
      "--num-attention-heads", std::to_string(o.hidden / 64), "--seq-length", std::to_string(o.seq),
      "--max-position-embeddings", std::to_string(o.seq), "--micro-batch-size", "1", "--global-batch-size",
      std::to_string(o.micro_batches), "--train-iters", "1", "--lr", "1e-4", "--mock-data",
      "--pipeline-model-parallel-size", std::to_string(world->size()), "--hidden-dropout", "0",
      "--attention-dropout", "0"};
  if (vpp > 1) flags.insert(flags.end(), {"--num-virtual-stages-per-pipeline-rank", std::to_string(vpp)});
  return bench::build_bench_engine(flags, world, args, reference_ops());
}

void run_case(const char* name, const Options& o, const Comm& world, int vpp, bool gpipe) {
  Arguments args;
  std::unique_ptr<Engine> e = build(o, world, vpp, &args);
  const int pp = e->ps.pp_size(), rank = e->ps.coords().pp;
  const int64_t m = o.micro_batches;
  std::vector<PipelineStep> order = gpipe ? gpipe_order(m, false)
                                    : vpp > 1 ? interleaved_order(pp, rank, vpp, m, false)
                                              : one_f_one_b_order(pp, rank, m, false);
  double best = 1e30, wait = 0.0;
  int64_t held = 0;
  for (int r = 0; r < o.reps; ++r) {
    for (auto& c : e->chunks) c->params().zero_grads();
    world->barrier();
    e->ps.pp()->reset_stats();
    const int64_t before = host_allocator().current_bytes();
    host_allocator().reset_peak();
    const double t0 = now_seconds();
    auto fb = forward_backward_pipelined(e->chunk_pointers(), e->ps, order, m, bench::synthetic_source(o.seq), false);
    GALE_CHECK_OK(fb.status());
    const double t = world->all_reduce_scalar(now_seconds() - t0, ReduceOp::kMax);
    held = std::max(held, host_allocator().peak_bytes() - before);
    best = std::min(best, t);
    wait = e->ps.pp()->stats().wait_seconds;
  }
  const double mib = static_cast<double>(held) / (1 << 20);
  const double first = world->all_reduce_scalar(rank == 0 ? mib : 0.0, ReduceOp::kSum);
  const double last = world->all_reduce_scalar(rank == pp - 1 ? mib : 0.0, ReduceOp::kSum);
  const double most = world->all_reduce_scalar(mib, ReduceOp::kMax);
  const double mean_wait = world->all_reduce_scalar(wait, ReduceOp::kSum) / pp;
  if (world->rank() == 0)
    std::printf("%-22s %9.3f s/iter   activations MiB: first %8.1f  last %8.1f  max %8.1f   p2p wait %.3f s\n", name,
                best, first, last, most, mean_wait);
}

}  // namespace
}  // namespace gale

int main(int argc, char** argv) {
  using namespace gale;
  Comm world = bench::init_world_or_exit("pipeline_bench");
  const Options o = parse(argc, argv);
  if (world->rank() == 0)
    std::printf("PP %d, GPT %d layers, hidden %d, seq %d, micro-batch 1, %d micro-batches, best of %d\n",
                world->size(), o.layers, o.hidden, o.seq, o.micro_batches, o.reps);
  run_case("GPipe (all F, all B)", o, world, 1, /*gpipe=*/true);
  run_case("1F1B", o, world, 1, false);
  if (o.layers % (2 * world->size()) == 0 && o.micro_batches % world->size() == 0)
    run_case("interleaved 1F1B, V=2", o, world, 2, false);
  return 0;
}
