// ParallelLinear2D forward/backward (model/tp2d_linear.h).
#include "model/tp2d_linear.h"

#include "parallel/mappings.h"

namespace gale {

Tensor linear_2d_forward(const Tensor& x, const LinearWeight& w, Communicator& ag, Communicator& rs, Tensor* x_full) {
  *x_full = gather_from_sequence_parallel_region(x, ag);
  return reduce_scatter_to_sequence_parallel_region(linear_forward(*x_full, w), rs);
}

Tensor linear_2d_backward(const Tensor& dy, const Tensor& x_full, const LinearWeight& w, Communicator& ag,
                          Communicator& rs) {
  const Tensor dy_full = reduce_scatter_to_sequence_parallel_region_backward(dy, rs);
  return gather_from_sequence_parallel_region_backward(linear_backward(dy_full, x_full, w), ag);
}

}  // namespace gale
