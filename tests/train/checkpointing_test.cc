// --async-save's finalisation (AsyncCheckpointSaves): a checkpoint is tracked only once every
// rank's background writer has finished; the non-blocking check never waits, the blocking one does.
#include "train/checkpointing.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/temp_dir.h"
#include "ckpt/thread_communicator.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing_util::read_bytes;
using testing_util::run_ranks;
using testing_util::TempDir;

// A writer of iteration `it` with one small tensor, already started (its shard is being written).
std::unique_ptr<CheckpointWriter> started_writer(const std::string& dir, int64_t it, Communicator& comm,
                                                 CheckpointWriterOptions options = {}) {
  auto w = std::make_unique<CheckpointWriter>(dir, it, comm, std::move(options));
  Tensor t = Tensor::zeros({8});
  t.fill(static_cast<float>(comm.rank() + 1));
  EXPECT_TRUE(w->add("x", {16}, {8 * comm.rank()}, t).ok());
  Status s = w->start_commit(nlohmann::json::object());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return w;
}

TEST(AsyncCheckpointSaves, NonBlockingFinalisationWaitsForTheWriter) {
  TempDir tmp;
  const std::string tracker = tmp.file("latest_checkpointed_iteration.txt");
  Comm self = make_self_communicator();
  AsyncCheckpointSaves saves(*self);
  EXPECT_TRUE(saves.empty());
  EXPECT_TRUE(saves.maybe_finalize(false).ok());  // nothing in flight: nothing to do
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  CheckpointWriterOptions options;
  // Bounded, so that a broken finalisation fails the test instead of hanging it.
  options.before_shard_write = [released] { released.wait_for(std::chrono::seconds(20)); };
  saves.schedule(started_writer(tmp.path(), 4, *self, options), "saved");
  for (int i = 0; i < 5; ++i) {  // training iterations while the writer is held back
    ASSERT_TRUE(saves.maybe_finalize(false).ok());
    EXPECT_FALSE(saves.empty());
    EXPECT_FALSE(fs::exists(tracker));
    EXPECT_FALSE(fs::exists(tmp.file("iter_0000004")));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  release.set_value();
  for (int i = 0; i < 6000 && !saves.empty(); ++i) {
    ASSERT_TRUE(saves.maybe_finalize(false).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(saves.empty());
  EXPECT_EQ(read_bytes(tracker), "4");
}

TEST(AsyncCheckpointSaves, BlockingFinalisationWaitsForTheWriter) {
  TempDir tmp;
  Comm self = make_self_communicator();
  AsyncCheckpointSaves saves(*self);
  CheckpointWriterOptions options;
  options.before_shard_write = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  saves.schedule(started_writer(tmp.path(), 6, *self, options), "saved");
  ASSERT_TRUE(saves.maybe_finalize(true).ok());
  EXPECT_TRUE(saves.empty());
  EXPECT_EQ(read_bytes(tmp.file("latest_checkpointed_iteration.txt")), "6");
}

// Rank 0's writer finishes at once, rank 1's is held back: no rank finalises (no tracker) until
// both have finished, and then both finalise at the same check.
TEST(AsyncCheckpointSaves, EveryRankMustHaveFinished) {
  TempDir tmp;
  const std::string tracker = tmp.file("latest_checkpointed_iteration.txt");
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<int> finalised_at(2, -1);
  run_ranks(2, [&](Communicator& comm) {
    AsyncCheckpointSaves saves(comm);
    CheckpointWriterOptions options;
    if (comm.rank() == 1) options.before_shard_write = [released] { released.wait_for(std::chrono::seconds(20)); };
    saves.schedule(started_writer(tmp.path(), 8, comm, options), "saved");
    for (int i = 0; i < 6000 && !saves.empty(); ++i) {
      if (comm.rank() == 0 && i == 20) release.set_value();
      EXPECT_TRUE(saves.maybe_finalize(false).ok());
      if (comm.rank() == 0 && i < 20) {
        EXPECT_FALSE(fs::exists(tracker)) << "check " << i;
      }
      if (saves.empty()) finalised_at[static_cast<size_t>(comm.rank())] = i;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  EXPECT_GE(finalised_at[0], 20);
  EXPECT_EQ(finalised_at[0], finalised_at[1]);
  EXPECT_EQ(read_bytes(tracker), "8");
}

}  // namespace
}  // namespace gale
