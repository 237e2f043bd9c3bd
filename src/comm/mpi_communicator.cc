// MpiCommunicator: collectives on per-group threads, point-to-point via the progress thread.
#include "comm/mpi_communicator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "comm/mpi_runtime.h"
#include "comm/serial_executor.h"
#include "core/check.h"
#include "core/log.h"

namespace gale {

namespace {

class MpiCommunicator;

// A non-blocking operation: finished by a group thread (collectives) or the progress thread
// (point-to-point); watched by the watchdog until then.
class MpiWork final : public Work, public mpi::TrackedOp {
 public:
  MpiWork(std::weak_ptr<MpiCommunicator> owner, std::string group, int rank, int size, CommOp op, int64_t bytes)
      : owner_(std::move(owner)), group_(std::move(group)), rank_(rank), size_(size), op_(op), bytes_(bytes) {
    started_at = now_seconds();
    mpi::track(this);
  }
  ~MpiWork() override {
    if (!done_.load()) mpi::untrack(this);
  }

  void wait() override;
  bool test() override { return done_.load(std::memory_order_acquire); }

  void finish() {
    mpi::untrack(this);
    std::lock_guard<std::mutex> lock(mu_);
    done_.store(true, std::memory_order_release);
    cv_.notify_all();
  }

  std::string describe() const override {
    return str_cat(comm_op_name(op_), " of ", format_bytes(bytes_), " on group '", group_, "' (rank ", rank_, " of ",
                   size_, ")");
  }

 private:
  std::weak_ptr<MpiCommunicator> owner_;
  std::string group_;
  int rank_, size_;
  CommOp op_;
  int64_t bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
};

bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

bool is_half_float(DType dtype) { return dtype == DType::kBF16 || dtype == DType::kF16; }

// A bf16 or f16 buffer as f32 values, and back (rounded to nearest even).
std::vector<float> widen_half(const void* src, int64_t n, DType dtype) {
  std::vector<float> out(static_cast<size_t>(n));
  if (dtype == DType::kBF16) {
    const bf16* s = static_cast<const bf16*>(src);
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(s[i]);
  } else {
    const f16* s = static_cast<const f16*>(src);
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_float(s[i]);
  }
  return out;
}

void narrow_half(const float* src, void* dst, int64_t n, DType dtype) {
  if (dtype == DType::kBF16) {
    bf16* d = static_cast<bf16*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
  } else {
    f16* d = static_cast<f16*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_f16(src[i]);
  }
}

// MPI counts are int; element-wise operations on larger buffers go in chunks of this many.
constexpr int64_t kMaxChunk = int64_t{1} << 30;

class MpiCommunicator final : public Communicator, public std::enable_shared_from_this<MpiCommunicator> {
 public:
  MpiCommunicator(MPI_Comm comm, std::vector<int> world_ranks, std::string name)
      : comm_(comm), world_ranks_(std::move(world_ranks)), name_(std::move(name)), executor_(name_) {
    mpi::check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    mpi::check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    GALE_CHECK_EQ(static_cast<int>(world_ranks_.size()), size_) << "group '" << name_ << "'";
    int flag = 0;
    int* tag_ub = nullptr;
    mpi::check(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &flag), "MPI_Comm_get_attr(MPI_TAG_UB)");
    tag_ub_ = flag && tag_ub ? *tag_ub : 32767;
  }

  ~MpiCommunicator() override { release(); }

