// What the launcher (mpirun, srun, torchrun-style environments) tells a process about its place.
#pragma once

namespace gale {

// The process's rank on its node: $OMPI_COMM_WORLD_LOCAL_RANK, $SLURM_LOCALID, $MPI_LOCALRANKID or
// $LOCAL_RANK, the first one set; `fallback` when none is.
int local_rank_from_launcher(int fallback);

}  // namespace gale
