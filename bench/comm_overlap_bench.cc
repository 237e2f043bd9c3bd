// How well an all-reduce overlaps compute on this machine, for the progress designs one could
// build on Open MPI (run under mpirun; scripts/bench_comm_overlap.sh runs the standard cases).
//
//   mpirun -np 2 build/bench/comm_overlap_bench [--mib 32] [--compute-ms 100] [--reps 9]
//
// Each rank runs a GEMM loop (oneDNN, OMP_NUM_THREADS threads) of about --compute-ms while an
// all-reduce of --mib MiB of f32 is in flight, and reports (slowest rank, median of --reps rounds):
//   compute     the GEMM loop alone
//   comm        the all-reduce alone (gale's blocking all_reduce)
//   sequential  compute, then the all-reduce
//   gale        gale's all_reduce_async (blocking MPI_Allreduce on the group's thread), compute, wait
//   ialr-poll   MPI_Iallreduce + a progress thread polling MPI_Test (sched_yield between polls)
//   ialr-none   MPI_Iallreduce, compute, MPI_Wait (no progress during compute)
// and, for each overlapped variant, the fraction of the shorter phase it hid:
//   hidden = (sequential - variant) / min(compute, comm).
// It also reports the latency of a blocking 8-byte all-reduce through gale and through MPI.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "core/log.h"
#include "kernels/cpu/gemm.h"

namespace {

struct Options {
  double mib = 32;
  double compute_ms = 100;
  int reps = 9;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--mib")
      o.mib = std::atof(argv[i + 1]);
    else if (flag == "--compute-ms")
      o.compute_ms = std::atof(argv[i + 1]);
    else if (flag == "--reps")
      o.reps = std::atoi(argv[i + 1]);
  }
  return o;
}

constexpr int64_t kDim = 256;  // one GEMM: 256^3 * 2 = 33.5 MFLOP

void gemm_loop(int iters, std::vector<float>& a, std::vector<float>& c) {
  for (int i = 0; i < iters; ++i)
    gale::sgemm(false, false, kDim, kDim, kDim, 1.0f, a.data(), kDim, a.data(), kDim, 0.0f, c.data(), kDim);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse(argc, argv);
  gale::StatusOr<gale::Comm> w = gale::init_mpi_world();
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().to_string().c_str());
    return 1;
  }
  gale::Comm world = w.value();
  const int64_t n = static_cast<int64_t>(opt.mib * 1024 * 1024 / 4);
  std::vector<float> buf(n, 1.0f), a(kDim * kDim, 0.001f), c(kDim * kDim);

  // Calibrate the GEMM loop to about compute_ms (the slowest rank decides).
  gemm_loop(3, a, c);
  double t0 = gale::now_seconds();
  gemm_loop(20, a, c);
  double per_iter = world->all_reduce_scalar((gale::now_seconds() - t0) / 20, gale::ReduceOp::kMax);
  int iters = std::max(1, static_cast<int>(opt.compute_ms / 1e3 / per_iter));

  // Variants run round-robin, --reps rounds, so that load from other processes falls on all of
  // them alike; each reports the median over rounds of the slowest rank's time.
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  const int small_iters = 2000;
  double one = 1.0;
  struct Variant {
    const char* name;
    std::function<void()> body;
    std::vector<double> ms;
  };
  std::vector<Variant> variants = {
      {"compute", [&] { gemm_loop(iters, a, c); }, {}},
      {"comm", [&] { world->all_reduce(buf.data(), n, gale::DType::kF32); }, {}},
      {"sequential",
       [&] {
         gemm_loop(iters, a, c);
         world->all_reduce(buf.data(), n, gale::DType::kF32);
       },
       {}},
      {"gale",
       [&] {
         gale::WorkPtr work = world->all_reduce_async(buf.data(), n, gale::DType::kF32, gale::ReduceOp::kSum);
         gemm_loop(iters, a, c);
         work->wait();
       },
       {}},
      {"ialr-poll",
       [&] {
         MPI_Request req;
         MPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, raw, &req);
         std::thread progress([&] {
           int done = 0;
           while (!done) {
             MPI_Test(&req, &done, MPI_STATUS_IGNORE);
             if (!done) sched_yield();
           }
         });
         gemm_loop(iters, a, c);
         progress.join();
       },
       {}},
      {"ialr-none",
       [&] {
         MPI_Request req;
         MPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, raw, &req);
         gemm_loop(iters, a, c);
         MPI_Wait(&req, MPI_STATUS_IGNORE);
       },
       {}},
      {"ialr-alone",
       [&] {
         MPI_Request req;
         MPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, raw, &req);
         MPI_Wait(&req, MPI_STATUS_IGNORE);
       },
       {}},
      {"small-gale",
       [&] {
         for (int i = 0; i < small_iters; ++i) world->all_reduce(&one, 1, gale::DType::kF64);
       },
       {}},
      {"small-mpi",
       [&] {
         for (int i = 0; i < small_iters; ++i) MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_DOUBLE, MPI_SUM, raw);
       },
       {}},
  };
  for (int round = 0; round < opt.reps; ++round) {
    for (Variant& v : variants) {
      world->barrier();
      double start = gale::now_seconds();
      v.body();
      v.ms.push_back(world->all_reduce_scalar(gale::now_seconds() - start, gale::ReduceOp::kMax) * 1e3);
    }
  }
  MPI_Comm_free(&raw);
  auto median = [&](const char* name) {
    for (Variant& v : variants) {
      if (std::string(v.name) != name) continue;
      std::sort(v.ms.begin(), v.ms.end());
      return v.ms[v.ms.size() / 2];
    }
    return 0.0;
  };
  double compute = median("compute"), comm = median("comm"), sequential = median("sequential");
  double gale_async = median("gale"), ialr_poll = median("ialr-poll"), ialr_none = median("ialr-none");
  double ialr_alone = median("ialr-alone");
  double small_gale = median("small-gale") * 1e3 / small_iters, small_mpi = median("small-mpi") * 1e3 / small_iters;

  if (world->rank() == 0) {
    double shorter = std::min(compute, comm);
    auto hidden = [&](double t) { return 100.0 * (sequential - t) / shorter; };
    std::printf("ranks %d, OMP threads/rank %s, all-reduce %.1f MiB f32, GEMM loop %d x 256^3\n", world->size(),
                std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "(default)", opt.mib, iters);
    std::printf("  compute              %8.1f ms\n", compute);
    std::printf("  comm (blocking)      %8.1f ms   (MPI_Iallreduce alone: %.1f ms)\n", comm, ialr_alone);
    std::printf("  sequential           %8.1f ms\n", sequential);
    std::printf("  gale async           %8.1f ms   hidden %5.1f%%\n", gale_async, hidden(gale_async));
    std::printf("  ialr + poll thread   %8.1f ms   hidden %5.1f%%\n", ialr_poll, hidden(ialr_poll));
    std::printf("  ialr, no progress    %8.1f ms   hidden %5.1f%%\n", ialr_none, hidden(ialr_none));
    std::printf("  8-byte all-reduce latency: gale %.1f us, MPI_Allreduce %.1f us\n", small_gale, small_mpi);
  }
  return 0;
}