  // Finish queued collectives, stop the group thread and free the MPI communicator (unless MPI
  // is already finalised). Called by the destructor and before MPI_Finalize.
  void release() {
    executor_.shutdown();
    std::lock_guard<std::mutex> lock(release_mu_);
    if (comm_ == MPI_COMM_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "mpi"; }

  void record_wait(CommOp op, int64_t bytes, double seconds) {
    add_wait_seconds(seconds);
    trace_wait(op, bytes, seconds);
  }

  // Blocking forms: when this group has nothing queued or running, the MPI call runs on the
  // caller's thread (no hand-off latency); otherwise they queue behind the earlier collectives.
  void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op = ReduceOp::kSum) override {
    blocking([&] { return all_reduce_async(buf, count, dtype, op); });
  }
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                      ReduceOp op = ReduceOp::kSum) override {
    blocking([&] { return reduce_scatter_async(send, recv, recv_count, dtype, op); });
  }
  void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    blocking([&] { return all_gather_async(send, recv, send_count, dtype); });
  }
  void broadcast(void* buf, int64_t count, DType dtype, int root) override {
    blocking([&] { return broadcast_async(buf, count, dtype, root); });
  }
  void all_to_all(const void* send, void* recv, int64_t count, DType dtype) override {
    blocking([&] { return all_to_all_async(send, recv, count, dtype); });
  }

  WorkPtr all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    const int64_t es = dtype_size(dtype);
    if (size_ == 1) return local_copy(CommOp::kAllReduce, buf, buf, count, dtype);
    return collective(CommOp::kAllReduce, count * es, [=, this] {
      if (is_half_float(dtype)) {
        std::vector<float> wide = widen_half(buf, count, dtype);
        all_reduce_chunks(wide.data(), count, DType::kF32, op);
        narrow_half(wide.data(), buf, count, dtype);
      } else {
        all_reduce_chunks(buf, count, dtype, op);
      }
    });
  }

  WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) override {
    const int64_t es = dtype_size(dtype);
    const int64_t total = recv_count * size_;
    if (size_ == 1) return local_copy(CommOp::kReduceScatter, send, recv, recv_count, dtype);
    int n = mpi::to_int_count(recv_count, "reduce_scatter");
    return collective(CommOp::kReduceScatter, total * es, [=, this] {
      if (is_half_float(dtype)) {
        std::vector<float> wide = widen_half(send, total, dtype);
        std::vector<float> out(static_cast<size_t>(recv_count));
        mpi::check(MPI_Reduce_scatter_block(wide.data(), out.data(), n, MPI_FLOAT, mpi::reduce_op(op), comm_),
                   what("reduce_scatter"));
        narrow_half(out.data(), recv, recv_count, dtype);
        return;
      }
      std::vector<char> copy;
      const void* src = send;
      if (ranges_overlap(send, total * es, recv, recv_count * es)) {  // e.g. recv is this rank's block of send
        copy.assign(static_cast<const char*>(send), static_cast<const char*>(send) + total * es);
        src = copy.data();
      }
      mpi::check(MPI_Reduce_scatter_block(src, recv, n, mpi::datatype(dtype), mpi::reduce_op(op), comm_),
                 what("reduce_scatter"));
    });
  }

  WorkPtr all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    const int64_t es = dtype_size(dtype);
    if (size_ == 1) return local_copy(CommOp::kAllGather, send, recv, send_count, dtype);
    int n = mpi::to_int_count(send_count, "all_gather");
    return collective(CommOp::kAllGather, send_count * size_ * es, [=, this] {
      MPI_Datatype t = mpi::datatype(dtype);
      const char* own_block = static_cast<const char*>(recv) + rank_ * send_count * es;
      if (send == own_block) {
        mpi::check(MPI_Allgather(MPI_IN_PLACE, 0, t, recv, n, t, comm_), what("all_gather"));
        return;
      }
      std::vector<char> copy;
      const void* src = send;
      if (ranges_overlap(send, send_count * es, recv, send_count * size_ * es)) {
        copy.assign(static_cast<const char*>(send), static_cast<const char*>(send) + send_count * es);
        src = copy.data();
      }
      mpi::check(MPI_Allgather(src, n, t, recv, n, t, comm_), what("all_gather"));
    });
  }

  WorkPtr broadcast_async(void* buf, int64_t count, DType dtype, int root) override {
    GALE_CHECK(root >= 0 && root < size_)
        << "broadcast root " << root << " on group '" << name_ << "' of size " << size_;
    const int64_t es = dtype_size(dtype);
    if (size_ == 1) return local_copy(CommOp::kBroadcast, buf, buf, count, dtype);
    return collective(CommOp::kBroadcast, count * es, [=, this] {
      for (int64_t off = 0; off < count; off += kMaxChunk) {
        int n = static_cast<int>(std::min(kMaxChunk, count - off));
        mpi::check(MPI_Bcast(static_cast<char*>(buf) + off * es, n, mpi::datatype(dtype), root, comm_),
                   what("broadcast"));
      }
    });
  }

  WorkPtr send_async(const void* buf, int64_t count, DType dtype, int dst, int tag) override {
    return point_to_point(CommOp::kSend, const_cast<void*>(buf), count, dtype, dst, tag);
  }

  WorkPtr recv_async(void* buf, int64_t count, DType dtype, int src, int tag) override {
    return point_to_point(CommOp::kRecv, buf, count, dtype, src, tag);
  }

  WorkPtr all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    const int64_t es = dtype_size(dtype);
    if (size_ == 1) return local_copy(CommOp::kAllToAll, send, recv, count, dtype);
    int n = mpi::to_int_count(count, "all_to_all");
    return collective(CommOp::kAllToAll, count * size_ * es, [=, this] {
      std::vector<char> copy;
      const void* src = send;
      if (ranges_overlap(send, count * size_ * es, recv, count * size_ * es)) {
        copy.assign(static_cast<const char*>(send), static_cast<const char*>(send) + count * size_ * es);
        src = copy.data();
      }
      MPI_Datatype t = mpi::datatype(dtype);
      mpi::check(MPI_Alltoall(src, n, t, recv, n, t, comm_), what("all_to_all"));
    });
  }

  WorkPtr all_to_allv_async(const void* send, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& send_displs, void* recv,
                            const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                            DType dtype) override {
    const int64_t es = dtype_size(dtype);
    GALE_CHECK(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(send_displs.size()) == size_ &&
               static_cast<int>(recv_counts.size()) == size_ && static_cast<int>(recv_displs.size()) == size_)
        << "all_to_allv on group '" << name_ << "' of size " << size_ << " needs one count and displacement per rank";
    auto ints = [](const std::vector<int64_t>& v) {
      std::vector<int> out;
      for (int64_t x : v) out.push_back(mpi::to_int_count(x, "all_to_allv"));
      return out;
    };
    std::vector<int> sc = ints(send_counts), sd = ints(send_displs), rc = ints(recv_counts), rd = ints(recv_displs);
    int64_t send_total = 0, send_extent = 0;
    for (int r = 0; r < size_; ++r) {
      send_total += send_counts[r];
      send_extent = std::max(send_extent, send_displs[r] + send_counts[r]);
    }
    return collective(CommOp::kAllToAll, send_total * es, [=, this] {
      std::vector<char> copy;
      const void* src = send;
      if (send == recv) {  // the only overlap callers produce; copy the send side
        copy.assign(static_cast<const char*>(send), static_cast<const char*>(send) + send_extent * es);
        src = copy.data();
      }
      MPI_Datatype t = mpi::datatype(dtype);
      mpi::check(MPI_Alltoallv(src, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_),
                 what("all_to_allv"));
    });
  }

  void barrier() override {
    if (size_ == 1) {
      count(CommOp::kBarrier, 0);
      return;
    }
    blocking([this] {
      return collective(CommOp::kBarrier, 0, [this] { mpi::check(MPI_Barrier(comm_), what("barrier")); });
    });
  }

  Comm make_group(const std::vector<int>& world_ranks, const std::string& name) override;

 private:
  std::string what(const char* op) const {
    return str_cat(op, " on group '", name_, "' (rank ", rank_, " of ", size_, ")");
  }

  std::shared_ptr<MpiWork> new_work(CommOp op, int64_t bytes, bool counted = true) {
    if (counted) count(op, bytes);
    return std::make_shared<MpiWork>(weak_from_this(), name_, rank_, size_, op, bytes);
  }

  // Runs `body` (blocking MPI calls) on this group's thread after the collectives issued before it.
  // `counted` is false for internal collectives (make_group), which CommStats does not count.
  WorkPtr collective(CommOp op, int64_t bytes, std::function<void()> body, bool counted = true) {
    auto work = new_work(op, bytes, counted);
    if (run_inline_) {
      double start = now_seconds();
      body();
      work->finish();
      add_wait_seconds(now_seconds() - start);
      if (counted) trace_wait(op, bytes, now_seconds() - start);
      return work;
    }
    executor_.submit([work, body = std::move(body)] {
      body();
      work->finish();
    });
    return work;
  }

  // Runs start() (an *_async call) so that its collective executes on this thread when the group
  // thread is idle; waits for it either way.
  template <class Start>
  void blocking(Start&& start) {
    if (size_ > 1 && executor_.idle()) {
      run_inline_ = true;
      WorkPtr work = start();
      run_inline_ = false;
      work->wait();
      return;
    }
    start()->wait();
  }

  // Collectives on a group of one are copies (or nothing), done at once without MPI.
  WorkPtr local_copy(CommOp op, const void* send, void* recv, int64_t n, DType dtype) {
    count(op, n * dtype_size(dtype));
    if (n > 0 && send != recv) std::memmove(recv, send, static_cast<size_t>(n) * dtype_size(dtype));
    return completed_work();
  }

  void all_reduce_chunks(void* buf, int64_t count, DType dtype, ReduceOp op) {
    const int64_t es = dtype_size(dtype);
    for (int64_t off = 0; off < count; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - off));
      mpi::check(MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(buf) + off * es, n, mpi::datatype(dtype),
                               mpi::reduce_op(op), comm_),
                 what("all_reduce"));
    }
  }

  WorkPtr point_to_point(CommOp op, void* buf, int64_t count, DType dtype, int peer, int tag) {
    const char* op_name = comm_op_name(op);
    GALE_CHECK(peer >= 0 && peer < size_ && peer != rank_)
        << op_name << " with peer " << peer << " on group '" << name_ << "' (rank " << rank_ << " of " << size_ << ")";
    GALE_CHECK(tag >= 0 && tag <= tag_ub_) << op_name << " tag " << tag << " outside [0, " << tag_ub_ << "]";
    int n = mpi::to_int_count(count, op_name);
    auto work = new_work(op, count * dtype_size(dtype));
    MPI_Request request;
    std::string description = str_cat(op_name, op == CommOp::kSend ? " to" : " from", " rank ", peer, " (tag ", tag,
                                      ") on group '", name_, "' (rank ", rank_, " of ", size_, ")");
    if (op == CommOp::kSend) {
      mpi::check(MPI_Isend(buf, n, mpi::datatype(dtype), peer, tag, comm_, &request), description);
    } else {
      mpi::check(MPI_Irecv(buf, n, mpi::datatype(dtype), peer, tag, comm_, &request), description);
    }
    mpi::complete_in_background(request, std::move(description), [work] { work->finish(); });
    return work;
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  int tag_ub_ = 32767;
  std::vector<int> world_ranks_;
  std::string name_;
  SerialExecutor executor_;
  std::mutex release_mu_;
  bool run_inline_ = false;  // set by blocking() around the *_async call it makes
};

