// --swap-optimizer's file tier (optim/state_swap.h): the chunk plan (even targets, 64-element
// alignment inside a run, merging) and the staging of chunks in and out of the file (the file
// itself: tests/core/swap_file_test.cc).
#include "optim/state_swap.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace gale {
namespace {

std::string fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_state_swap_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(PlanSwapChunks, EvenTargetsUnevenChunks) {
  // One run of 100 elements, alignment 1: ⌈100·j/3⌉ → 34, 67.
  EXPECT_EQ(plan_swap_chunks({{0, 100}}, 100, 3, 1), (std::vector<int64_t>{0, 34, 67, 100}));
  EXPECT_EQ(plan_swap_chunks({{0, 100}}, 100, 1, 1), (std::vector<int64_t>{0, 100}));
  EXPECT_EQ(plan_swap_chunks({{0, 100}}, 100, 0, 1), (std::vector<int64_t>{0, 100}));  // MindSpeed's 0: all at once
  // More chunks than elements: every element its own chunk, no empty chunk.
  EXPECT_EQ(plan_swap_chunks({{0, 3}}, 3, 16, 1), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(plan_swap_chunks({}, 0, 16), (std::vector<int64_t>{0}));
}

TEST(PlanSwapChunks, AlignsInsideARunAndKeepsRunEdges) {
  // Runs [0, 130), [130, 1000): target 334 is 204 into the second run → 130 + 256 = 386; target
  // 667 is 537 into it → 130 + 576 = 706.
  EXPECT_EQ(plan_swap_chunks({{0, 130}, {130, 870}}, 1000, 3, 64), (std::vector<int64_t>{0, 386, 706, 1000}));
  // A target inside a short run moves to the run's end.
  EXPECT_EQ(plan_swap_chunks({{0, 40}, {40, 60}}, 100, 2, 64), (std::vector<int64_t>{0, 100}));
  EXPECT_EQ(plan_swap_chunks({{0, 40}, {40, 60}}, 100, 5, 64), (std::vector<int64_t>{0, 40, 100}));
  // Every boundary inside a run is a multiple of 64 from the run's start.
  const std::vector<StateRun> runs = {{0, 1000}, {1000, 77}, {1077, 5000}, {6077, 3}};
  for (int64_t times : {2, 3, 7, 16, 100}) {
    const std::vector<int64_t> b = plan_swap_chunks(runs, 6080, times, 64);
    EXPECT_LE(static_cast<int64_t>(b.size()) - 1, times);
    for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
    for (int64_t x : b)
      for (const StateRun& r : runs)
        if (r.begin < x && x < r.begin + r.numel) {
          EXPECT_EQ((x - r.begin) % 64, 0) << x << " times " << times;
        }
  }
}

TEST(OptimizerStateSwap, ChunksGoInAndOutThroughOneStagingBuffer) {
  const std::string dir = fresh_dir("chunks");
  const int64_t n = 1000;
  auto s = OptimizerStateSwap::create(dir, 2, n, plan_swap_chunks({{0, n}}, n, 3, 1));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  OptimizerStateSwap& swap = **s;
  EXPECT_EQ(swap.num_chunks(), 3);
  EXPECT_EQ(swap.file_bytes(), 2 * n * 4);
  EXPECT_EQ(swap.staging_bytes(), 2 * 334 * 4);  // the largest chunk, per state
  // Write i and −i through the chunks, as a step does.
  for (int64_t i = 0; i < n; ++i) {
    swap.load(swap.chunk_of(i));
    EXPECT_EQ(*swap.at(0, i), 0.0f);  // the initial state
    *swap.at(0, i) = static_cast<float>(i);
    *swap.at(1, i) = -static_cast<float>(i);
  }
  swap.flush();
  EXPECT_EQ(swap.resident(), -1);
  std::vector<float> a(n), b(n);
  ASSERT_TRUE(swap.read(0, 0, n, a.data()).ok());
  ASSERT_TRUE(swap.read(1, 0, n, b.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a[i], static_cast<float>(i));
    ASSERT_EQ(b[i], -static_cast<float>(i));
  }
  // Writes straight to the file are what the next load sees.
  const float seven = 7.0f;
  ASSERT_TRUE(swap.write(1, 500, 1, &seven).ok());
  swap.load(swap.chunk_of(500));
  EXPECT_EQ(*swap.at(1, 500), 7.0f);
  EXPECT_EQ(*swap.at(0, 500), 500.0f);
  swap.flush();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
