// The GEMM start-up check: which environments it warns about, and that it sees this machine as it is.
#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstdlib>
#include <string>

#include "kernels/cpu/gemm.h"

namespace gale {
namespace {

// A healthy 16-core AVX-512 machine running one process on all cores.
GemmEnvironment healthy() {
  GemmEnvironment env;
  env.cpu_avx512 = env.cpu_avx2 = true;
  env.onednn_isa = "avx512_core_amx";
  env.onednn_avx512 = env.onednn_avx2 = true;
  env.threads = env.cores = 16;
  return env;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(GemmStartupCheck, HealthyEnvironmentHasNoWarning) {
  EXPECT_TRUE(gemm_environment_warnings(healthy()).empty());
  GemmEnvironment per_rank = healthy();  // 4 ranks per node, 4 threads each
  per_rank.threads = 4;
  per_rank.local_processes = 4;
  EXPECT_TRUE(gemm_environment_warnings(per_rank).empty());
  GemmEnvironment avx2_machine = healthy();  // no AVX-512 on the CPU: avx2 is the best there is
  avx2_machine.cpu_avx512 = avx2_machine.onednn_avx512 = false;
  avx2_machine.onednn_isa = "avx2";
  EXPECT_TRUE(gemm_environment_warnings(avx2_machine).empty());
}

TEST(GemmStartupCheck, IsaCappedByEnvironmentVariableIsNamed) {
  GemmEnvironment env = healthy();
  env.onednn_avx512 = false;
  env.onednn_isa = "avx2";
  env.onednn_max_cpu_isa_env = "AVX2";
  auto w = gemm_environment_warnings(env);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(contains(w[0], "oneDNN runs avx2 kernels on a CPU with AVX-512")) << w[0];
  EXPECT_TRUE(contains(w[0], "ONEDNN_MAX_CPU_ISA/DNNL_MAX_CPU_ISA=AVX2")) << w[0];
}

TEST(GemmStartupCheck, IsaMisdetectedWithoutVariable) {
  GemmEnvironment env = healthy();
  env.onednn_avx512 = env.onednn_avx2 = false;
  env.onednn_isa = "sse41";
  auto w = gemm_environment_warnings(env);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(contains(w[0], "oneDNN runs sse41 kernels")) << w[0];
  EXPECT_TRUE(contains(w[0], "did not detect")) << w[0];

  GemmEnvironment avx2_cpu = env;  // an AVX2-only CPU on sse41 kernels
  avx2_cpu.cpu_avx512 = false;
  w = gemm_environment_warnings(avx2_cpu);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(contains(w[0], "CPU with AVX2 and FMA")) << w[0];
}

TEST(GemmStartupCheck, TooFewThreadsNamesOmpNumThreads) {
  GemmEnvironment env = healthy();
  env.threads = 1;
  env.omp_num_threads_env = "1";
  auto w = gemm_environment_warnings(env);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(contains(w[0], "(OMP_NUM_THREADS=1) use 1 of the 16 available cores")) << w[0];
  EXPECT_TRUE(contains(w[0], "(16)")) << w[0];

  GemmEnvironment two_cores = healthy();  // 1 of 2 cores is half the machine: warned
  two_cores.cores = 2;
  two_cores.threads = 1;
  EXPECT_EQ(gemm_environment_warnings(two_cores).size(), 1u);
  two_cores.threads = 2;
  EXPECT_TRUE(gemm_environment_warnings(two_cores).empty());
}

TEST(GemmStartupCheck, OversubscriptionIsWarned) {
  GemmEnvironment env = healthy();
  env.local_processes = 4;  // 4 ranks x 16 threads on 16 cores
  auto w = gemm_environment_warnings(env);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(contains(w[0], "oversubscribe the 16 available cores")) << w[0];
  EXPECT_TRUE(contains(w[0], "set OMP_NUM_THREADS to 4")) << w[0];
}

TEST(GemmStartupCheck, SecondThreadPoolIsWarned) {
  GemmEnvironment env = healthy();
  env.foreign_thread_pools = {"libopenblas.so.0", "libiomp5.so"};
  auto w = gemm_environment_warnings(env);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_TRUE(contains(w[0], "libopenblas.so.0 is loaded")) << w[0];
  EXPECT_TRUE(contains(w[1], "libiomp5.so is loaded")) << w[1];
}

// This machine as it is: oneDNN must run the best ISA the CPU has unless a variable caps it.
TEST(GemmStartupCheck, ThisMachineRunsItsBestIsa) {
  GemmEnvironment env = detect_gemm_environment();
  EXPECT_GE(env.cores, 1);
  EXPECT_GE(env.threads, 1);
  if (!env.onednn_max_cpu_isa_env.empty()) GTEST_SKIP() << "ONEDNN_MAX_CPU_ISA is set";
  if (env.cpu_avx512) {
    EXPECT_TRUE(env.onednn_avx512) << "oneDNN runs " << env.onednn_isa;
  }
  if (env.cpu_avx2) {
    EXPECT_TRUE(env.onednn_avx2) << "oneDNN runs " << env.onednn_isa;
  }
  EXPECT_TRUE(env.foreign_thread_pools.empty()) << env.foreign_thread_pools.front();
}

// A real capped oneDNN, in a fresh process (oneDNN reads the variable once, on first use).
TEST(GemmStartupCheckDeathTest, CappedOneDnnIsReported) {
  // Not detect_gemm_environment(): that would start oneDNN before the child sets the variable.
  if (!__builtin_cpu_supports("avx512bw")) GTEST_SKIP() << "needs an AVX-512 CPU";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
        for (const auto& w : gemm_startup_check()) fprintf(stderr, "%s\n", w.c_str());
        std::exit(0);
      },
      testing::ExitedWithCode(0), "oneDNN runs avx2 kernels on a CPU with AVX-512.*ONEDNN_MAX_CPU_ISA");
}

}  // namespace
}  // namespace gale
