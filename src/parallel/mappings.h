// Tensor- and sequence-parallel communication as conjugate forward/backward pairs.
//
// Activations are [S, B, H] (sequence first), so a sequence split is a contiguous range of
// dimension 0; a "last dimension" split cuts every row of H into TP equal parts. `tp` is the
// tensor-parallel group. Each forward function has a backward function that is its adjoint
// (tests/parallel/mappings_mpi_test.cc checks <f(x), y> = <x, f*(y)> across ranks):
//
//   forward                                   backward
//   copy_to_tp_region            identity     all-reduce
//   reduce_from_tp_region        all-reduce   identity
//   scatter_to_tp_region         split H      all-gather H
//   gather_from_tp_region        all-gather H split H
//   scatter_to_sequence_parallel_region      split S       all-gather S
//   gather_from_sequence_parallel_region     all-gather S  reduce-scatter S (or split S when the
//                                                          output's gradient is not TP-partial)
//   reduce_scatter_to_sequence_parallel_region reduce-scatter S  all-gather S
//
// Conventions: all-reduces work in place on the tensor passed and return it; splits along S
// return a view (a slice sharing storage, as Megatron's first-dimension split does); the other
// operations return new tensors. f32, bf16 and f16 are supported (half sums are computed in f32 by
// the communicator). Dimension 0 (or the last dimension) must divide by the group size.
//
// The *_async forms start the communication and return at once; the result is valid after
// wait(), and the input must not be modified before then. They exist where Megatron overlaps
// communication with compute: the sequence-parallel all-gather and reduce-scatter, and the
// all-reduces of the tensor-parallel input gradient.
#pragma once

#include "comm/communicator.h"
#include "core/tensor.h"

namespace gale {

// A tensor being produced by a non-blocking collective.
struct PendingTensor {
  Tensor tensor;  // filled in once `work` completes
  WorkPtr work;
  Tensor wait() {
    work->wait();
    return tensor;
  }
};

Tensor copy_to_tp_region(const Tensor& x, Communicator& tp);
Tensor copy_to_tp_region_backward(const Tensor& dy, Communicator& tp);
PendingTensor copy_to_tp_region_backward_async(const Tensor& dy, Communicator& tp);

Tensor reduce_from_tp_region(const Tensor& x, Communicator& tp);
PendingTensor reduce_from_tp_region_async(const Tensor& x, Communicator& tp);
Tensor reduce_from_tp_region_backward(const Tensor& dy, Communicator& tp);

Tensor scatter_to_tp_region(const Tensor& x, Communicator& tp);
Tensor scatter_to_tp_region_backward(const Tensor& dy, Communicator& tp);

Tensor gather_from_tp_region(const Tensor& x, Communicator& tp);
Tensor gather_from_tp_region_backward(const Tensor& dy, Communicator& tp);

Tensor scatter_to_sequence_parallel_region(const Tensor& x, Communicator& tp);
Tensor scatter_to_sequence_parallel_region_backward(const Tensor& dy, Communicator& tp);
PendingTensor scatter_to_sequence_parallel_region_backward_async(const Tensor& dy, Communicator& tp);

Tensor gather_from_sequence_parallel_region(const Tensor& x, Communicator& tp);
PendingTensor gather_from_sequence_parallel_region_async(const Tensor& x, Communicator& tp);
// `tensor_parallel_output_grad`: true when each TP rank's gradient of the gathered output is a
// partial sum (the output feeds a column-parallel layer): reduce-scatter. False when every rank
// holds the same full gradient: split.
Tensor gather_from_sequence_parallel_region_backward(const Tensor& dy, Communicator& tp,
                                                     bool tensor_parallel_output_grad = true);
PendingTensor gather_from_sequence_parallel_region_backward_async(const Tensor& dy, Communicator& tp);

Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, Communicator& tp);
PendingTensor reduce_scatter_to_sequence_parallel_region_async(const Tensor& x, Communicator& tp);
Tensor reduce_scatter_to_sequence_parallel_region_backward(const Tensor& dy, Communicator& tp);
PendingTensor reduce_scatter_to_sequence_parallel_region_backward_async(const Tensor& dy, Communicator& tp);

}  // namespace gale
