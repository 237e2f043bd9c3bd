// MPI implementation of Communicator (Open MPI from Debian; started by mpirun or srun).
#pragma once

#include "comm/communicator.h"

namespace gale {

// Initialises MPI (MPI_THREAD_MULTIPLE when available) and returns the world communicator.
// Installs an abort hook so that a failed CHECK on any rank takes the whole job down.
StatusOr<Comm> init_mpi_world();

}  // namespace gale
