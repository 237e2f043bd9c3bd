// Reduce-scatter as an all-to-all of low-precision values followed by a local f32 sum in rank order.
#include "comm/reduce_scatter_fp32_accumulation.h"

#include <cstring>
#include <utility>
#include <vector>

#include "core/check.h"

namespace gale {

namespace {

float load(const void* base, int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kBF16: return bf16_to_float(static_cast<const bf16*>(base)[i]);
    case DType::kF16: return f16_to_float(static_cast<const f16*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

void store(void* base, int64_t i, float v, DType dtype) {
  switch (dtype) {
    case DType::kBF16: static_cast<bf16*>(base)[i] = float_to_bf16(v); break;
    case DType::kF16: static_cast<f16*>(base)[i] = float_to_f16(v); break;
    default: static_cast<float*>(base)[i] = v; break;
  }
}

class Fp32AccumulationWork : public Work {
 public:
  Fp32AccumulationWork(std::vector<char> scratch, void* recv, int64_t count, int size, DType dtype)
      : scratch_(std::move(scratch)), recv_(recv), count_(count), size_(size), dtype_(dtype) {}
  void set_all_to_all(WorkPtr w) { all_to_all_ = std::move(w); }
  void* scratch() { return scratch_.data(); }

  void wait() override {
    if (done_) return;
    all_to_all_->wait();
    // Block r of the scratch is rank r's contribution to this rank's shard: add them in rank order.
    for (int64_t i = 0; i < count_; ++i) {
      float sum = load(scratch_.data(), i, dtype_);
      for (int r = 1; r < size_; ++r) sum += load(scratch_.data(), static_cast<int64_t>(r) * count_ + i, dtype_);
      store(recv_, i, sum, dtype_);
    }
    scratch_ = std::vector<char>();
    done_ = true;
  }
  bool test() override { return done_ || all_to_all_->test(); }

 private:
  std::vector<char> scratch_;
  void* recv_;
  int64_t count_;
  int size_;
  DType dtype_;
  WorkPtr all_to_all_;
  bool done_ = false;
};

}  // namespace

WorkPtr reduce_scatter_with_fp32_accumulation(Communicator& group, const void* send, void* recv,
                                              int64_t recv_count, DType dtype, ReduceOp op) {
  GALE_CHECK(op == ReduceOp::kSum) << "--ddp-reduce-scatter-with-fp32-accumulation: only a sum is supported "
                                      "(Megatron's rule), found another reduction";
  GALE_CHECK(dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32)
      << "--ddp-reduce-scatter-with-fp32-accumulation: expected bf16, f16 or f32 gradients, found "
      << dtype_name(dtype);
  GALE_CHECK_GE(recv_count, 0);
  const int size = group.size();
  const size_t bytes = static_cast<size_t>(size) * static_cast<size_t>(recv_count) * dtype_size(dtype);
  auto work = std::make_shared<Fp32AccumulationWork>(std::vector<char>(bytes), recv, recv_count, size, dtype);
  work->set_all_to_all(group.all_to_all_async(send, work->scratch(), recv_count, dtype));
  return work;
}

}  // namespace gale
