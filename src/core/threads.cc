// OpenMP thread-count control.
#include "core/threads.h"

#include <omp.h>
#include <sched.h>

#include <cstdlib>

namespace gale {

int num_threads() { return omp_get_max_threads(); }
void set_num_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}
int thread_index() { return omp_get_thread_num(); }

int local_process_count() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    const char* value = std::getenv(v);
    if (value && *value) {
      int n = std::atoi(value);  // SLURM may say "4(x2)": atoi reads the leading 4
      if (n > 0) return n;
    }
  }
  return 1;
}

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, omp_get_num_procs());
}

int default_threads_per_process() { return std::max(1, available_cores() / local_process_count()); }

}  // namespace gale
