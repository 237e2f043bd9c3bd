// --moe-fb-overlap against plain DualPipeV on the same ranks and engine (run under mpirun, 4 ranks: PP2 × EP2 × DP2):
//
//   mpirun -np 4 build/bench/moe_fb_overlap_bench [--layers 4] [--hidden 256] [--seq 256] [--experts 8]
//                                                  [--micro-batches 8] [--reps 5]
//
// A GPT with MoE layers (top-2 of --experts, the all-to-all dispatcher, micro-batch 1, dropout off)
// under DualPipeV; the repetitions alternate plain and overlapped pairs (the op table's switch) on
// the same engine. Per mode it reports seconds per forward/backward iteration (best of --reps,
// slowest rank) and the time ranks were blocked on the expert-parallel group (CommStats
// wait_seconds of every exchange, including the dispatch plan's counts; mean over ranks and reps).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "core/log.h"
#include "schedule/schedules.h"
#include "bench_engine.h"
#include "bench_flags.h"
#include "synthetic_batches.h"
#include "train/engine.h"

namespace gale {
namespace {

struct Options {
  int layers = 4, hidden = 256, seq = 256, experts = 8, micro_batches = 8, reps = 5;
};

Options parse(int argc, char** argv) {
  Options o;
  bench::parse_int_flags("moe_fb_overlap_bench", argc, argv,
                         {{"--layers", &o.layers}, {"--hidden", &o.hidden}, {"--seq", &o.seq},
                          {"--experts", &o.experts}, {"--micro-batches", &o.micro_batches}, {"--reps", &o.reps}});
  return o;
}

std::unique_ptr<Engine> build(const Options& o, const Comm& world, Arguments* args) {
  std::vector<std::string> flags = {
      "--num-layers", std::to_string(o.layers), "--hidden-size", std::to_string(o.hidden),
      "--num-attention-heads", std::to_string(o.hidden / 64), "--seq-length", std::to_string(o.seq),
      "--max-position-embeddings", std::to_string(o.seq), "--micro-batch-size", "1", "--global-batch-size",
      std::to_string(2 * o.micro_batches), "--train-iters", "1", "--lr", "1e-4", "--mock-data",
      "--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "2", "--schedules-method", "dualpipev",
      "--num-experts", std::to_string(o.experts), "--moe-router-topk", "2", "--moe-ffn-hidden-size",
      std::to_string(2 * o.hidden), "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm",
      "--hidden-dropout", "0", "--attention-dropout", "0"};
  return bench::build_bench_engine(flags, world, args, reference_ops());
}

}  // namespace
}  // namespace gale

int main(int argc, char** argv) {
  using namespace gale;
  Comm world = bench::init_world_or_exit("moe_fb_overlap_bench");
  if (world->size() != 4) {
    std::fprintf(stderr, "moe_fb_overlap_bench: run with 4 ranks (PP2 x EP2 x DP2)\n");
    return 1;
  }
  const Options o = parse(argc, argv);
  Arguments args;
  std::unique_ptr<Engine> e = build(o, world, &args);
  if (world->rank() == 0)
    std::printf("PP2 x EP2 x DP2 DualPipeV, GPT %d layers (MoE %d experts top-2), hidden %d, seq %d, %d micro-batches "
                "of 1, best of %d\n",
                o.layers, o.experts, o.hidden, o.seq, o.micro_batches, o.reps);
  const MicroBatchSource source = bench::synthetic_source(o.seq, e->ps.coords().dp);
  double best[2] = {1e30, 1e30}, wait[2] = {0.0, 0.0};
  for (int r = 0; r < 2 * o.reps + 2; ++r) {  // the first two: warm-up
    const int mode = r % 2;
    e->ops.moe_fb_overlap = mode == 1;
    for (auto& c : e->chunks) c->params().zero_grads();
    world->barrier();
    e->ps.expert()->reset_stats();
    const double t0 = now_seconds();
    auto fb = forward_backward_dualpipev(e->chunk_pointers(), e->ps, o.micro_batches, source, false);
    GALE_CHECK_OK(fb.status());
    const double t = world->all_reduce_scalar(now_seconds() - t0, ReduceOp::kMax);
    const double ep_wait = world->all_reduce_scalar(e->ps.expert()->stats().wait_seconds, ReduceOp::kSum) / 4;
    if (r < 2) continue;
    best[mode] = std::min(best[mode], t);
    wait[mode] += ep_wait / o.reps;
  }
  if (world->rank() == 0)
    for (int mode = 0; mode < 2; ++mode)
      std::printf("%-26s %8.3f s/iter   EP all-to-all blocked %.3f s/iter (mean over ranks)\n",
                  mode ? "--moe-fb-overlap" : "plain DualPipeV", best[mode], wait[mode]);
  return 0;
}
