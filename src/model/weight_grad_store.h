// Deferred linear weight gradients (--dualpipev-dw-detach, DeepSeek's WeightGradStore).
//
// Under DualPipeV with --dualpipev-dw-detach some backward steps compute only the input gradient
// (the critical path, sent to the previous stage at once) and leave the big linears' weight
// gradients dW += dyᵀ·x for later "W" steps that fill the schedule's bubbles
// (schedule/pipeline_order.h dualpipev_order). A layer's backward asks for this through
// LinearWeight::defer (model/linear.h): linear_backward_weight then records (dy, x, weight) here
// instead of multiplying. Each record keeps dy and x alive (shared storage) until it runs, so the
// activations a deferred step needs stay held a little longer (held_bytes()). Norms, biases and
// other small parameters compute their gradients at once.
//
// Records are grouped per backward step (flush), and pop() runs the oldest group first (FIFO, as
// DeepSeek's queue). Each weight's gradient is then accumulated in the same micro-batch order as
// without deferring, so the gradients are bitwise the same.
//
// MoE experts: their GEMMs run one expert per thread (model/expert_loop.h), each GEMM on one thread.
// The expert loops record into an expert batch (begin_experts / put_expert / end_experts), which
// pop() runs through the same loop, so every deferred expert GEMM again runs on one thread, over the
// same operands: the same bits.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/linear.h"

namespace gale {

class WeightGradStore {
 public:
  // Queues dW += dyᵀ·x for weight `w` (its `defer` ignored): dy [M, out] (already of x's GEMM type
  // or f32), x [M, in].
  void put(const Tensor& dy, const Tensor& x, const LinearWeight& w);
  // An expert batch: the weight gradients of one loop over `E` local experts. put_expert(e, ...)
  // may be called from expert e's thread (each slot is written by one thread; an expert without
  // rows leaves its slot empty); end_experts() queues the batch after the records put before it.
  void begin_experts(int64_t E);
  void put_expert(int64_t e, const Tensor& dy, const Tensor& x, const LinearWeight& w);
  void end_experts();
  // Closes the records put since the last flush as the group of backward step (chunk, microbatch).
  void flush(int chunk, int64_t microbatch);
  // Runs the oldest group's GEMMs (in the order they were put) and returns its (chunk, microbatch).
  std::pair<int, int64_t> pop();
  // Whether no group and no unflushed record is pending.
  bool empty() const { return groups_.empty() && open_.empty() && !in_experts_; }
  size_t pending_groups() const { return groups_.size(); }
  // Bytes of the dy and x tensors the pending records hold (tensors shared by records or still held
  // elsewhere are counted once per record: an upper bound of what deferring keeps alive).
  int64_t held_bytes() const { return held_bytes_; }

 private:
  struct Record {
    Tensor dy, x;
    LinearWeight w;
  };
  // One put() (a single record), or an expert batch (slot e: expert e, possibly empty).
  struct Entry {
    std::vector<Record> records;
    bool experts = false;
  };
  struct Group {
    int chunk = 0;
    int64_t microbatch = 0;
    std::vector<Entry> entries;
  };
  static Record make_record(const Tensor& dy, const Tensor& x, const LinearWeight& w);
  int64_t release(Record& r);  // runs nothing; frees r, returns its bytes
  std::vector<Entry> open_;
  Entry experts_;  // the expert batch being filled (between begin_experts and end_experts)
  bool in_experts_ = false;
  std::deque<Group> groups_;
  int64_t held_bytes_ = 0;
};

}  // namespace gale
