// The fake communicator of --fake-process-group (comm/fake_communicator.h): no data moves.
#include "comm/fake_communicator.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "comm/launcher.h"
#include "core/check.h"

namespace gale {

namespace {

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(int rank, std::vector<int> world_ranks, std::string name)
      : rank_(rank), ranks_(std::move(world_ranks)), name_(std::move(name)) {
    GALE_CHECK(rank_ >= 0 && rank_ < static_cast<int>(ranks_.size())) << "fake group rank " << rank_;
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "fake"; }

  WorkPtr all_reduce_async(void*, int64_t count, DType dtype, ReduceOp) override {
    count_op(CommOp::kAllReduce, count * es(dtype));
    return completed_work();
  }
  WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp) override {
    move(static_cast<const char*>(send) + rank_ * recv_count * es(dtype), recv, recv_count * es(dtype));
    count_op(CommOp::kReduceScatter, recv_count * size() * es(dtype));
    return completed_work();
  }
  WorkPtr all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    const int64_t bytes = send_count * es(dtype);
    // The own block last: `send` may be that block of `recv` (in place).
    for (int r = 0; r < size(); ++r)
      if (r != rank_) move(send, static_cast<char*>(recv) + r * bytes, bytes);
    move(send, static_cast<char*>(recv) + rank_ * bytes, bytes);
    count_op(CommOp::kAllGather, bytes * size());
    return completed_work();
  }
  WorkPtr broadcast_async(void*, int64_t count, DType dtype, int root) override {
    GALE_CHECK(root >= 0 && root < size()) << "broadcast root " << root << " of a group of " << size();
    count_op(CommOp::kBroadcast, count * es(dtype));
    return completed_work();
  }
  WorkPtr send_async(const void*, int64_t count, DType dtype, int dst, int) override {
    GALE_CHECK(dst >= 0 && dst < size() && dst != rank_) << "send to rank " << dst << " of a group of " << size();
    count_op(CommOp::kSend, count * es(dtype));
    return completed_work();
  }
  WorkPtr recv_async(void* buf, int64_t count, DType dtype, int src, int) override {
    GALE_CHECK(src >= 0 && src < size() && src != rank_) << "recv from rank " << src << " of a group of " << size();
    if (count > 0) std::memset(buf, 0, static_cast<size_t>(count * es(dtype)));
    count_op(CommOp::kRecv, count * es(dtype));
    return completed_work();
  }
  WorkPtr all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    const int64_t bytes = count * es(dtype);
    const char* own = static_cast<const char*>(send) + rank_ * bytes;
    if (send == recv) {  // in place: every other block becomes a copy of the own one, which stays
      for (int r = 0; r < size(); ++r)
        if (r != rank_) move(own, static_cast<char*>(recv) + r * bytes, bytes);
    } else {
      for (int r = 0; r < size(); ++r) move(own, static_cast<char*>(recv) + r * bytes, bytes);
    }
    count_op(CommOp::kAllToAll, bytes * size());
    return completed_work();
  }
  WorkPtr all_to_allv_async(const void* send, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& send_displs, void* recv,
                            const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                            DType dtype) override {
    const size_t n = static_cast<size_t>(size());
    GALE_CHECK(send_counts.size() == n && send_displs.size() == n && recv_counts.size() == n &&
               recv_displs.size() == n)
        << "all_to_allv: one count and displacement per rank";
    const int64_t e = es(dtype);
    const int64_t own_count = send_counts[static_cast<size_t>(rank_)];
    // A copy of the own block first: recv may overlap send.
    std::vector<char> own(static_cast<size_t>(own_count * e));
    move(static_cast<const char*>(send) + send_displs[static_cast<size_t>(rank_)] * e, own.data(), own_count * e);
    int64_t sent = 0;
    for (size_t r = 0; r < n; ++r) {
      char* dst = static_cast<char*>(recv) + recv_displs[r] * e;
      const int64_t take = std::min(own_count, recv_counts[r]);
      move(own.data(), dst, take * e);
      if (recv_counts[r] > take) std::memset(dst + take * e, 0, static_cast<size_t>((recv_counts[r] - take) * e));
      sent += send_counts[r];
    }
    count_op(CommOp::kAllToAll, sent * e);
    return completed_work();
  }
  void barrier() override { count_op(CommOp::kBarrier, 0); }

  Comm make_group(const std::vector<int>& world_ranks, const std::string& name) override {
    if (world_ranks.empty()) return nullptr;
    const int me = ranks_.at(static_cast<size_t>(rank_));
    auto it = std::find(world_ranks.begin(), world_ranks.end(), me);
    GALE_CHECK(it != world_ranks.end()) << "make_group '" << name << "': the group does not hold this rank (" << me
                                        << ")";
    return make_fake_communicator(static_cast<int>(it - world_ranks.begin()), world_ranks, name);
  }

 private:
  void count_op(CommOp op, int64_t bytes) { Communicator::count(op, bytes); }
  static int64_t es(DType dtype) { return static_cast<int64_t>(dtype_size(dtype)); }
  static void move(const void* from, void* to, int64_t bytes) {
    if (bytes > 0 && from != to) std::memmove(to, from, static_cast<size_t>(bytes));
  }
  int rank_;
  std::vector<int> ranks_;
  std::string name_;
};

// $name as a whole decimal integer; `fallback` when unset or empty.
StatusOr<int64_t> env_integer(const char* name, int64_t fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (errno != 0 || *end != '\0')
    return InvalidArgument("--fake-process-group: $", name, " must be an integer, found '", s, "'");
  return static_cast<int64_t>(v);
}

}  // namespace

Comm make_fake_communicator(int rank, std::vector<int> world_ranks, const std::string& name) {
  return std::make_shared<FakeCommunicator>(rank, std::move(world_ranks), name);
}

StatusOr<Comm> init_fake_world() {
  if (launched_by_mpi())
    return InvalidArgument(
        "--fake-process-group: expected a single process started without mpirun/srun (it plays rank $RANK of "
        "$WORLD_SIZE alone), found an MPI launch");
  GALE_ASSIGN_OR_RETURN(int64_t size, env_integer("WORLD_SIZE", 1));
  GALE_ASSIGN_OR_RETURN(int64_t rank, env_integer("RANK", 0));
  if (size < 1 || size > (int64_t{1} << 24))
    return InvalidArgument("--fake-process-group: $WORLD_SIZE must be a positive number of ranks, found ", size);
  if (rank < 0 || rank >= size)
    return InvalidArgument("--fake-process-group: $RANK must be in [0, $WORLD_SIZE) = [0, ", size, "), found ", rank);
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int64_t r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = static_cast<int>(r);
  return make_fake_communicator(static_cast<int>(rank), std::move(ranks), "world");
}

}  // namespace gale
