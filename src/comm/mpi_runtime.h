// Process-wide MPI machinery behind MpiCommunicator: type mapping, error checks, the watchdog
// that turns a hung operation into a job abort, and the background completion of non-blocking
// point-to-point requests. Internal to comm/ (only mpi_communicator.cc and nccl_* include it).
#pragma once

// The C API only: Open MPI's deprecated C++ bindings need a library gale does not link.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>

#include "comm/communicator.h"

namespace gale::mpi {

// The MPI type elements of `dtype` travel as (bf16 as opaque 16-bit words: reductions of bf16
// are done in f32 by the caller, see mpi_communicator.h).
MPI_Datatype datatype(DType dtype);
MPI_Op reduce_op(ReduceOp op);

// Aborts the job (every rank) with "gale: MPI error in <what>: <MPI's message>" unless rc is
// MPI_SUCCESS. Communicators use MPI_ERRORS_RETURN, so every MPI failure comes through here.
void check(int rc, const std::string& what);
inline void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) check(rc, std::string(what));
}
// `n` as an MPI count, or a CHECK failure naming the operation when it exceeds INT_MAX.
int to_int_count(int64_t n, const char* what);

// An operation in flight, watched by the watchdog from its start until untrack().
class TrackedOp {
 public:
  virtual ~TrackedOp() = default;
  virtual std::string describe() const = 0;  // "all_reduce of 4.0 MiB on group 'dp' (rank 1 of 2)"
  double started_at = 0.0;                   // now_seconds() when issued
};
void track(TrackedOp* op);
void untrack(TrackedOp* op);
// An operation not completed after `seconds` aborts the job naming it (0 disables). Starts the
// watchdog thread on first call.
void set_timeout(double seconds);
double timeout_seconds();  // -1 until set_timeout is first called
// Stops the watchdog thread (after MPI_Finalize).
void stop_watchdog();

// Hands a started non-blocking request to the progress thread, which polls it (MPI_Testsome,
// yielding between polls and backing off in proportion to how long it has been idle) and calls
// on_done() on completion; a failed request aborts the job naming `what`.
void complete_in_background(MPI_Request request, std::string what, std::function<void()> on_done);
// Waits until every request handed over has completed, then stops the progress thread.
void stop_progress();

}  // namespace gale::mpi
