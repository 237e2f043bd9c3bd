// The deferred weight-gradient queue of --dualpipev-dw-detach: a deferred dW is bitwise the one
// computed at once (f32 and bf16 GEMM inputs), groups run oldest first in the order they were put,
// the input gradient does not wait for them, and held_bytes accounts the dy and x they keep alive.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model/linear.h"
#include "model/weight_grad_store.h"
#include "testing.h"

namespace gale {
namespace {

using testing::random_vector;

constexpr int64_t kRows = 12, kIn = 16, kOut = 8;

Tensor tensor_of(std::vector<float>& v, const Shape& shape) { return Tensor::from_blob(v.data(), shape, DType::kF32); }

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(WeightGradStore, DeferredGradientsAreBitwiseTheImmediateOnesInPutOrder) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    std::vector<float> w = random_vector(kOut * kIn, 1), x1 = random_vector(kRows * kIn, 2),
                       x2 = random_vector(kRows * kIn, 3), dy1 = random_vector(kRows * kOut, 4),
                       dy2 = random_vector(kRows * kOut, 5);
    std::vector<bf16> w_bf16(w.size());
    convert_f32_to_bf16(w.data(), w_bf16.data(), static_cast<int64_t>(w.size()));
    const std::vector<float> start = random_vector(kOut * kIn, 6);
    std::vector<float> now = start, later = start;
    LinearWeight lw{w.data(), w_bf16.data(), nullptr, now.data(), kOut, kIn, sgemm};
    const Tensor gx1 = to_gemm_input(tensor_of(x1, {kRows, kIn}), dtype);
    const Tensor gx2 = to_gemm_input(tensor_of(x2, {kRows, kIn}), dtype);
    // At once: micro-batch 1, then 2.
    Tensor dx_now = linear_backward(tensor_of(dy1, {kRows, kOut}), gx1, lw);
    linear_backward(tensor_of(dy2, {kRows, kOut}), gx2, lw);
    // Deferred: two backward steps, then two weight steps.
    WeightGradStore store;
    LinearWeight deferred = lw;
    deferred.grad = later.data();
    deferred.defer = &store;
    Tensor dx_later = linear_backward(tensor_of(dy1, {kRows, kOut}), gx1, deferred);
    store.flush(1, 0);
    linear_backward(tensor_of(dy2, {kRows, kOut}), gx2, deferred);
    store.flush(0, 3);
    EXPECT_TRUE(same(later, start)) << "nothing accumulates before the weight steps";
    EXPECT_EQ(std::memcmp(dx_now.raw(), dx_later.raw(), dx_now.nbytes()), 0) << "the input gradient is unchanged";
    const int64_t per_record = kRows * kOut * dtype_size(dtype) + kRows * kIn * dtype_size(dtype);
    EXPECT_EQ(store.held_bytes(), 2 * per_record);
    EXPECT_EQ(store.pending_groups(), 2u);
    EXPECT_EQ(store.pop(), (std::pair<int, int64_t>{1, 0}));
    EXPECT_EQ(store.held_bytes(), per_record);
    EXPECT_EQ(store.pop(), (std::pair<int, int64_t>{0, 3}));
    EXPECT_TRUE(store.empty());
    EXPECT_EQ(store.held_bytes(), 0);
    EXPECT_TRUE(same(later, now)) << dtype_name(dtype);
  }
}

TEST(WeightGradStore, FrozenWeightsQueueNothing) {
  std::vector<float> w = random_vector(kOut * kIn, 1), x = random_vector(kRows * kIn, 2),
                     dy = random_vector(kRows * kOut, 3);
  WeightGradStore store;
  LinearWeight lw{w.data(), nullptr, nullptr, nullptr, kOut, kIn, sgemm};
  lw.defer = &store;
  linear_backward(tensor_of(dy, {kRows, kOut}), tensor_of(x, {kRows, kIn}), lw);
  store.flush(0, 0);
  EXPECT_EQ(store.held_bytes(), 0);
  EXPECT_EQ(store.pop(), (std::pair<int, int64_t>{0, 0}));  // an empty group
}

}  // namespace
}  // namespace gale
