// Megatron's reduce-scatter with FP32 accumulation (--ddp-reduce-scatter-with-fp32-accumulation):
// low-precision values on the wire, the sum formed locally in f32 in a fixed rank order.
//
// An all-to-all sends block r of every rank's `send` (in its own dtype: bf16 moves 2 bytes an element)
// to rank r, which then sums the `size()` blocks it received in f32, rank 0 first, rank size()-1 last,
// and rounds the sum once to `dtype` (nearest even) into `recv`. The bytes moved are those of a ring
// reduce-scatter ((size()-1)/size() of the buffer leaves each rank) and CommStats counts the same
// size()·recv_count elements as for reduce_scatter; only the local reduction differs: a ring
// reduce-scatter in bf16 (NCCL's) rounds every partial sum to bf16 on each hop, this one rounds once,
// and the result is the same on every launcher and backend (the order is fixed).
//
// Supported: ReduceOp::kSum over DType::kBF16, kF16 or kF32 (f32: the same all-to-all and sequential
// f32 sum; Megatron's function also accepts its f32 buffers). `recv` may lie inside `send` (Megatron
// writes the sum into the rank's own shard of the bucket): it is written only after the all-to-all
// completed, by wait(). `send` and `recv` must stay untouched until then. The local sum runs on the
// CPU: `recv` must be host memory (Gale's gradient buffers are; NCCL stages host buffers through the
// device, comm/nccl_communicator.h).
#pragma once

#include <cstdint>

#include "comm/communicator.h"

namespace gale {

// Starts the all-to-all on `group` and returns a Work whose wait() completes it, sums the blocks in f32
// and writes `recv` (the all-to-all's scratch buffer lives in the Work). A ReduceOp other than kSum or
// an unsupported dtype is a fatal error naming the flag.
WorkPtr reduce_scatter_with_fp32_accumulation(Communicator& group, const void* send, void* recv,
                                              int64_t recv_count, DType dtype, ReduceOp op = ReduceOp::kSum);

}  // namespace gale
