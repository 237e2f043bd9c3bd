// NcclCommunicator: NCCL collectives on a per-group CUDA stream, deferred grouped point-to-point.
#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <vector>

#include "comm/launcher.h"
#include "core/check.h"
#include "core/log.h"

namespace gale {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fatal_exit(1, str_cat("gale: rank ", log_rank(), ": CUDA error in ", what, ": ", cudaGetErrorString(e),
                          "; aborting the job"));
}

void nccl_check(ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess && r != ncclInProgress)
    fatal_exit(1, str_cat("gale: rank ", log_rank(), ": NCCL error in ", what, ": ", ncclGetErrorString(r),
                          "; aborting the job"));
}

ncclDataType_t nccl_type(DType dtype, bool reducing) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kU8:
      return ncclUint8;
    case DType::kU16:
      GALE_CHECK(!reducing) << "NCCL cannot reduce u16 buffers";
      return ncclFloat16;  // moved as opaque 16-bit words
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

bool is_device_pointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "invalid value" of plain host pointers
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

// The completion event of one operation (or of one flushed batch of point-to-point operations).
struct EventSlot {
  cudaEvent_t event = nullptr;
  ~EventSlot() {
    if (event) cudaEventDestroy(event);
  }
};

class NcclCommunicator;

class NcclWork final : public Work {
 public:
  NcclWork(std::weak_ptr<NcclCommunicator> owner, std::shared_ptr<EventSlot> slot)
      : owner_(std::move(owner)), slot_(std::move(slot)) {}
  void wait() override;
  bool test() override;

 private:
  std::weak_ptr<NcclCommunicator> owner_;
  std::shared_ptr<EventSlot> slot_;
  bool done_ = false;
};

class NcclCommunicator final : public Communicator, public std::enable_shared_from_this<NcclCommunicator> {
 public:
  NcclCommunicator(ncclComm_t comm, int device, std::vector<int> world_ranks, std::string name, double timeout)
      : comm_(comm), device_(device), world_ranks_(std::move(world_ranks)), name_(std::move(name)), timeout_(timeout) {
    nccl_check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    nccl_check(ncclCommCount(comm_, &size_), "ncclCommCount");
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    cuda_check(cudaStreamCreate(&stream_), "cudaStreamCreate");
  }
  ~NcclCommunicator() override {
    flush();
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "nccl"; }

