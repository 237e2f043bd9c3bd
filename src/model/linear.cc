// Linear forward/backward as sgemm, bf16 or f16 GEMM calls.
#include "model/linear.h"

#include "kernels/cpu/gemm.h"
#include "model/qat.h"
#include "model/weight_grad_store.h"

namespace gale {

namespace {

// --fp8-format: the weight [out, in] as the GEMM would read it (bf16 copy or f32), FP8-quantised;
// `reduce_cols` as fp8_quantise (forward: along `in`; dgrad: along `out`).
Tensor fp8_weight(const LinearWeight& w, bool reduce_cols) {
  if (w.w_bf16 != nullptr) {
    Tensor f = Tensor::empty({w.out, w.in});
    convert_bf16_to_f32(w.w_bf16, f.data<float>(), w.out * w.in);
    return fp8_quantise(f.data<float>(), w.out, w.in, w.fp8, kFp8Weight, reduce_cols);
  }
  GALE_CHECK(w.w != nullptr) << "--fp8-format: no weight values to quantise";
  return fp8_quantise(w.w, w.out, w.in, w.fp8, kFp8Weight, reduce_cols);
}

}  // namespace

Tensor linear_forward(const Tensor& x, const LinearWeight& w) {
  Tensor y = Tensor::empty({x.size(0), w.out});
  linear_forward_into(x, w, y);
  return y;
}

void linear_forward_into(const Tensor& x, const LinearWeight& w, Tensor& y) {
  const int64_t M = x.size(0);
  GALE_CHECK_EQ(x.size(1), w.in);
  GALE_CHECK(y.ndim() == 2 && y.size(0) == M && y.size(1) == w.out && y.dtype() == DType::kF32)
      << "linear output " << y.shape_string() << " for " << M << " rows of " << w.out;
  if (w.fp8.active()) {  // y = Q(x)·Q(W)ᵀ in f32
    const Tensor xq = fp8_quantise(x, w.fp8, kFp8Input, /*reduce_cols=*/true);
    const Tensor wq = fp8_weight(w, /*reduce_cols=*/true);
    w.gemm(false, true, M, w.out, w.in, 1.0f, xq.data<float>(), w.in, wq.data<float>(), w.in, 0.0f, y.data<float>(),
           w.out);
    return;
  }
  if (x.dtype() == DType::kBF16) {
    GALE_CHECK(w.w_bf16 != nullptr) << "bf16 activations need the weights' bf16 copy";
    w.bf16_gemm(false, true, M, w.out, w.in, 1.0f, x.data<bf16>(), w.in, w.w_bf16, w.in, 0.0f, y.data<float>(), w.out);
  } else if (x.dtype() == DType::kF16) {
    GALE_CHECK(w.w_f16 != nullptr) << "f16 activations need the weights' f16 copy";
    gemm_f16(w.gemm, false, true, M, w.out, w.in, 1.0f, x.data<f16>(), w.in, w.w_f16, w.in, 0.0f, y.data<float>(),
             w.out);
  } else {
    GALE_CHECK(w.w != nullptr) << "f32 activations need the weights' f32 values (not kept under --reuse-fp32-param)";
    w.gemm(false, true, M, w.out, w.in, 1.0f, x.data<float>(), w.in, w.w, w.in, 0.0f, y.data<float>(), w.out);
  }
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const LinearWeight& w) {
  GALE_CHECK_EQ(x.size(0), dy.size(0));
  // dy rounded to x's GEMM type once, for both products (as each product would round it alike).
  const Tensor dy_gemm = to_gemm_input(dy, x.dtype());
  linear_backward_weight(dy_gemm, x, w);
  Tensor dx = Tensor::empty({dy.size(0), w.in});
  linear_backward_data_into(dy_gemm, w, x.dtype(), dx);
  return dx;
}

void linear_backward_data_into(const Tensor& dy, const LinearWeight& w, DType x_dtype, Tensor& dx) {
  const int64_t M = dy.size(0);
  GALE_CHECK_EQ(dy.size(1), w.out);
  GALE_CHECK(dx.ndim() == 2 && dx.size(0) == M && dx.size(1) == w.in && dx.dtype() == DType::kF32)
      << "linear input gradient " << dx.shape_string() << " for " << M << " rows of " << w.in;
  if (w.fp8.active()) {  // dx = Q(dy)·Q(W), both blocked along `out` under mxfp8
    const Tensor dq = fp8_quantise(to_gemm_input(dy, x_dtype), w.fp8, kFp8GradOutput, /*reduce_cols=*/true);
    const Tensor wq = fp8_weight(w, /*reduce_cols=*/false);
    w.gemm(false, false, M, w.in, w.out, 1.0f, dq.data<float>(), w.out, wq.data<float>(), w.in, 0.0f,
           dx.data<float>(), w.in);
    return;
  }
  const Tensor d = to_gemm_input(dy, x_dtype);
  if (x_dtype == DType::kBF16) {
    w.bf16_gemm(false, false, M, w.in, w.out, 1.0f, d.data<bf16>(), w.out, w.w_bf16, w.in, 0.0f, dx.data<float>(),
                w.in);
  } else if (x_dtype == DType::kF16) {
    gemm_f16(w.gemm, false, false, M, w.in, w.out, 1.0f, d.data<f16>(), w.out, w.w_f16, w.in, 0.0f,
             dx.data<float>(), w.in);
  } else {
    GALE_CHECK(w.w != nullptr) << "f32 activations need the weights' f32 values (not kept under --reuse-fp32-param)";
    w.gemm(false, false, M, w.in, w.out, 1.0f, d.data<float>(), w.out, w.w, w.in, 0.0f, dx.data<float>(), w.in);
  }
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, const LinearWeight& w) {
  if (!w.grad) return;  // frozen
  if (w.defer) {  // --dualpipev-dw-detach: run later by the schedule's weight step
    w.defer->put(dy, x, w);
    return;
  }
  const int64_t M = dy.size(0);
  GALE_CHECK_EQ(dy.size(1), w.out);
  GALE_CHECK_EQ(x.size(0), M);
  const Tensor d = to_gemm_input(dy, x.dtype());
  if (w.fp8.active() && w.fp8.config->wgrad) {  // dW += Q(dy)ᵀ·Q(x), both blocked along the rows under mxfp8
    const Tensor dq = fp8_quantise(d, w.fp8, kFp8GradOutput, /*reduce_cols=*/false);
    const Tensor xq = fp8_quantise(x, w.fp8, kFp8Input, /*reduce_cols=*/false);
    w.gemm(true, false, w.out, w.in, M, 1.0f, dq.data<float>(), w.out, xq.data<float>(), w.in, 1.0f, w.grad, w.in);
    return;
  }
  if (x.dtype() == DType::kBF16)
    w.bf16_gemm(true, false, w.out, w.in, M, 1.0f, d.data<bf16>(), w.out, x.data<bf16>(), w.in, 1.0f, w.grad, w.in);
  else if (x.dtype() == DType::kF16)
    gemm_f16(w.gemm, true, false, w.out, w.in, M, 1.0f, d.data<f16>(), w.out, x.data<f16>(), w.in, 1.0f, w.grad,
             w.in);
  else
    w.gemm(true, false, w.out, w.in, M, 1.0f, d.data<float>(), w.out, x.data<float>(), w.in, 1.0f, w.grad, w.in);
}

Tensor to_gemm_input(const Tensor& x, DType dtype) {
  if (dtype == DType::kF32 || x.dtype() == dtype) return x;
  GALE_CHECK(x.dtype() == DType::kF32) << "a " << dtype_name(x.dtype()) << " tensor as a " << dtype_name(dtype)
                                       << " GEMM input";
  Tensor y = Tensor::empty(x.shape(), dtype);
  if (dtype == DType::kBF16)
    convert_f32_to_bf16(x.data<float>(), y.data<bf16>(), x.numel());
  else
    convert_f32_to_f16(x.data<float>(), y.data<f16>(), x.numel());
  return y;
}

Tensor to_f32(const Tensor& x) {
  if (x.dtype() == DType::kF32) return x;
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  if (x.dtype() == DType::kBF16)
    convert_bf16_to_f32(x.data<bf16>(), y.data<float>(), x.numel());
  else
    convert_f16_to_f32(x.data<f16>(), y.data<float>(), x.numel());
  return y;
}

LinearWeight linear_weight(const ParamBuffer& pb, int id, SgemmFn gemm, Bf16GemmFn bf16_gemm) {
  const Shape shape = pb.spec(id).local_shape();
  float* grad = pb.spec(id).trainable ? pb.grad_data(id) : nullptr;  // frozen: no dW GEMM
  const DType copy = pb.gemm_copy_dtype();
  // --reuse-fp32-param: a weight stored split has no f32 values to read (the GEMM copy only); nor
  // has one gathered in bf16 (FSDP2 param_dtype bf16, model/params.h gathers_bf16).
  LinearWeight w{pb.f32_readable(id) ? pb.param_data(id) : nullptr,
                      copy == DType::kBF16 ? pb.param_bf16_data(id) : nullptr,
                      copy == DType::kF16 ? pb.param_f16_data(id) : nullptr,
                      grad,
                      shape[0],
                      shape[1],
                      gemm,
                      bf16_gemm};
  if (pb.spec(id).qat_element != MxElement::kNone) qat_fake_quant_into(pb, id, w);
  if (pb.spec(id).fp8 && pb.fp8_config() != nullptr) {
    w.fp8.config = pb.fp8_config();
    const int state = pb.spec(id).fp8_state;
    if (state >= 0) {
      w.fp8.history = pb.param_data(state);
      w.fp8.scale = pb.param_data(state + 1);
    }
  }
  return w;
}

}  // namespace gale