// Every MPI communicator made in this process, so that the exit hook can stop their threads
// before MPI_Finalize. Never destroyed (it is used from the atexit hook).
struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<MpiCommunicator>> comms;
  Comm world;
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

std::shared_ptr<MpiCommunicator> make_mpi_communicator(MPI_Comm comm, std::vector<int> world_ranks,
                                                       const std::string& name) {
  auto c = std::make_shared<MpiCommunicator>(comm, std::move(world_ranks), name);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::erase_if(r.comms, [](const std::weak_ptr<MpiCommunicator>& w) { return w.expired(); });
  r.comms.push_back(c);
  return c;
}

void MpiWork::wait() {
  if (done_.load(std::memory_order_acquire)) return;
  double start = now_seconds();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_.load(std::memory_order_acquire); });
  }
  if (auto owner = owner_.lock()) owner->record_wait(op_, bytes_, now_seconds() - start);
}

Comm MpiCommunicator::make_group(const std::vector<int>& world_ranks, const std::string& name) {
  const int me = world_ranks_[rank_];
  int color = MPI_UNDEFINED, key = 0;
  if (!world_ranks.empty()) {
    auto it = std::find(world_ranks.begin(), world_ranks.end(), me);
    GALE_CHECK(it != world_ranks.end()) << "make_group('" << name << "'): world rank " << me
                                        << " asked for a group it is not a member of";
    color = *std::min_element(world_ranks.begin(), world_ranks.end());
    key = static_cast<int>(it - world_ranks.begin());
  }
  MPI_Comm sub = MPI_COMM_NULL;
  // MPI_Comm_split is a collective on this group: run it on the group thread, in issue order.
  blocking([&, this] {
    return collective(
        CommOp::kBarrier, 0,
        [&, this] {
          mpi::check(MPI_Comm_split(comm_, color, key, &sub), what(str_cat("make_group('", name, "')").c_str()));
        },
        /*counted=*/false);
  });
  if (sub == MPI_COMM_NULL) return nullptr;
  // Every member must have passed the same list: compare it with what MPI put together.
  int sub_size = 0;
  mpi::check(MPI_Comm_size(sub, &sub_size), "MPI_Comm_size");
  std::vector<int> members(static_cast<size_t>(sub_size));
  mpi::check(MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, sub), "make_group membership check");
  GALE_CHECK(members == world_ranks) << "make_group('" << name << "'): ranks of the group disagree on its members";
  return make_mpi_communicator(sub, world_ranks, name);
}