  WorkPtr all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    int64_t bytes = count * dtype_size(dtype);
    count_op(CommOp::kAllReduce, bytes);
    return launch({{buf, bytes, true}}, [=, this](std::vector<void*>& p) {
      nccl_check(ncclAllReduce(p[0], p[0], count, nccl_type(dtype, true), nccl_op(op), comm_, stream_),
                 what("all_reduce"));
    });
  }

  WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) override {
    int64_t es = dtype_size(dtype);
    count_op(CommOp::kReduceScatter, recv_count * size_ * es);
    return launch({{const_cast<void*>(send), recv_count * size_ * es, false}, {recv, recv_count * es, true}},
                  [=, this](std::vector<void*>& p) {
                    nccl_check(
                        ncclReduceScatter(p[0], p[1], recv_count, nccl_type(dtype, true), nccl_op(op), comm_, stream_),
                        what("reduce_scatter"));
                  });
  }

  WorkPtr all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    int64_t es = dtype_size(dtype);
    count_op(CommOp::kAllGather, send_count * size_ * es);
    return launch({{const_cast<void*>(send), send_count * es, false}, {recv, send_count * size_ * es, true}},
                  [=, this](std::vector<void*>& p) {
                    nccl_check(ncclAllGather(p[0], p[1], send_count, nccl_type(dtype, false), comm_, stream_),
                               what("all_gather"));
                  });
  }

  WorkPtr broadcast_async(void* buf, int64_t count, DType dtype, int root) override {
    GALE_CHECK(root >= 0 && root < size_) << "broadcast root " << root << " on group '" << name_ << "'";
    int64_t bytes = count * dtype_size(dtype);
    count_op(CommOp::kBroadcast, bytes);
    return launch({{buf, bytes, true}}, [=, this](std::vector<void*>& p) {
      nccl_check(ncclBroadcast(p[0], p[0], count, nccl_type(dtype, false), root, comm_, stream_), what("broadcast"));
    });
  }

  WorkPtr send_async(const void* buf, int64_t count, DType dtype, int dst, int tag) override {
    return defer_p2p(true, const_cast<void*>(buf), count, dtype, dst);
  }
  WorkPtr recv_async(void* buf, int64_t count, DType dtype, int src, int tag) override {
    return defer_p2p(false, buf, count, dtype, src);
  }

  WorkPtr all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    std::vector<int64_t> counts(size_, count), displs(size_);
    for (int r = 0; r < size_; ++r) displs[r] = r * count;
    return all_to_allv_async(send, counts, displs, recv, counts, displs, dtype);
  }

  WorkPtr all_to_allv_async(const void* send, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& send_displs, void* recv,
                            const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                            DType dtype) override {
    int64_t es = dtype_size(dtype);
    int64_t send_total = 0, send_extent = 0, recv_extent = 0;
    for (int r = 0; r < size_; ++r) {
      send_total += send_counts.at(r);
      send_extent = std::max(send_extent, send_displs.at(r) + send_counts[r]);
      recv_extent = std::max(recv_extent, recv_displs.at(r) + recv_counts.at(r));
    }
    count_op(CommOp::kAllToAll, send_total * es);
    return launch(
        {{const_cast<void*>(send), send_extent * es, false}, {recv, recv_extent * es, true}},
        [=, this](std::vector<void*>& p) {
          ncclDataType_t t = nccl_type(dtype, false);
          nccl_check(ncclGroupStart(), "ncclGroupStart");
          for (int r = 0; r < size_; ++r) {
            if (send_counts[r] > 0)
              nccl_check(ncclSend(static_cast<char*>(p[0]) + send_displs[r] * es, send_counts[r], t, r, comm_, stream_),
                         what("all_to_all"));
            if (recv_counts[r] > 0)
              nccl_check(ncclRecv(static_cast<char*>(p[1]) + recv_displs[r] * es, recv_counts[r], t, r, comm_, stream_),
                         what("all_to_all"));
          }
          nccl_check(ncclGroupEnd(), "ncclGroupEnd");
        });
  }

  void barrier() override {
    count_op(CommOp::kBarrier, 0);
    flush();
    float* scratch = nullptr;
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&scratch), sizeof(float), stream_), "cudaMallocAsync");
    nccl_check(ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, comm_, stream_), what("barrier"));
    cuda_check(cudaFreeAsync(scratch, stream_), "cudaFreeAsync");
    EventSlot done;
    cuda_check(cudaEventCreateWithFlags(&done.event, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(done.event, stream_), "cudaEventRecord");
    synchronize_with_timeout(done.event, "barrier");
  }

  Comm make_group(const std::vector<int>& world_ranks, const std::string& name) override {
    flush();
    int color = NCCL_SPLIT_NOCOLOR, key = 0;
    if (!world_ranks.empty()) {
      auto it = std::find(world_ranks.begin(), world_ranks.end(), world_ranks_[rank_]);
      GALE_CHECK(it != world_ranks.end()) << "make_group('" << name << "'): world rank " << world_ranks_[rank_]
                                          << " asked for a group it is not a member of";
      color = *std::min_element(world_ranks.begin(), world_ranks.end());
      key = static_cast<int>(it - world_ranks.begin());
    }
    ncclComm_t sub = nullptr;
    nccl_check(ncclCommSplit(comm_, color, key, &sub, nullptr), what("make_group"));
    if (world_ranks.empty() || sub == nullptr) return nullptr;
    auto c = std::make_shared<NcclCommunicator>(sub, device_, world_ranks, name, timeout_);
    GALE_CHECK_EQ(c->size(), static_cast<int>(world_ranks.size())) << "make_group('" << name << "')";
    return c;
  }

  // Issue the deferred point-to-point operations as one NCCL group and give them one event.
  void flush() {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty()) return;
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (const P2P& op : pending_) {
      if (op.send)
        nccl_check(ncclSend(op.buf, op.count, op.type, op.peer, comm_, stream_), what("send"));
      else
        nccl_check(ncclRecv(op.buf, op.count, op.type, op.peer, comm_, stream_), what("recv"));
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    cuda_check(cudaEventCreateWithFlags(&pending_slot_->event, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(pending_slot_->event, stream_), "cudaEventRecord");
    pending_.clear();
    pending_slot_.reset();
  }

  // Block until `event` completes; abort the job on an asynchronous NCCL error or the timeout.
  void synchronize_with_timeout(cudaEvent_t event, const char* op) {
    double start = now_seconds();
    for (;;) {
      cudaError_t q = cudaEventQuery(event);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) cuda_check(q, op);
      ncclResult_t async_error = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async_error);
      if (async_error != ncclSuccess && async_error != ncclInProgress) {
        ncclCommAbort(comm_);
        nccl_check(async_error, what(op));
      }
      if (timeout_ > 0 && now_seconds() - start > timeout_) {
        ncclCommAbort(comm_);
        fatal_exit(1, str_cat("gale: rank ", log_rank(), ": ", what(op), " has not completed after ",
                              static_cast<int64_t>(timeout_), " s (--distributed-timeout-minutes); aborting the job"));
      }
      sched_yield();
    }
    add_wait_seconds(now_seconds() - start);
  }

 private:
  struct Buffer {
    void* ptr;
    int64_t bytes;
    bool written;  // copied back to the host when staged
  };
  struct P2P {
    bool send;
    void* buf;
    size_t count;
    ncclDataType_t type;
    int peer;
  };

  std::string what(const char* op) const {
    return str_cat(op, " on group '", name_, "' (rank ", rank_, " of ", size_, ")");
  }
  void count_op(CommOp op, int64_t bytes) { count(op, bytes); }

  // Enqueue `body` on the stream with device pointers; host buffers are staged through device
  // copies and the operation then completes before launch() returns.
  WorkPtr launch(std::vector<Buffer> buffers, const std::function<void(std::vector<void*>&)>& body) {
    flush();
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    bool staged = std::any_of(buffers.begin(), buffers.end(),
                              [](const Buffer& b) { return b.bytes > 0 && !is_device_pointer(b.ptr); });
    std::vector<void*> ptrs;
    for (const Buffer& b : buffers) ptrs.push_back(b.ptr);
    if (staged) {
      for (size_t i = 0; i < buffers.size(); ++i) {
        cuda_check(cudaMallocAsync(&ptrs[i], std::max<int64_t>(buffers[i].bytes, 1), stream_), "cudaMallocAsync");
        if (buffers[i].bytes > 0)
          cuda_check(cudaMemcpyAsync(ptrs[i], buffers[i].ptr, buffers[i].bytes, cudaMemcpyDefault, stream_),
                     "cudaMemcpyAsync");
      }
    }
    body(ptrs);
    if (staged) {
      for (size_t i = 0; i < buffers.size(); ++i) {
        if (buffers[i].written && buffers[i].bytes > 0)
          cuda_check(cudaMemcpyAsync(buffers[i].ptr, ptrs[i], buffers[i].bytes, cudaMemcpyDefault, stream_),
                     "cudaMemcpyAsync");
        cuda_check(cudaFreeAsync(ptrs[i], stream_), "cudaFreeAsync");
      }
    }
    auto slot = std::make_shared<EventSlot>();
    cuda_check(cudaEventCreateWithFlags(&slot->event, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(slot->event, stream_), "cudaEventRecord");
    auto work = std::make_shared<NcclWork>(weak_from_this(), slot);
    if (staged) work->wait();
    return work;
  }

  WorkPtr defer_p2p(bool send, void* buf, int64_t count, DType dtype, int peer) {
    GALE_CHECK(peer >= 0 && peer < size_ && peer != rank_)
        << (send ? "send" : "recv") << " with peer " << peer << " on group '" << name_ << "'";
    GALE_CHECK(is_device_pointer(buf)) << "NCCL " << (send ? "send" : "recv") << " needs a device buffer";
    count_op(send ? CommOp::kSend : CommOp::kRecv, count * dtype_size(dtype));
    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_slot_) pending_slot_ = std::make_shared<EventSlot>();
    pending_.push_back(P2P{send, buf, static_cast<size_t>(count), nccl_type(dtype, false), peer});
    return std::make_shared<NcclWork>(weak_from_this(), pending_slot_);
  }

  friend class NcclWork;
  ncclComm_t comm_;
  int device_;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
  std::string name_;
  double timeout_;
  std::mutex mu_;
  std::vector<P2P> pending_;
  std::shared_ptr<EventSlot> pending_slot_;
};

