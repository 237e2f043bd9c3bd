// Choosing the world communicator from the launcher environment and --distributed-backend.
#include <cstdlib>

#include "comm/communicator.h"
#include "comm/launcher.h"
#include "comm/mpi_communicator.h"
#ifdef GALE_HAVE_CUDA
#include "comm/nccl_communicator.h"
#endif

namespace gale {

StatusOr<Comm> init_world(const std::string& backend, double timeout_minutes) {
  if (backend == "nccl") {
#ifndef GALE_HAVE_CUDA
    return InvalidArgument(
        "--distributed-backend nccl: this build of gale has no CUDA/NCCL (built without a CUDA toolkit); use "
        "--distributed-backend mpi");
#endif
  } else if (backend != "mpi" && backend != "gloo") {
    return InvalidArgument("--distributed-backend: expected one of mpi, nccl, gloo; found '", backend, "'");
  }
  if (!(timeout_minutes > 0.0))
    return InvalidArgument("--distributed-timeout-minutes: expected a positive number, found ", timeout_minutes);
  Comm world;
  if (launched_by_mpi()) {
    GALE_ASSIGN_OR_RETURN(world, init_mpi_world());
    set_distributed_timeout(timeout_minutes * 60.0);
  } else {
    world = make_self_communicator("world");
  }
#ifdef GALE_HAVE_CUDA
  if (backend == "nccl") return init_nccl_world(world, timeout_minutes * 60.0);
#endif
  return world;
}

}  // namespace gale
