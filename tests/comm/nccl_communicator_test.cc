// The NCCL communicator in one process: without a GPU, asking for it is a clear error (this runs
// on CPU-only machines with a CUDA build); with a GPU, every collective on a world of one and
// host-buffer staging work. Skips in builds without CUDA.
#include <gtest/gtest.h>

#include "comm/communicator.h"

#ifdef GALE_HAVE_CUDA
#include <cuda_runtime.h>

#include <vector>

#include "comm/nccl_communicator.h"
#endif

namespace gale {
namespace {

#ifndef GALE_HAVE_CUDA

TEST(NcclCommunicator, NotBuiltWithoutCuda) {
  StatusOr<Comm> w = init_world("nccl");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("--distributed-backend nccl: this build of gale has no CUDA/NCCL"),
            std::string::npos);
}

#else

TEST(NcclCommunicator, WithoutAGpuItIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  StatusOr<Comm> w = init_world("nccl");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(w.status().message().find("--distributed-backend nccl: no CUDA GPU is visible to this process"),
            std::string::npos)
      << w.status().message();
  EXPECT_NE(w.status().message().find("use --distributed-backend mpi"), std::string::npos);
}

template <class T>
T* device_copy(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
template <class T>
std::vector<T> host_copy(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(NcclCommunicator, WorldOfOneOnAGpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
  StatusOr<Comm> w = init_nccl_world(make_self_communicator("bootstrap"), 60.0);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  Comm c = w.value();
  EXPECT_STREQ(c->backend(), "nccl");
  EXPECT_EQ(c->size(), 1);
  std::vector<float> x = {1.5f, -2.0f, 3.25f, 4.0f};
  float* dx = device_copy(x);
  c->all_reduce(dx, 4, DType::kF32);
  EXPECT_EQ(host_copy(dx, 4), x);
  float* dy = device_copy(std::vector<float>(4, 0.0f));
  c->all_gather(dx, dy, 4, DType::kF32);
  EXPECT_EQ(host_copy(dy, 4), x);
  c->reduce_scatter(dx, dy, 4, DType::kF32);
  EXPECT_EQ(host_copy(dy, 4), x);
  c->broadcast(dx, 4, DType::kF32, 0);
  c->all_to_all(dx, dy, 4, DType::kF32);
  EXPECT_EQ(host_copy(dy, 4), x);
  c->barrier();
  // Host buffers are staged through the device.
  EXPECT_EQ(c->all_reduce_scalar(int64_t{7}), 7);
  EXPECT_DOUBLE_EQ(c->all_reduce_scalar(2.5), 2.5);
  Comm g = c->make_group({0}, "tp");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(c->stats().calls[static_cast<int>(CommOp::kAllReduce)], 3);
  cudaFree(dx);
  cudaFree(dy);
}

#endif

}  // namespace
}  // namespace gale
