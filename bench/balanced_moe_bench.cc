// --balanced-moe-experts against the plain all-to-all dispatcher on a skewed router (run under mpirun, EP = world):
//
//   mpirun -np 2 build/bench/balanced_moe_bench [--layers 2] [--hidden 256] [--seq 512] [--experts 8]
//                                               [--hot 2] [--groups 2] [--micro-batches 4] [--reps 5]
//                                               [--skew 30]
//
// A GPT whose layers are all MoE (top-2 of --experts, sigmoid scores, the all-to-all dispatcher,
// micro-batch 1, dropout off, no pipelining), EP = DP = world. The router is skewed by a fixed
// expert bias (--skew/100 on expert 0, half of it on expert 1: both on EP rank 0), so EP rank 0's
// experts get most rows. The repetitions alternate the plain dispatcher and --balanced-moe-experts
// (the op table's hot expert number; the transfer groups are made once) on the same engine. Per
// mode: seconds per forward/backward iteration (best of --reps, slowest rank), rows sent through
// the all-to-all to other ranks (forward inputs and backward output gradients, all ranks, per
// iteration), and the most rows one rank's experts (plus replicas) took in one micro-batch's layer.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "core/log.h"
#include "model/moe_dispatch.h"
#include "schedule/schedules.h"
#include "bench_engine.h"
#include "bench_flags.h"
#include "synthetic_batches.h"
#include "train/engine.h"

namespace gale {
namespace {

struct Options {
  int layers = 2, hidden = 256, seq = 512, experts = 8, hot = 2, groups = 2, micro_batches = 4, reps = 5, skew = 30;
};

Options parse(int argc, char** argv) {
  Options o;
  bench::parse_int_flags("balanced_moe_bench", argc, argv,
                         {{"--layers", &o.layers}, {"--hidden", &o.hidden}, {"--seq", &o.seq},
                          {"--experts", &o.experts}, {"--hot", &o.hot}, {"--groups", &o.groups},
                          {"--micro-batches", &o.micro_batches}, {"--reps", &o.reps}, {"--skew", &o.skew}});
  return o;
}

std::unique_ptr<Engine> build(const Options& o, const Comm& world, Arguments* args) {
  const int P = world->size();
  std::vector<std::string> flags = {
      "--num-layers", std::to_string(o.layers), "--hidden-size", std::to_string(o.hidden),
      "--num-attention-heads", std::to_string(o.hidden / 64), "--seq-length", std::to_string(o.seq),
      "--max-position-embeddings", std::to_string(o.seq), "--micro-batch-size", "1", "--global-batch-size",
      std::to_string(P * o.micro_batches), "--train-iters", "1", "--lr", "1e-4", "--mock-data",
      "--expert-model-parallel-size", std::to_string(P), "--num-experts", std::to_string(o.experts),
      "--moe-router-topk", "2", "--moe-ffn-hidden-size", std::to_string(2 * o.hidden), "--moe-token-dispatcher-type",
      "alltoall", "--moe-grouped-gemm", "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
      "--moe-router-bias-update-rate", "0", "--hidden-dropout", "0", "--attention-dropout", "0"};
  OpTable ops = reference_ops();
  ops.moe_hot_experts = o.hot;  // what --balanced-moe-experts installs (the groups are made at build)
  ops.moe_hot_expert_groups = o.groups;
  std::unique_ptr<Engine> e = bench::build_bench_engine(flags, world, args, ops);
  // the skewed router
  for (GPTModel* c : e->chunk_pointers()) {
    const ParamBuffer& pb = c->params();
    for (int id = 0; id < pb.size(); ++id)
      if (pb.spec(id).name.find("router.expert_bias") != std::string::npos) {
        pb.param_data(id)[0] = static_cast<float>(o.skew) / 100.0f;
        pb.param_data(id)[1] = static_cast<float>(o.skew) / 200.0f;
      }
  }
  return e;
}

}  // namespace
}  // namespace gale

int main(int argc, char** argv) {
  using namespace gale;
  Comm world = bench::init_world_or_exit("balanced_moe_bench");
  const Options o = parse(argc, argv);
  Arguments args;
  std::unique_ptr<Engine> e = build(o, world, &args);
  const int64_t hot = e->ops.moe_hot_experts;
  if (world->rank() == 0)
    std::printf("EP%d (= DP), GPT %d MoE layers (%d experts top-2, sigmoid, expert bias %.2f / %.2f on experts 0 / 1), "
                "hidden %d, seq %d, %d micro-batches of 1 per rank, N = %d hot experts on M = %d groups, best of %d\n",
                world->size(), o.layers, o.experts, o.skew / 100.0, o.skew / 200.0, o.hidden, o.seq, o.micro_batches,
                o.hot, o.groups, o.reps);
  const MicroBatchSource source = bench::synthetic_source(o.seq, e->ps.coords().dp);
  double best[2] = {1e30, 1e30};
  long long sent[2] = {0, 0}, max_rows[2] = {0, 0}, hot_rows[2] = {0, 0};
  for (int r = 0; r < 2 * o.reps + 2; ++r) {  // the first two: warm-up
    const int mode = r % 2;
    e->ops.moe_hot_experts = mode == 1 ? hot : 0;
    for (auto& c : e->chunks) c->params().zero_grads();
    moe_dispatch_counters().reset();
    world->barrier();
    const double t0 = now_seconds();
    auto fb = forward_backward(e->chunk_pointers(), e->ps, o.micro_batches, source, false);
    GALE_CHECK_OK(fb.status());
    const double t = world->all_reduce_scalar(now_seconds() - t0, ReduceOp::kMax);
    const MoeDispatchCounters& k = moe_dispatch_counters();
    const int64_t s = world->all_reduce_scalar(static_cast<int64_t>(k.rows_sent_to_other_ranks.load()), ReduceOp::kSum);
    const int64_t m = world->all_reduce_scalar(static_cast<int64_t>(k.max_expert_rows.load()), ReduceOp::kMax);
    const int64_t h = world->all_reduce_scalar(static_cast<int64_t>(k.hot_rows_computed_locally.load()), ReduceOp::kSum);
    if (r < 2) continue;
    best[mode] = std::min(best[mode], t);
    sent[mode] = s;
    max_rows[mode] = m;
    hot_rows[mode] = h;
  }
  if (world->rank() == 0)
    for (int mode = 0; mode < 2; ++mode)
      std::printf("%-24s %8.3f s/iter   rows through the all-to-all %8lld   busiest rank's expert rows %6lld   "
                  "rows on replicas %7lld\n",
                  mode ? "--balanced-moe-experts" : "plain alltoall", best[mode], sent[mode], max_rows[mode],
                  hot_rows[mode]);
  return 0;
}