// ---- process lifetime ----

void abort_job(int exit_code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code == 0 ? 1 : exit_code);
}

class FinalizeOp final : public mpi::TrackedOp {
 public:
  std::string describe() const override { return "MPI_Finalize (waiting for every rank to reach the end)"; }
};

void finalize_mpi() {
  std::vector<std::shared_ptr<MpiCommunicator>> alive;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto& w : r.comms)
      if (auto c = w.lock()) alive.push_back(std::move(c));
  }
  for (auto& c : alive) c->release();
  alive.clear();
  mpi::stop_progress();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    FinalizeOp op;
    op.started_at = now_seconds();
    mpi::track(&op);
    MPI_Finalize();
    mpi::untrack(&op);
  }
  set_abort_hook(nullptr);
  mpi::stop_watchdog();
}

}  // namespace

StatusOr<Comm> init_mpi_world() {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.world) return r.world;
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      return Internal("MPI_Init_thread failed (is this process started by mpirun or srun?)");
    if (provided < MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      return FailedPrecondition("the MPI library provides thread level ", provided,
                                "; gale needs MPI_THREAD_MULTIPLE (Debian's Open MPI has it)");
    }
    std::atexit(finalize_mpi);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm world = MPI_COMM_NULL;  // a private copy: gale's traffic never mixes with other MPI users'
  mpi::check(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup(MPI_COMM_WORLD)");
  int rank = 0, size = 1;
  mpi::check(MPI_Comm_rank(world, &rank), "MPI_Comm_rank");
  mpi::check(MPI_Comm_size(world, &size), "MPI_Comm_size");
  set_log_identity(rank, size);
  set_abort_hook(abort_job);
  if (mpi::timeout_seconds() < 0.0) mpi::set_timeout(10 * 60.0);  // Megatron's default until set
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) ranks[i] = i;
  Comm c = make_mpi_communicator(world, std::move(ranks), "world");
  std::lock_guard<std::mutex> lock(r.mu);
  r.world = c;
  return c;
}

void set_distributed_timeout(double seconds) { mpi::set_timeout(seconds); }

}  // namespace gale
