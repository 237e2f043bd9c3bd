// A program started under mpirun by mpi_failure_test.cc to make one rank fail in a chosen way.
//
//   mpi_failure_helper <scenario> <rank> <pid-dir> [timeout-seconds]
//
// Every rank writes its pid to <pid-dir>/<rank>.pid, then all ranks all-reduce in a loop; at
// iteration 3 rank <rank> fails as the scenario says:
//   check-fail   a GALE_CHECK fails                 fatal-exit  fatal_exit(3, ...)
//   sigkill      the rank kills itself (SIGKILL)    hang        the rank stops calling MPI
//   truncate     rank 0 sends 10 ints, <rank> receives into room for 5 (an MPI error)
//   exit-all     every rank returns 2 from main (as after a bad flag seen by all ranks)
//   normal       nobody fails; exit 0
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "core/check.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: mpi_failure_helper <scenario> <rank> <pid-dir> [timeout-seconds]\n");
    return 2;
  }
  std::string scenario = argv[1];
  int victim = std::atoi(argv[2]);
  std::string pid_dir = argv[3];
  gale::StatusOr<gale::Comm> w = gale::init_mpi_world();
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().to_string().c_str());
    return 1;
  }
  gale::Comm world = w.value();
  if (argc > 4) gale::set_distributed_timeout(std::atof(argv[4]));
  int rank = world->rank();
  if (FILE* f = std::fopen((pid_dir + "/" + std::to_string(rank) + ".pid").c_str(), "w")) {
    std::fprintf(f, "%d\n", static_cast<int>(getpid()));
    std::fclose(f);
  }
  world->barrier();
  if (scenario == "exit-all") return 2;
  if (scenario == "truncate") {
    int buf[10] = {0};
    if (rank == 0) world->send(buf, 10, gale::DType::kI32, victim);
    if (rank == victim) world->recv(buf, 5, gale::DType::kI32, 0);
    world->barrier();
    return 0;
  }
  for (int it = 0; it < 20; ++it) {
    if (it == 3 && rank == victim) {
      if (scenario == "check-fail") GALE_CHECK(it != 3) << "rank " << rank << " fails on purpose";
      if (scenario == "fatal-exit") gale::fatal_exit(3, "rank fails on purpose with exit code 3");
      if (scenario == "sigkill") raise(SIGKILL);
      if (scenario == "hang") {
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    }
    float x[256] = {1.0f};
    world->all_reduce(x, 256, gale::DType::kF32);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (rank == 0) std::printf("all %d ranks finished\n", world->size());
  return 0;
}