void NcclWork::wait() {
  if (done_) return;
  auto owner = owner_.lock();
  GALE_CHECK(owner) << "waiting on a NCCL operation whose communicator no longer exists";
  if (!slot_->event) owner->flush();
  owner->synchronize_with_timeout(slot_->event, "wait");
  done_ = true;
}

bool NcclWork::test() {
  if (done_) return true;
  if (!slot_->event) {
    auto owner = owner_.lock();
    GALE_CHECK(owner) << "testing a NCCL operation whose communicator no longer exists";
    owner->flush();
  }
  done_ = cudaEventQuery(slot_->event) == cudaSuccess;
  return done_;
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

StatusOr<Comm> init_nccl_world(const Comm& bootstrap, double timeout_seconds) {
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::string why = e != cudaSuccess ? cudaGetErrorString(e) : "0 devices";
    cudaGetLastError();
    return FailedPrecondition("--distributed-backend nccl: no CUDA GPU is visible to this process (", why,
                              "); use --distributed-backend mpi");
  }
  int device = local_rank_from_launcher(bootstrap->rank()) % devices;
  if (cudaError_t s = cudaSetDevice(device); s != cudaSuccess)
    return Internal("--distributed-backend nccl: cudaSetDevice(", device, "): ", cudaGetErrorString(s));
  ncclUniqueId id{};
  if (bootstrap->rank() == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      return Internal("--distributed-backend nccl: ncclGetUniqueId: ", ncclGetErrorString(r));
  }
  bootstrap->broadcast(&id, sizeof(id), DType::kU8, 0);
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, bootstrap->size(), id, bootstrap->rank()); r != ncclSuccess)
    return Internal("--distributed-backend nccl: ncclCommInitRank (rank ", bootstrap->rank(), " of ", bootstrap->size(),
                    ", device ", device, "): ", ncclGetErrorString(r));
  Comm world = std::make_shared<NcclCommunicator>(comm, device, bootstrap->world_ranks(), "world", timeout_seconds);
  return world;
}

}  // namespace gale
