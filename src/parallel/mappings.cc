// The tensor/sequence-parallel mappings: splits, gathers and reductions over the TP group.
#include "parallel/mappings.h"

#include <cstring>

#include "core/check.h"

namespace gale {

namespace {

PendingTensor all_reduce_in_place_async(const Tensor& x, Communicator& tp) {
  return {x, tp.all_reduce_async(x.raw(), x.numel(), x.dtype(), ReduceOp::kSum)};
}

int64_t last_dim_part(const Tensor& x, Communicator& tp, const char* what) {
  GALE_CHECK(x.ndim() >= 1 && x.size(-1) % tp.size() == 0)
      << what << ": last dimension of " << x.shape_string() << " is not divisible by the TP size " << tp.size();
  return x.size(-1) / tp.size();
}

int64_t first_dim_part(const Tensor& x, Communicator& tp, const char* what) {
  GALE_CHECK(x.ndim() >= 1 && x.size(0) % tp.size() == 0)
      << what << ": first dimension of " << x.shape_string() << " is not divisible by the TP size " << tp.size();
  return x.size(0) / tp.size();
}

Shape with_dim(Shape s, int dim, int64_t value) {
  s[dim < 0 ? s.size() + dim : dim] = value;
  return s;
}

}  // namespace

Tensor copy_to_tp_region(const Tensor& x, Communicator& tp) { return x; }
Tensor copy_to_tp_region_backward(const Tensor& dy, Communicator& tp) {
  return copy_to_tp_region_backward_async(dy, tp).wait();
}
PendingTensor copy_to_tp_region_backward_async(const Tensor& dy, Communicator& tp) {
  return all_reduce_in_place_async(dy, tp);
}

Tensor reduce_from_tp_region(const Tensor& x, Communicator& tp) { return reduce_from_tp_region_async(x, tp).wait(); }
PendingTensor reduce_from_tp_region_async(const Tensor& x, Communicator& tp) {
  return all_reduce_in_place_async(x, tp);
}
Tensor reduce_from_tp_region_backward(const Tensor& dy, Communicator& tp) { return dy; }

Tensor scatter_to_tp_region(const Tensor& x, Communicator& tp) {
  const int64_t part = last_dim_part(x, tp, "scatter_to_tp_region");
  if (tp.size() == 1) return x;
  Tensor out = Tensor::empty(with_dim(x.shape(), -1, part), x.dtype());
  const int64_t rows = x.numel() / x.size(-1);
  const size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw()) + tp.rank() * part * es;
  char* dst = static_cast<char*>(out.raw());
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * part * es, src + r * x.size(-1) * es, part * es);
  return out;
}

Tensor scatter_to_tp_region_backward(const Tensor& dy, Communicator& tp) { return gather_from_tp_region(dy, tp); }

Tensor gather_from_tp_region(const Tensor& x, Communicator& tp) {
  const int n = tp.size();
  if (n == 1) return x;
  const int64_t part = x.size(-1);
  const int64_t rows = x.numel() / part;
  const size_t es = dtype_size(x.dtype());
  Tensor blocks = Tensor::empty({n, x.numel()}, x.dtype());  // block r = rank r's [rows, part]
  tp.all_gather(x.raw(), blocks.raw(), x.numel(), x.dtype());
  Tensor out = Tensor::empty(with_dim(x.shape(), -1, part * n), x.dtype());
  const char* src = static_cast<const char*>(blocks.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int r = 0; r < n; ++r)
    for (int64_t row = 0; row < rows; ++row)
      std::memcpy(dst + (row * n + r) * part * es, src + (r * rows + row) * part * es, part * es);
  return out;
}

Tensor gather_from_tp_region_backward(const Tensor& dy, Communicator& tp) { return scatter_to_tp_region(dy, tp); }

Tensor scatter_to_sequence_parallel_region(const Tensor& x, Communicator& tp) {
  const int64_t part = first_dim_part(x, tp, "scatter_to_sequence_parallel_region");
  return tp.size() == 1 ? x : x.slice(tp.rank() * part, part);
}

Tensor scatter_to_sequence_parallel_region_backward(const Tensor& dy, Communicator& tp) {
  return scatter_to_sequence_parallel_region_backward_async(dy, tp).wait();
}

PendingTensor scatter_to_sequence_parallel_region_backward_async(const Tensor& dy, Communicator& tp) {
  return gather_from_sequence_parallel_region_async(dy, tp);
}

Tensor gather_from_sequence_parallel_region(const Tensor& x, Communicator& tp) {
  return gather_from_sequence_parallel_region_async(x, tp).wait();
}

PendingTensor gather_from_sequence_parallel_region_async(const Tensor& x, Communicator& tp) {
  if (tp.size() == 1) return {x, completed_work()};
  Tensor out = Tensor::empty(with_dim(x.shape(), 0, x.size(0) * tp.size()), x.dtype());
  return {out, tp.all_gather_async(x.raw(), out.raw(), x.numel(), x.dtype())};
}

Tensor gather_from_sequence_parallel_region_backward(const Tensor& dy, Communicator& tp,
                                                     bool tensor_parallel_output_grad) {
  if (!tensor_parallel_output_grad) return scatter_to_sequence_parallel_region(dy, tp).clone();
  return gather_from_sequence_parallel_region_backward_async(dy, tp).wait();
}

PendingTensor gather_from_sequence_parallel_region_backward_async(const Tensor& dy, Communicator& tp) {
  return reduce_scatter_to_sequence_parallel_region_async(dy, tp);
}

Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, Communicator& tp) {
  return reduce_scatter_to_sequence_parallel_region_async(x, tp).wait();
}

PendingTensor reduce_scatter_to_sequence_parallel_region_async(const Tensor& x, Communicator& tp) {
  const int64_t part = first_dim_part(x, tp, "reduce_scatter_to_sequence_parallel_region");
  if (tp.size() == 1) return {x, completed_work()};
  Tensor out = Tensor::empty(with_dim(x.shape(), 0, part), x.dtype());
  return {out, tp.reduce_scatter_async(x.raw(), out.raw(), out.numel(), x.dtype(), ReduceOp::kSum)};
}

Tensor reduce_scatter_to_sequence_parallel_region_backward(const Tensor& dy, Communicator& tp) {
  return gather_from_sequence_parallel_region(dy, tp);
}

PendingTensor reduce_scatter_to_sequence_parallel_region_backward_async(const Tensor& dy, Communicator& tp) {
  return gather_from_sequence_parallel_region_async(dy, tp);
}

}  // namespace gale
