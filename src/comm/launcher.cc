// What the launcher tells a process about its place (comm/launcher.h).
#include "comm/launcher.h"

#include <cstdlib>
#include <initializer_list>
#include <string>

namespace gale {

int local_rank_from_launcher(int fallback) {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"}) {
    if (const char* s = std::getenv(v); s && *s) return std::atoi(s);
  }
  return fallback;
}

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

}  // namespace gale
