// The NCCL communicator across processes (one GPU each; skips unless every rank has its own GPU):
// collectives against serial results, a send/recv exchange (deferred and grouped, so it cannot
// deadlock), sub-groups. Registered only in CUDA builds (tests/comm/CMakeLists.txt).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "comm/nccl_communicator.h"
#include "mpi_test_env.h"

namespace gale {
namespace {

Comm nccl_world() {
  static Comm w = [] {
    StatusOr<Comm> c = init_nccl_world(test::world(), 120.0);
    return c.ok() ? c.value() : nullptr;
  }();
  return w;
}

bool have_gpus() {
  int64_t enough = cuda_device_count() >= test::world()->size() ? 1 : 0;
  return test::world()->all_reduce_scalar(enough, ReduceOp::kMin) == 1;
}

template <class T>
T* to_device(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(NcclMpi, Collectives) {
  if (!have_gpus()) GTEST_SKIP() << "needs one GPU per rank";
  Comm c = nccl_world();
  ASSERT_NE(c, nullptr);
  const int n = c->size(), r = c->rank();
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * r + static_cast<float>(i % 13);
  float* dx = to_device(x);
  c->all_reduce(dx, 1000, DType::kF32);
  std::vector<float> sum = to_host(dx, 1000);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(sum[i], 0.25f * n * (n - 1) + n * static_cast<float>(i % 13));
  std::vector<bf16> b(64);
  for (int i = 0; i < 64; ++i) b[i] = float_to_bf16(1.0f + r);
  bf16* db = to_device(b);
  c->all_reduce(db, 64, DType::kBF16);
  EXPECT_EQ(bf16_to_float(to_host(db, 64)[5]), static_cast<float>(n * (n + 1) / 2));
  float* all = to_device(std::vector<float>(1000 * n));
  c->all_gather(dx, all, 1000, DType::kF32);
  float* part = to_device(std::vector<float>(1000 / n));
  c->reduce_scatter(all, part, 1000 / n, DType::kF32);
  c->barrier();
  cudaFree(dx), cudaFree(db), cudaFree(all), cudaFree(part);
}

TEST(NcclMpi, SendRecvExchangeDoesNotDeadlock) {
  if (!have_gpus()) GTEST_SKIP() << "needs one GPU per rank";
  Comm c = nccl_world();
  const int n = c->size(), r = c->rank();
  if (n < 2) GTEST_SKIP();
  const size_t count = 1 << 20;
  float* out = to_device(std::vector<float>(count, static_cast<float>(r)));
  float* in = to_device(std::vector<float>(count, -1.0f));
  WorkPtr s = c->send_async(out, count, DType::kF32, (r + 1) % n, 0);
  WorkPtr q = c->recv_async(in, count, DType::kF32, (r + n - 1) % n, 0);
  s->wait();
  q->wait();
  EXPECT_EQ(to_host(in, count)[count - 1], static_cast<float>((r + n - 1) % n));
  cudaFree(out), cudaFree(in);
}

TEST(NcclMpi, SubGroups) {
  if (!have_gpus()) GTEST_SKIP() << "needs one GPU per rank";
  Comm c = nccl_world();
  const int r = c->rank();
  std::vector<int> pair = {r - r % 2};
  if (pair[0] + 1 < c->size()) pair.push_back(pair[0] + 1);
  Comm g = c->make_group(pair, "pair");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->world_ranks(), pair);
  EXPECT_EQ(g->all_reduce_scalar(int64_t{1}), static_cast<int64_t>(pair.size()));
}

}  // namespace
}  // namespace gale
