// What the launcher (mpirun, srun, torchrun-style environments) tells a process about its place.
#pragma once

namespace gale {

// The process's rank on its node: $OMPI_COMM_WORLD_LOCAL_RANK, $SLURM_LOCALID, $MPI_LOCALRANKID or
// $LOCAL_RANK, the first one set; `fallback` when none is.
int local_rank_from_launcher(int fallback);

// True when started by mpirun/mpiexec (Open MPI, MPICH, Intel MPI) or by srun with PMI (a Slurm
// allocation alone, without an srun step, is not).
bool launched_by_mpi();

}  // namespace gale
