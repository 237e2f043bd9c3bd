// Shared helpers of the MPI tests: the world communicator and deterministic per-rank values.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"

namespace gale::test {

// The MPI world of this test process (initialised on first use; aborts when MPI cannot start).
inline Comm world() {
  static Comm w = [] {
    StatusOr<Comm> c = init_mpi_world();
    if (!c.ok()) {
      std::fprintf(stderr, "cannot start MPI: %s\n", c.status().to_string().c_str());
      std::exit(1);
    }
    return c.value();
  }();
  return w;
}

}  // namespace gale::test
