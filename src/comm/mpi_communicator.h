// MPI implementation of Communicator (Open MPI from Debian; started by mpirun or srun).
//
// Progress: each group runs its collectives, in issue order, as *blocking* MPI calls on its own
// communication thread (comm/serial_executor.h); point-to-point operations start at once with
// MPI_Isend/MPI_Irecv and are completed by one progress thread per process that polls them.
// Measured on the 2-core development machine (bench/comm_overlap_bench.cc, docs/parallelism.md
// §4.3): Open MPI's non-blocking collectives (libnbc) run large all-reduces 2-2.6x slower than
// the blocking ones, so a dedicated thread running blocking collectives overlaps compute better
// than polling MPI_Iallreduce from a progress thread. Blocking forms run on the caller's thread
// when the group has nothing in flight (no hand-off latency).
//
// Data types: f32, f64, i32, i64 reduce natively. bf16 and f16 sums (and max/min) are computed in f32:
// the buffer is widened to f32, reduced, and rounded back once, so the result is the
// correctly rounded sum of the f32 values (not a chain of bf16 roundings), at twice the bytes on
// the wire (CommStats still counts the bf16 bytes the caller passed). Non-reducing operations
// move bf16 as 16-bit words.
//
// Failures: MPI errors are returned (MPI_ERRORS_RETURN) and turned into a one-line message and
// a job abort; a failed CHECK or fatal_exit(code != 0) on any rank calls MPI_Abort so that every
// rank stops; an operation that has not completed after the timeout (--distributed-timeout-minutes,
// default 10) aborts the job naming the operation and group; mpirun ends the job when a rank dies.
// MPI_Finalize runs at normal exit (atexit). See docs/parallelism.md.
#pragma once

#include "comm/communicator.h"

namespace gale {

// Initialises MPI (MPI_THREAD_MULTIPLE is required) and returns the world communicator; later
// calls return the same one. Sets the log identity (rank, world size), installs the abort hook,
// the watchdog (timeout 10 minutes until set_distributed_timeout) and the MPI_Finalize at exit.
StatusOr<Comm> init_mpi_world();

// Operations still running after `seconds` abort the job (0 disables the watchdog).
void set_distributed_timeout(double seconds);

}  // namespace gale
