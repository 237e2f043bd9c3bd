// TP linear forward/backward: plain mappings + GEMM, or the chunked pipelines of parallel/coc.h.
#include "model/tp_linear.h"

#include "parallel/coc.h"
#include "parallel/mappings.h"

namespace gale {

namespace {

CocRowsFn forward_rows(const LinearWeight& w) {
  return [&w](const Tensor& in, Tensor& out) { linear_forward_into(in, w, out); };
}

CocRowsFn input_grad_rows(const LinearWeight& w, DType x_dtype) {
  return [&w, x_dtype](const Tensor& dy, Tensor& dx) { linear_backward_data_into(dy, w, x_dtype, dx); };
}

}  // namespace

Tensor column_parallel_linear_forward(const TpLinearComm& c, const Tensor& x, const LinearWeight& w, Tensor* x_saved) {
  if (c.tp == nullptr) {
    *x_saved = x;
    return linear_forward(x, w);
  }
  if (c.keeps_local_input()) {
    *x_saved = x;
    if (c.chunked()) return coc_all_gather_rows(x, *c.tp, c.chunks, w.out, forward_rows(w), nullptr);
    return linear_forward(gather_from_sequence_parallel_region(x, *c.tp), w);
  }
  if (c.chunked() && c.sequence_parallel)
    return coc_all_gather_rows(x, *c.tp, c.chunks, w.out, forward_rows(w), x_saved);
  *x_saved = c.sequence_parallel ? gather_from_sequence_parallel_region(x, *c.tp) : copy_to_tp_region(x, *c.tp);
  return linear_forward(*x_saved, w);
}

namespace {

// --use-ascend-mc2's column-parallel backward from this rank's input rows x_local [Tl, in]: the
// all-gather of x_local runs while dx_full = dy·W multiplies, the reduce-scatter of dx_full while
// dW += dyᵀ·x_full multiplies.
Tensor column_backward_regathering(Communicator& tp, const Tensor& dy, const Tensor& x_local, const LinearWeight& w) {
  const int64_t Tl = x_local.size(0), T = dy.size(0);
  GALE_CHECK(T == Tl * tp.size()) << "column-parallel backward: output gradient of " << T << " rows for " << Tl
                                  << " input rows on each of " << tp.size() << " ranks";
  Tensor x_full = Tensor::empty({T, w.in}, x_local.dtype());
  WorkPtr gather = tp.all_gather_async(x_local.raw(), x_full.raw(), x_local.numel(), x_local.dtype());
  const Tensor d = to_gemm_input(dy, x_local.dtype());  // rounded once, as linear_backward does
  Tensor dx_full = Tensor::empty({T, w.in});
  linear_backward_data_into(d, w, x_local.dtype(), dx_full);
  Tensor dx = Tensor::empty({Tl, w.in});
  WorkPtr scatter = tp.reduce_scatter_async(dx_full.raw(), dx.raw(), Tl * w.in, DType::kF32, ReduceOp::kSum);
  gather->wait();
  linear_backward_weight(d, x_full, w);
  scatter->wait();
  return dx;
}

}  // namespace

Tensor column_parallel_linear_backward(const TpLinearComm& c, const Tensor& dy, const Tensor& x_full,
                                       const LinearWeight& w) {
  if (c.tp == nullptr) return linear_backward(dy, x_full, w);
  if (c.keeps_local_input()) return column_backward_regathering(*c.tp, dy, x_full, w);
  if (!c.chunked()) {
    Tensor dx = linear_backward(dy, x_full, w);
    return c.sequence_parallel ? gather_from_sequence_parallel_region_backward(dx, *c.tp)
                               : copy_to_tp_region_backward(dx, *c.tp);
  }
  const Tensor d = to_gemm_input(dy, x_full.dtype());  // rounded once, as linear_backward does
  const auto weight_grad = [&] { linear_backward_weight(d, x_full, w); };
  const CocRowsFn rows = input_grad_rows(w, x_full.dtype());
  return c.sequence_parallel ? coc_reduce_scatter_rows(d, *c.tp, c.chunks, w.in, rows, weight_grad)
                             : coc_all_reduce_rows(d, *c.tp, c.chunks, w.in, rows, weight_grad);
}

Tensor row_parallel_linear_forward(const TpLinearComm& c, const Tensor& x, const LinearWeight& w) {
  if (c.tp == nullptr) return linear_forward(x, w);
  if (!c.chunked()) {
    Tensor y = linear_forward(x, w);
    return c.sequence_parallel ? reduce_scatter_to_sequence_parallel_region(y, *c.tp)
                               : reduce_from_tp_region(y, *c.tp);
  }
  return c.sequence_parallel ? coc_reduce_scatter_rows(x, *c.tp, c.chunks, w.out, forward_rows(w))
                             : coc_all_reduce_rows(x, *c.tp, c.chunks, w.out, forward_rows(w));
}

Tensor row_parallel_linear_backward(const TpLinearComm& c, const Tensor& dy, const Tensor& x, const LinearWeight& w) {
  if (c.tp == nullptr) return linear_backward(dy, x, w);
  if (!c.chunked() || !c.sequence_parallel) {
    const Tensor dy_full = c.sequence_parallel ? reduce_scatter_to_sequence_parallel_region_backward(dy, *c.tp)
                                               : reduce_from_tp_region_backward(dy, *c.tp);
    return linear_backward(dy_full, x, w);
  }
  // dy is gathered in f32 as unchunked (the same bytes); each product rounds it to x's GEMM type.
  Tensor dy_full;
  Tensor dx = coc_all_gather_rows(dy, *c.tp, c.chunks, w.in, input_grad_rows(w, x.dtype()), &dy_full);
  linear_backward_weight(dy_full, x, w);
  return dx;
}

}  // namespace gale
