// MPI communicator (placeholder until the MPI backend lands: refuses multi-rank launches).
#include "comm/mpi_communicator.h"

namespace gale {

StatusOr<Comm> init_mpi_world() {
  return Unimplemented("multi-process runs (mpirun/srun) are not supported yet");
}

}  // namespace gale
