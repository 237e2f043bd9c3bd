// Linear forward/backward as three sgemm shapes.
#include "model/linear.h"

#include "kernels/cpu/gemm.h"

namespace gale {

Tensor linear_forward(const Tensor& x, const float* W, int64_t N) {
  int64_t M = x.size(0), K = x.size(1);
  Tensor y = Tensor::empty({M, N});
  sgemm(false, true, M, N, K, 1.0f, x.data<float>(), K, W, K, 0.0f, y.data<float>(), N);
  return y;
}

Tensor linear_backward_data(const Tensor& dy, const float* W, int64_t K) {
  int64_t M = dy.size(0), N = dy.size(1);
  Tensor dx = Tensor::empty({M, K});
  sgemm(false, false, M, K, N, 1.0f, dy.data<float>(), N, W, K, 0.0f, dx.data<float>(), K);
  return dx;
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, float* dW) {
  int64_t M = dy.size(0), N = dy.size(1), K = x.size(1);
  GALE_CHECK_EQ(x.size(0), M);
  sgemm(true, false, N, K, M, 1.0f, dy.data<float>(), N, x.data<float>(), K, 1.0f, dW, K);
}

}  // namespace gale
