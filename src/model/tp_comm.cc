// Tensor-parallel collectives over the partition's TP communicator.
#include "model/tp_comm.h"

namespace gale {

void tp_all_reduce(const ModelPartition& part, Tensor& x) {
  if (part.tp_size() == 1) return;
  part.tp->all_reduce(x.raw(), x.numel(), DType::kF32, ReduceOp::kSum);
}

Tensor tp_all_gather_rows(const ModelPartition& part, const Tensor& local) {
  if (part.tp_size() == 1) return local;
  Shape shape = local.shape();
  shape[0] *= part.tp_size();
  Tensor full = Tensor::empty(shape);
  part.tp->all_gather(local.raw(), full.raw(), local.numel(), DType::kF32);
  return full;
}

Tensor tp_reduce_scatter_rows(const ModelPartition& part, const Tensor& full) {
  if (part.tp_size() == 1) return full;
  Shape shape = full.shape();
  GALE_CHECK_EQ(shape[0] % part.tp_size(), 0);
  shape[0] /= part.tp_size();
  Tensor local = Tensor::empty(shape);
  part.tp->reduce_scatter(full.raw(), local.raw(), local.numel(), DType::kF32, ReduceOp::kSum);
  return local;
}

}  // namespace gale
