// The checkpoint commit protocol across real MPI processes: shards from every rank, reads at
// another layout on every rank, and a failure on one rank that commits nothing anywhere.
// Registered in tests/ckpt/CMakeLists.txt for 2 and 4 ranks.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "mpi_test_env.h"

namespace gale {
namespace {

namespace fs = std::filesystem;

// A directory every rank agrees on: rank 0 makes it, the name is broadcast.
std::string shared_temp_dir(Communicator& comm) {
  char name[256] = {0};
  if (comm.rank() == 0) {
    std::string pattern = (fs::temp_directory_path() / "gale_ckpt_mpi_XXXXXX").string();
    if (::mkdtemp(pattern.data())) std::snprintf(name, sizeof(name), "%s", pattern.c_str());
  }
  comm.broadcast(name, sizeof(name), DType::kU8, 0);
  return name;
}

float value_at(int64_t r, int64_t c, float base) { return base + static_cast<float>(r * 1000 + c); }

// Every rank saves rows [3·rank, 3·rank + 3) of a [3·world, 5] tensor and a slice of a flat state.
Status save(Communicator& comm, const std::string& dir, int64_t iteration, float base) {
  const int64_t W = comm.size(), r0 = 3 * comm.rank();
  Tensor rows = Tensor::empty({3, 5});
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) rows.data<float>()[i * 5 + j] = value_at(r0 + i, j, base);
  Tensor flat = Tensor::empty({4});
  for (int64_t i = 0; i < 4; ++i) flat.data<float>()[i] = base + static_cast<float>(4 * comm.rank() + i);
  CheckpointWriter w(dir, iteration, comm);
  GALE_RETURN_IF_ERROR(w.add("w", {3 * W, 5}, {r0, 0}, rows));
  GALE_RETURN_IF_ERROR(w.add_flat("optimizer.exp_avg.w", 4 * W, 4 * comm.rank(), flat));
  return w.commit({{"base", base}});
}

// Every rank reads column j = rank % 5 (all rows) and its mirrored flat slice, and checks them.
void expect_checkpoint(Communicator& comm, const std::string& dir, int64_t iteration, float base) {
  const int64_t W = comm.size();
  StatusOr<CheckpointReader> r = CheckpointReader::open(dir);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->iteration(), iteration);
  EXPECT_EQ(r->section("base").value().get<float>(), base);
  EXPECT_EQ(r->metadata()["shards"].size(), static_cast<size_t>(W));
  const int64_t col = comm.rank() % 5;
  StatusOr<Tensor> c = r->read_slice("w", {3 * W, 5}, {0, col}, {3 * W, 1});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  for (int64_t i = 0; i < 3 * W; ++i) EXPECT_EQ(c->data<float>()[i], value_at(i, col, base)) << i;
  const int64_t start = 4 * (W - 1 - comm.rank()) + 1, len = std::min<int64_t>(5, 4 * W - start);
  StatusOr<Tensor> f = r->read_flat("optimizer.exp_avg.w", 4 * W, start, len);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  for (int64_t i = 0; i < len; ++i) EXPECT_EQ(f->data<float>()[i], base + static_cast<float>(start + i));
}

TEST(CheckpointMpi, EveryRankWritesItsShardAndReadsAnotherLayout) {
  Comm world = test::world();
  std::string dir = shared_temp_dir(*world);
  ASSERT_FALSE(dir.empty());
  Status s = save(*world, dir, 100, 0.5f);
  ASSERT_TRUE(s.ok()) << s.to_string();
  world->barrier();
  expect_checkpoint(*world, dir, 100, 0.5f);
  // A second save replaces the tracked iteration; the first stays on disk.
  ASSERT_TRUE(save(*world, dir, 200, 7.0f).ok());
  expect_checkpoint(*world, dir, 200, 7.0f);
  StatusOr<CheckpointReader> old = CheckpointReader::open_iteration(dir, 100);
  EXPECT_TRUE(old.ok());
  world->barrier();
  if (world->rank() == 0) fs::remove_all(dir);
}

// The last rank's file-size limit makes its shard write fail: every rank gets an error, nothing is
// committed, and the previous checkpoint stays the latest.
TEST(CheckpointMpi, AShardFailureOnOneRankFailsTheSaveEverywhere) {
  Comm world = test::world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  std::string dir = shared_temp_dir(*world);
  ASSERT_TRUE(save(*world, dir, 10, 1.0f).ok());
  struct rlimit old_limit {};
  ::getrlimit(RLIMIT_FSIZE, &old_limit);
  if (world->rank() == world->size() - 1) {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit tiny = old_limit;
    tiny.rlim_cur = 64;  // smaller than any shard
    ::setrlimit(RLIMIT_FSIZE, &tiny);
  }
  Status s = save(*world, dir, 20, 2.0f);
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  EXPECT_FALSE(s.ok());
  if (world->rank() != world->size() - 1) {
    EXPECT_NE(s.message().find("rank " + std::to_string(world->size() - 1) + " failed to write its shard"),
              std::string::npos)
        << s.message();
  }
  world->barrier();
  expect_checkpoint(*world, dir, 10, 1.0f);
  EXPECT_FALSE(fs::exists(dir + "/iter_0000020"));
  world->barrier();
  if (world->rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace gale
