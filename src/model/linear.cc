// Linear forward/backward as sgemm or bf16 GEMM calls.
#include "model/linear.h"

#include "kernels/cpu/gemm.h"

namespace gale {

Tensor linear_forward(const Tensor& x, const LinearWeight& w) {
  const int64_t M = x.size(0);
  GALE_CHECK_EQ(x.size(1), w.in);
  Tensor y = Tensor::empty({M, w.out});
  if (x.dtype() == DType::kBF16) {
    GALE_CHECK(w.w_bf16 != nullptr) << "bf16 activations need the weights' bf16 copy";
    gemm_bf16(false, true, M, w.out, w.in, 1.0f, x.data<bf16>(), w.in, w.w_bf16, w.in, 0.0f, y.data<float>(), w.out);
  } else {
    w.gemm(false, true, M, w.out, w.in, 1.0f, x.data<float>(), w.in, w.w, w.in, 0.0f, y.data<float>(), w.out);
  }
  return y;
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const LinearWeight& w) {
  const int64_t M = dy.size(0);
  GALE_CHECK_EQ(dy.size(1), w.out);
  GALE_CHECK_EQ(x.size(0), M);
  Tensor dx = Tensor::empty({M, w.in});
  if (x.dtype() == DType::kBF16) {
    Tensor dy16 = to_gemm_input(dy, true);
    if (w.grad)
      gemm_bf16(true, false, w.out, w.in, M, 1.0f, dy16.data<bf16>(), w.out, x.data<bf16>(), w.in, 1.0f, w.grad, w.in);
    gemm_bf16(false, false, M, w.in, w.out, 1.0f, dy16.data<bf16>(), w.out, w.w_bf16, w.in, 0.0f, dx.data<float>(),
              w.in);
  } else {
    if (w.grad)
      w.gemm(true, false, w.out, w.in, M, 1.0f, dy.data<float>(), w.out, x.data<float>(), w.in, 1.0f, w.grad, w.in);
    w.gemm(false, false, M, w.in, w.out, 1.0f, dy.data<float>(), w.out, w.w, w.in, 0.0f, dx.data<float>(), w.in);
  }
  return dx;
}

Tensor to_gemm_input(const Tensor& x, bool use_bf16) {
  if (!use_bf16 || x.dtype() == DType::kBF16) return x;
  Tensor y = Tensor::empty(x.shape(), DType::kBF16);
  convert_f32_to_bf16(x.data<float>(), y.data<bf16>(), x.numel());
  return y;
}

Tensor to_f32(const Tensor& x) {
  if (x.dtype() == DType::kF32) return x;
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  convert_bf16_to_f32(x.data<bf16>(), y.data<float>(), x.numel());
  return y;
}

LinearWeight linear_weight(const ParamBuffer& pb, int id, SgemmFn gemm) {
  const Shape shape = pb.spec(id).local_shape();
  float* grad = pb.spec(id).trainable ? pb.grad_data(id) : nullptr;  // frozen: no dW GEMM
  return LinearWeight{pb.param_data(id), pb.has_bf16() ? pb.param_bf16_data(id) : nullptr, grad, shape[0],
                      shape[1], gemm};
}

}  // namespace gale
