// Choosing the world communicator from the launcher environment and --distributed-backend.
#include <cstdlib>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"

namespace gale {

namespace {
// True when started by mpirun/mpiexec (Open MPI, MPICH, Intel MPI) or srun with PMI.
bool launched_by_mpi() {
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "SLURM_NTASKS"};
  for (const char* v : vars) {
    const char* value = std::getenv(v);
    if (value && *value) {
      // A Slurm allocation alone (no srun step) is not an MPI launch.
      if (std::string(v) == "SLURM_NTASKS" && !std::getenv("SLURM_STEP_ID")) continue;
      return true;
    }
  }
  return false;
}
}  // namespace

StatusOr<Comm> init_world(const std::string& backend) {
  if (backend == "nccl") {
#ifdef GALE_HAVE_CUDA
    // NCCL needs a launcher for rank discovery; MPI provides it.
#else
    return InvalidArgument("--distributed-backend nccl: this build of gale has no CUDA/NCCL (built without a CUDA toolkit); use --distributed-backend mpi");
#endif
  } else if (backend != "mpi" && backend != "gloo") {
    return InvalidArgument("--distributed-backend: expected one of mpi, nccl, gloo; found '", backend, "'");
  }
  if (!launched_by_mpi()) return make_self_communicator("world");
  return init_mpi_world();
}

}  // namespace gale
