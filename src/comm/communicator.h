// One communicator interface for all collectives; process groups are values of this type.
//
// A `Comm` (shared_ptr<Communicator>) is a process group: every layer that communicates takes
// the group it needs as an argument (the TP group, the DP group, ...); there is no global group.
// Implementations: SelfCommunicator (one process, every collective is a copy), MpiCommunicator
// (mpi_communicator.h) and NcclCommunicator (nccl_communicator.h, only with CUDA).
//
// All buffers are host pointers (device pointers for NCCL) of `count` elements of `dtype`.
// Every operation exists in a non-blocking form returning a Work handle; the blocking form is
// the non-blocking one followed by wait(). Operations on one communicator must be issued in the
// same order on every member rank (as MPI/NCCL require), from one thread at a time. Collectives
// on one communicator run in issue order; collectives on different communicators and
// point-to-point operations may run concurrently (like NCCL streams), so a rank may interleave
// operations on several groups freely. Buffers must stay untouched until the Work completes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/trace.h"

namespace gale {

enum class ReduceOp { kSum, kMax, kMin };

// The kinds of operation counted by CommStats.
enum class CommOp : int {
  kAllReduce = 0,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kSend,
  kRecv,
  kAllToAll,
  kBarrier,
  kCount
};
const char* comm_op_name(CommOp op);

// Per-group counters of calls and payload bytes. Bytes are the bytes this rank passes to the
// operation: all_reduce counts `count*size`, reduce_scatter the full input (size*recv_count),
// all_gather the full output (size*send_count), send/recv their buffer, broadcast its buffer,
// all_to_all the full send buffer. docs/parallelism.md derives per-step totals from these.
struct CommStats {
  std::array<int64_t, static_cast<int>(CommOp::kCount)> calls{};
  std::array<int64_t, static_cast<int>(CommOp::kCount)> bytes{};
  double wait_seconds = 0.0;  // time spent blocked in wait() (exposed communication)
  int64_t total_bytes() const;
  int64_t total_calls() const;
};

// Handle of a non-blocking operation. wait() blocks until it completes; it is safe to call twice.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;  // true once complete (does not block)
};
using WorkPtr = std::shared_ptr<Work>;
// A Work that is already complete.
WorkPtr completed_work();

class Communicator;
using Comm = std::shared_ptr<Communicator>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The global (world) rank of each member, in group-rank order.
  virtual const std::vector<int>& world_ranks() const = 0;
  // A short label for logs and stats: "world", "tp", "dp", ...
  virtual const std::string& name() const = 0;
  // "self", "mpi" or "nccl".
  virtual const char* backend() const = 0;

  // ---- non-blocking operations ----
  // In place: buf[i] = op over ranks of buf[i].
  virtual WorkPtr all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) = 0;
  // send holds size()*recv_count elements; rank r receives the reduction of block r.
  virtual WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) = 0;
  // recv holds size()*send_count elements: block r is rank r's send buffer.
  virtual WorkPtr all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) = 0;
  virtual WorkPtr broadcast_async(void* buf, int64_t count, DType dtype, int root) = 0;
  virtual WorkPtr send_async(const void* buf, int64_t count, DType dtype, int dst, int tag) = 0;
  virtual WorkPtr recv_async(void* buf, int64_t count, DType dtype, int src, int tag) = 0;
  // send and recv hold size()*count elements; block r goes to / comes from rank r.
  virtual WorkPtr all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // Variable-size all-to-all: counts and displacements in elements, one per rank.
  virtual WorkPtr all_to_allv_async(const void* send, const std::vector<int64_t>& send_counts,
                                    const std::vector<int64_t>& send_displs, void* recv,
                                    const std::vector<int64_t>& recv_counts,
                                    const std::vector<int64_t>& recv_displs, DType dtype) = 0;
  virtual void barrier() = 0;

  // ---- blocking forms ----
  // By default the non-blocking form followed by wait(); a backend may run them more directly
  // (the MPI one calls MPI on the caller's thread when the group has nothing in flight).
  virtual void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op = ReduceOp::kSum) {
    all_reduce_async(buf, count, dtype, op)->wait();
  }
  virtual void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                              ReduceOp op = ReduceOp::kSum) {
    reduce_scatter_async(send, recv, recv_count, dtype, op)->wait();
  }
  virtual void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) {
    all_gather_async(send, recv, send_count, dtype)->wait();
  }
  virtual void broadcast(void* buf, int64_t count, DType dtype, int root) {
    broadcast_async(buf, count, dtype, root)->wait();
  }
  void send(const void* buf, int64_t count, DType dtype, int dst, int tag = 0) {
    send_async(buf, count, dtype, dst, tag)->wait();
  }
  void recv(void* buf, int64_t count, DType dtype, int src, int tag = 0) {
    recv_async(buf, count, dtype, src, tag)->wait();
  }
  virtual void all_to_all(const void* send, void* recv, int64_t count, DType dtype) {
    all_to_all_async(send, recv, count, dtype)->wait();
  }

  // Convenience for scalars (e.g. loss sums): all-reduce one double / int64 in place.
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::kSum);
  int64_t all_reduce_scalar(int64_t value, ReduceOp op = ReduceOp::kSum);

  // A sub-group made of `world_ranks` (which must include this rank), named `name`; group rank i
  // is world_ranks[i]. Collective: every member of *this* communicator calls it, each passing
  // the group it belongs to (the groups are disjoint). A rank that belongs to none of the groups
  // passes an empty list and gets nullptr (e.g. middle pipeline stages for the embedding group).
  virtual Comm make_group(const std::vector<int>& world_ranks, const std::string& name) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

 protected:
  // Also an instant event of --profile's trace (core/trace.h, category comm: the operation's name,
  // its bytes and the group) when communication is traced.
  void count(CommOp op, int64_t bytes) {
    stats_.calls[static_cast<int>(op)] += 1;
    stats_.bytes[static_cast<int>(op)] += bytes;
    if (trace_active(TraceCategory::kComm)) trace_issue(op, bytes);
  }
  void add_wait_seconds(double seconds) { stats_.wait_seconds += seconds; }
  // The time this rank was blocked on one operation, as a span "<op> wait" of the trace ending now.
  void trace_wait(CommOp op, int64_t bytes, double seconds) {
    if (trace_active(TraceCategory::kComm)) trace_wait_event(op, bytes, seconds);
  }
  CommStats stats_;

 private:
  void trace_issue(CommOp op, int64_t bytes);
  void trace_wait_event(CommOp op, int64_t bytes, double seconds);
};

// The single-process world: size 1, every collective copies send to recv.
Comm make_self_communicator(const std::string& name = "world");

// The world communicator for this process: MPI when launched by mpirun/srun (or when the
// requested backend needs it), otherwise self. `backend` is --distributed-backend:
// "mpi", "nccl", "gloo"... ; an unavailable backend is an error naming the flag.
// `timeout_minutes` is --distributed-timeout-minutes: an operation that has not completed after
// that long aborts the whole job with a message naming it (see mpi_communicator.h).
StatusOr<Comm> init_world(const std::string& backend, double timeout_minutes = 10.0);

}  // namespace gale
