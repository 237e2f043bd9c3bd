// The deferred weight-gradient queue of --dualpipev-dw-detach: a deferred dW is bitwise the one
// computed at once (f32 and bf16 GEMM inputs), groups run oldest first in the order they were put,
// the input gradient does not wait for them, held_bytes accounts the dy and x they keep alive, and
// MoE expert batches run through the experts' loop as at once.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model/expert_loop.h"
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

// MoE experts: a batch of per-expert records (one slot left empty: an expert without rows) runs at
// pop() through the experts' loop, each GEMM on one thread as at once, after the single records put
// before it: bitwise the gradients the loop computes at once.
TEST(WeightGradStore, ExpertBatchesRunLikeTheExpertLoop) {
  constexpr int64_t kExperts = 3;
  std::vector<std::vector<float>> w, x, dy;
  for (int64_t e = 0; e < kExperts; ++e) {
    w.push_back(random_vector(kOut * kIn, 10 + e));
    x.push_back(random_vector(kRows * kIn, 20 + e));
    dy.push_back(random_vector(kRows * kOut, 30 + e));
  }
  std::vector<float> dense_w = random_vector(kOut * kIn, 40), dense_x = random_vector(kRows * kIn, 41),
                     dense_dy = random_vector(kRows * kOut, 42);
  const std::vector<float> start = random_vector(kOut * kIn, 7);
  std::vector<std::vector<float>> now(kExperts + 1, start), later(kExperts + 1, start);
  const auto weight_of = [&](int64_t e, std::vector<std::vector<float>>& grads) {
    return LinearWeight{w[e].data(), nullptr, nullptr, grads[e].data(), kOut, kIn, sgemm};
  };
  const auto rows_of = [&](int64_t e) { return e == 1 ? int64_t{0} : kRows; };  // expert 1: no rows
  // At once: a dense linear, then the experts' loop.
  LinearWeight dense{dense_w.data(), nullptr, nullptr, now[kExperts].data(), kOut, kIn, sgemm};
  linear_backward_weight(tensor_of(dense_dy, {kRows, kOut}), tensor_of(dense_x, {kRows, kIn}), dense);
  for_each_expert(kExperts, [&](int64_t e) {
    if (rows_of(e) == 0) return;
    linear_backward_weight(tensor_of(dy[e], {kRows, kOut}), tensor_of(x[e], {kRows, kIn}), weight_of(e, now));
  });
  // Deferred: the same, into one backward step's group.
  WeightGradStore store;
  dense.grad = later[kExperts].data();
  dense.defer = &store;
  linear_backward_weight(tensor_of(dense_dy, {kRows, kOut}), tensor_of(dense_x, {kRows, kIn}), dense);
  store.begin_experts(kExperts);
  EXPECT_FALSE(store.empty());
  for_each_expert(kExperts, [&](int64_t e) {
    if (rows_of(e) == 0) return;
    store.put_expert(e, tensor_of(dy[e], {kRows, kOut}), tensor_of(x[e], {kRows, kIn}), weight_of(e, later));
  });
  store.end_experts();
  store.flush(0, 5);
  const int64_t per_record = (kRows * kOut + kRows * kIn) * static_cast<int64_t>(sizeof(float));
  EXPECT_EQ(store.held_bytes(), 3 * per_record);  // the dense record and two experts'
  for (int64_t e = 0; e <= kExperts; ++e) EXPECT_TRUE(same(later[e], start)) << "slot " << e;
  EXPECT_EQ(store.pop(), (std::pair<int, int64_t>{0, 5}));
  EXPECT_TRUE(store.empty());
  EXPECT_EQ(store.held_bytes(), 0);
  for (int64_t e = 0; e <= kExperts; ++e) EXPECT_TRUE(same(later[e], now[e])) << "slot " << e;
  EXPECT_TRUE(same(later[1], start)) << "the expert without rows has no gradient";
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
