// What the launcher tells a process about its place (comm/launcher.h).
#include "comm/launcher.h"

#include <cstdlib>
#include <initializer_list>

namespace gale {

int local_rank_from_launcher(int fallback) {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"}) {
    if (const char* s = std::getenv(v); s && *s) return std::atoi(s);
  }
  return fallback;
}

}  // namespace gale
