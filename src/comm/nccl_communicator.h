// NCCL implementation of Communicator (GPU buffers; compiled only when CUDA and NCCL are found).
//
// One GPU per process: the process uses device (local rank mod visible devices), the local rank
// coming from the launcher (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID) or else
// the world rank. Ranks find each other through `bootstrap` (the MPI world, or self for one
// process): rank 0 creates the ncclUniqueId and broadcasts it; sub-groups use ncclCommSplit.
//
// Each group has its own CUDA stream, created blocking so it is ordered after work on the
// legacy default stream; wait() blocks the host until the operation has finished on the GPU.
// Point-to-point operations are deferred and issued together in one ncclGroupStart/End as soon
// as a Work is waited on or tested, or a collective is issued (like torch's batch_isend_irecv),
// so a send/recv exchange between two ranks cannot deadlock. Buffers must be device memory;
// host buffers (e.g. all_reduce_scalar) are staged through a device copy, synchronously.
// bf16 is reduced natively by NCCL. wait() aborts the job (ncclCommAbort, then the abort hook)
// when NCCL reports an asynchronous error or the operation exceeds the timeout.
#pragma once

#include "comm/communicator.h"

namespace gale {

// The NCCL world over `bootstrap`'s ranks. Errors (one line): no CUDA device visible, CUDA or
// NCCL initialisation failures. `timeout_seconds` bounds every wait() (--distributed-timeout-minutes).
StatusOr<Comm> init_nccl_world(const Comm& bootstrap, double timeout_seconds);

// Number of CUDA devices visible to this process (0 when none or no driver).
int cuda_device_count();

}  // namespace gale
