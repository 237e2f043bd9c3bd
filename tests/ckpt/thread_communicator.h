// An in-process communicator for tests: N threads act as N ranks (broadcast, all-gather, all-to-all, barrier).
//
//   run_ranks(4, [&](Communicator& comm) { ... collective code, as every rank would run it ... });
#pragma once

#include <barrier>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/check.h"

namespace gale::testing_util {

struct ThreadGroupState {
  explicit ThreadGroupState(int n) : size(n), sync(n), slots(static_cast<size_t>(n)) {}
  int size;
  std::barrier<> sync;
  std::vector<std::vector<char>> slots;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroupState> state, int rank) : state_(std::move(state)), rank_(rank) {
    for (int r = 0; r < state_->size; ++r) ranks_.push_back(r);
  }
  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "threads"; }

  WorkPtr all_gather_async(const void* send, void* recv, int64_t count, DType dtype) override {
    size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    put(send, bytes);
    for (int r = 0; r < size(); ++r) std::memcpy(static_cast<char*>(recv) + r * bytes, state_->slots[r].data(), bytes);
    state_->sync.arrive_and_wait();
    count_op(CommOp::kAllGather, static_cast<int64_t>(bytes) * size());
    return completed_work();
  }
  WorkPtr broadcast_async(void* buf, int64_t count, DType dtype, int root) override {
    size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    put(buf, bytes);
    if (rank_ != root) std::memcpy(buf, state_->slots[root].data(), bytes);
    state_->sync.arrive_and_wait();
    count_op(CommOp::kBroadcast, static_cast<int64_t>(bytes));
    return completed_work();
  }
  WorkPtr all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);  // per peer
    put(send, bytes * static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<char*>(recv) + r * bytes, state_->slots[r].data() + rank_ * bytes, bytes);
    state_->sync.arrive_and_wait();
    count_op(CommOp::kAllToAll, static_cast<int64_t>(bytes) * size());
    return completed_work();
  }
  void barrier() override { state_->sync.arrive_and_wait(); }

  // Not needed by the code under test.
  WorkPtr all_reduce_async(void*, int64_t, DType, ReduceOp) override { return unsupported("all_reduce"); }
  WorkPtr reduce_scatter_async(const void*, void*, int64_t, DType, ReduceOp) override {
    return unsupported("reduce_scatter");
  }
  WorkPtr send_async(const void*, int64_t, DType, int, int) override { return unsupported("send"); }
  WorkPtr recv_async(void*, int64_t, DType, int, int) override { return unsupported("recv"); }
  WorkPtr all_to_allv_async(const void*, const std::vector<int64_t>&, const std::vector<int64_t>&, void*,
                            const std::vector<int64_t>&, const std::vector<int64_t>&, DType) override {
    return unsupported("all_to_allv");
  }
  Comm make_group(const std::vector<int>&, const std::string&) override {
    unsupported("make_group");
    return nullptr;
  }

 private:
  // Publish this rank's bytes, and wait until every rank has.
  void put(const void* data, size_t bytes) {
    state_->slots[rank_].assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    state_->sync.arrive_and_wait();
  }
  void count_op(CommOp op, int64_t bytes) { count(op, bytes); }
  static WorkPtr unsupported(const char* what) {
    GALE_CHECK(false) << what << " is not implemented by the test ThreadCommunicator";
    return nullptr;
  }
  std::shared_ptr<ThreadGroupState> state_;
  int rank_;
  std::vector<int> ranks_;
  std::string name_ = "threads";
};

// Runs `body` on `n` threads, each with its own rank of one ThreadCommunicator group.
inline void run_ranks(int n, const std::function<void(Communicator&)>& body) {
  auto state = std::make_shared<ThreadGroupState>(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([state, r, &body] {
      ThreadCommunicator comm(state, r);
      body(comm);
    });
  for (std::thread& t : threads) t.join();
}

}  // namespace gale::testing_util
