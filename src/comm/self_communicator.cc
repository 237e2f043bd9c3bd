// The size-1 communicator: collectives are copies, point-to-point is an error.
#include <cstring>

#include "comm/communicator.h"
#include "core/check.h"

namespace gale {

namespace {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : name_(std::move(name)), ranks_{0} {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "self"; }

  WorkPtr all_reduce_async(void*, int64_t count, DType dtype, ReduceOp) override {
    count_op(CommOp::kAllReduce, count * dtype_size(dtype));
    return completed_work();
  }
  WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp) override {
    copy(send, recv, recv_count, dtype);
    count_op(CommOp::kReduceScatter, recv_count * dtype_size(dtype));
    return completed_work();
  }
  WorkPtr all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    copy(send, recv, send_count, dtype);
    count_op(CommOp::kAllGather, send_count * dtype_size(dtype));
    return completed_work();
  }
  WorkPtr broadcast_async(void*, int64_t count, DType dtype, int root) override {
    GALE_CHECK_EQ(root, 0);
    count_op(CommOp::kBroadcast, count * dtype_size(dtype));
    return completed_work();
  }
  WorkPtr send_async(const void*, int64_t, DType, int dst, int) override {
    GALE_CHECK(false) << "send to rank " << dst << " on a single-process communicator";
    return nullptr;
  }
  WorkPtr recv_async(void*, int64_t, DType, int src, int) override {
    GALE_CHECK(false) << "recv from rank " << src << " on a single-process communicator";
    return nullptr;
  }
  WorkPtr all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    copy(send, recv, count, dtype);
    count_op(CommOp::kAllToAll, count * dtype_size(dtype));
    return completed_work();
  }
  WorkPtr all_to_allv_async(const void* send, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& send_displs, void* recv,
                            const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                            DType dtype) override {
    GALE_CHECK_EQ(send_counts.at(0), recv_counts.at(0));
    size_t es = dtype_size(dtype);
    if (send_counts[0] > 0 && send != recv)
      std::memmove(static_cast<char*>(recv) + recv_displs.at(0) * es,
                   static_cast<const char*>(send) + send_displs.at(0) * es, send_counts[0] * es);
    count_op(CommOp::kAllToAll, send_counts[0] * static_cast<int64_t>(es));
    return completed_work();
  }
  void barrier() override { count_op(CommOp::kBarrier, 0); }

  Comm make_group(const std::vector<int>& world_ranks, const std::string& name) override {
    if (world_ranks.empty()) return nullptr;
    GALE_CHECK(world_ranks.size() == 1 && world_ranks[0] == 0) << "group of a single-process world";
    return make_self_communicator(name);
  }

 private:
  void count_op(CommOp op, int64_t bytes) { count(op, bytes); }
  static void copy(const void* send, void* recv, int64_t n, DType dtype) {
    if (n > 0 && send != recv) std::memmove(recv, send, static_cast<size_t>(n) * dtype_size(dtype));
  }
  std::string name_;
  std::vector<int> ranks_;
};

class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

}  // namespace

WorkPtr completed_work() {
  static WorkPtr done = std::make_shared<CompletedWork>();
  return done;
}

Comm make_self_communicator(const std::string& name) { return std::make_shared<SelfCommunicator>(name); }

}  // namespace gale
