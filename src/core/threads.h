// The one thread pool of the process: OpenMP, shared with oneDNN (built on the same libgomp).
//
// Gale never starts a second compute pool: kernels use `parallel_for` (or `#pragma omp`), and
// GEMMs go to oneDNN, which runs on these same OpenMP threads. `--num-threads` (or
// OMP_NUM_THREADS) sets the size once at start-up.
#pragma once

#include <algorithm>
#include <cstdint>

namespace gale {

int num_threads();
void set_num_threads(int n);
int thread_index();  // inside a parallel region; 0 outside

// Processes of this job on this node, from the launcher's environment (OMPI_COMM_WORLD_LOCAL_SIZE,
// MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE); 1 when started without a launcher.
int local_process_count();
// CPUs this process may run on (its affinity mask).
int available_cores();
// The thread count a process should use when neither --num-threads nor OMP_NUM_THREADS says:
// available_cores() / local_process_count(), at least 1, so that `mpirun -np 2` on 2 cores does
// not run 4 threads on 2 cores.
int default_threads_per_process();

// Calls fn(begin, end) on disjoint chunks of [0, n) in parallel. Chunks have at least `grain`
// items; small ranges run inline on the calling thread.
template <class Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  int threads = num_threads();
  if (threads <= 1 || n <= grain) {
    fn(int64_t{0}, n);
    return;
  }
  int64_t chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
#pragma omp parallel for num_threads(static_cast<int>(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t begin = n * c / chunks;
    int64_t end = n * (c + 1) / chunks;
    fn(begin, end);
  }
}

}  // namespace gale
