// Checkpoint store: round trips, resharded slices, multi-rank saves, crash safety and clear errors.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/checkpoint_layout.h"
#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "temp_dir.h"
#include "thread_communicator.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing_util::read_bytes;
using testing_util::run_ranks;
using testing_util::TempDir;
using testing_util::write_bytes;

// The value every test stores at global element (r, c) of a 2-D tensor: unique and exact in f32.
float cell(int64_t r, int64_t c, float base) { return base + static_cast<float>(r * 100 + c); }

// The box `b` of a global 2-D tensor filled with cell().
Tensor grid_piece(const Box& b, float base) {
  Tensor t = Tensor::empty(b.shape);
  for (int64_t i = 0; i < b.shape[0]; ++i)
    for (int64_t j = 0; j < b.shape[1]; ++j)
      t.data<float>()[i * b.shape[1] + j] = cell(b.offsets[0] + i, b.offsets[1] + j, base);
  return t;
}

// EXPECT that `t` (f32) holds box `b` of the cell() tensor.
void expect_grid(const Tensor& t, const Box& b, float base) {
  ASSERT_EQ(t.shape(), b.shape);
  for (int64_t i = 0; i < b.shape[0]; ++i)
    for (int64_t j = 0; j < b.shape[1]; ++j)
      ASSERT_EQ(t.data<float>()[i * b.shape[1] + j], cell(b.offsets[0] + i, b.offsets[1] + j, base))
          << "element " << i << "," << j << " of " << box_string(b);
}

// Saves iteration `it` with one whole [4, 8] tensor "w" valued cell(.., base) and a section {"base": base}.
Status save_simple(const std::string& dir, int64_t it, float base, CheckpointWriterOptions options = {}) {
  Comm self = make_self_communicator();
  CheckpointWriter w(dir, it, *self, std::move(options));
  Tensor t = grid_piece(whole_box({4, 8}), base);
  GALE_RETURN_IF_ERROR(w.add("w", t));
  return w.commit({{"base", base}});
}

// Opens the latest checkpoint and checks it is iteration `it` holding base `base`.
void expect_latest(const std::string& dir, int64_t it, float base) {
  StatusOr<CheckpointReader> r = CheckpointReader::open(dir);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->iteration(), it);
  EXPECT_EQ(r->section("base").value().get<float>(), base);
  StatusOr<Tensor> t = r->read("w", {4, 8});
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  expect_grid(*t, whole_box({4, 8}), base);
}

TEST(Checkpoint, RoundTripsTensorsAndMetadataInMegatronLayout) {
  TempDir tmp;
  std::string dir = tmp.file("ckpt");
  Comm self = make_self_communicator();
  CheckpointWriter w(dir, 100, *self);
  Tensor a = grid_piece(whole_box({3, 5}), 0.5f);
  Tensor b = Tensor::empty({6}, DType::kBF16);
  for (int i = 0; i < 6; ++i) b.data<bf16>()[i] = float_to_bf16(0.25f * static_cast<float>(i));
  Tensor steps = Tensor::empty({}, DType::kI64);
  steps.data<int64_t>()[0] = 1234567890123;
  ASSERT_TRUE(w.add("decoder.layers.0.mlp.linear_fc1.weight", a).ok());
  ASSERT_TRUE(w.add("decoder.final_layernorm.weight", b).ok());
  ASSERT_TRUE(w.add("optimizer.step", steps).ok());
  nlohmann::json sections = {
      {"args", {{"lr", 3e-4}, {"seed", 1234}}}, {"consumed_samples", 6400}, {"rng", {{"seed", 7}}}};
  Status s = w.commit(sections);
  ASSERT_TRUE(s.ok()) << s.to_string();

  EXPECT_EQ(read_bytes(dir + "/latest_checkpointed_iteration.txt"), "100");
  EXPECT_TRUE(fs::exists(dir + "/iter_0000100/metadata.json"));
  EXPECT_TRUE(fs::exists(dir + "/iter_0000100/shard_00000.safetensors"));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir))
    entries += e.path().filename() != "latest_checkpointed_iteration.txt";
  EXPECT_EQ(entries, 1) << "temporary directories left behind";

  StatusOr<CheckpointReader> r = CheckpointReader::open(dir);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->iteration(), 100);
  EXPECT_EQ(r->metadata()["format"], "gale-checkpoint");
  EXPECT_EQ(r->metadata()["version"], 1);
  EXPECT_EQ(r->metadata()["shards"].size(), 1u);
  EXPECT_EQ(r->section("args").value(), sections["args"]);
  EXPECT_EQ(r->section("consumed_samples").value(), 6400);
  EXPECT_EQ(r->section("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r->tensor_names(), (std::vector<std::string>{"decoder.final_layernorm.weight",
                                                         "decoder.layers.0.mlp.linear_fc1.weight", "optimizer.step"}));
  EXPECT_EQ(r->global_shape("decoder.final_layernorm.weight").value(), (Shape{6}));
  StatusOr<Tensor> a2 = r->read("decoder.layers.0.mlp.linear_fc1.weight", {3, 5});
  ASSERT_TRUE(a2.ok());
  expect_grid(*a2, whole_box({3, 5}), 0.5f);
  StatusOr<Tensor> b2 = r->read("decoder.final_layernorm.weight", {6}, DType::kBF16);
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ(std::memcmp(b2->raw(), b.raw(), b.nbytes()), 0);
  StatusOr<Tensor> b3 = r->read("decoder.final_layernorm.weight", {6});  // widened to f32
  ASSERT_TRUE(b3.ok());
  EXPECT_EQ(b3->data<float>()[5], 1.25f);
  StatusOr<Tensor> s2 = r->read("optimizer.step", {}, DType::kI64);
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(s2->data<int64_t>()[0], 1234567890123);

  // A whole tensor is stored under its plain name: the shard is an ordinary safetensors model file.
  StatusOr<SafetensorsFile> shard = SafetensorsFile::open(dir + "/iter_0000100/shard_00000.safetensors");
  ASSERT_TRUE(shard.ok());
  EXPECT_TRUE(shard->contains("decoder.layers.0.mlp.linear_fc1.weight"));
}

// A [4, 8] tensor saved as 2x2 pieces of [2, 4], read back as 1x4 ([4, 2] column blocks), 4x1
// ([1, 8] rows) and a slice straddling all four pieces.
TEST(Checkpoint, SlicesAreAssembledAcrossPieceBoundaries) {
  TempDir tmp;
  Comm self = make_self_communicator();
  CheckpointWriter w(tmp.path(), 7, *self);
  std::vector<Tensor> keep;
  for (int64_t pr = 0; pr < 2; ++pr)
    for (int64_t pc = 0; pc < 2; ++pc) {
      Box b{{pr * 2, pc * 4}, {2, 4}};
      keep.push_back(grid_piece(b, 0.0f));
      ASSERT_TRUE(w.add("w", {4, 8}, b.offsets, keep.back()).ok());
    }
  ASSERT_TRUE(w.commit(nlohmann::json::object()).ok());
  StatusOr<CheckpointReader> r = CheckpointReader::open(tmp.path());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (int64_t c = 0; c < 4; ++c) {
    Box b{{0, c * 2}, {4, 2}};
    StatusOr<Tensor> t = r->read_slice("w", {4, 8}, b.offsets, b.shape);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    expect_grid(*t, b, 0.0f);
  }
  for (int64_t row = 0; row < 4; ++row) {
    Box b{{row, 0}, {1, 8}};
    StatusOr<Tensor> t = r->read_slice("w", {4, 8}, b.offsets, b.shape);
    ASSERT_TRUE(t.ok());
    expect_grid(*t, b, 0.0f);
  }
  Box middle{{1, 3}, {2, 3}};
  StatusOr<Tensor> t = r->read_slice("w", {4, 8}, middle.offsets, middle.shape);
  ASSERT_TRUE(t.ok());
  expect_grid(*t, middle, 0.0f);
  // Into an existing bf16 tensor.
  Tensor out = Tensor::empty({4, 8}, DType::kBF16);
  ASSERT_TRUE(r->read_slice_into("w", {4, 8}, {0, 0}, out).ok());
  EXPECT_EQ(bf16_to_float(out.data<bf16>()[3 * 8 + 7]), bf16_to_float(float_to_bf16(cell(3, 7, 0.0f))));
  // Out of range.
  EXPECT_EQ(r->read_slice("w", {4, 8}, {3, 0}, {2, 8}).status().code(), StatusCode::kInvalidArgument);
}

// Four ranks save a TP2 x PP2 layout (each rank one [V/2, H] block of each of its stage's two
// tensors, plus a ZeRO-style flat optimizer slice); loads at TP1 x PP4 and DP3 read other boxes.
TEST(Checkpoint, MultiRankSaveLoadsAtAnotherLayout) {
  TempDir tmp;
  const int64_t V = 6, H = 4, numel = 17;
  run_ranks(4, [&](Communicator& comm) {
    int tp = comm.rank() % 2, pp = comm.rank() / 2;
    CheckpointWriter w(tmp.path(), 50, comm);
    std::vector<Tensor> keep;
    for (int layer = 2 * pp; layer < 2 * pp + 2; ++layer) {
      Box b{{tp * V / 2, 0}, {V / 2, H}};
      keep.push_back(grid_piece(b, 1000.0f * static_cast<float>(layer)));
      EXPECT_TRUE(w.add("layers." + std::to_string(layer) + ".w", {V, H}, b.offsets, keep.back()).ok());
    }
    // Flat state split over 4 ranks at uneven boundaries 0, 5, 9, 14, 17.
    const int64_t bounds[] = {0, 5, 9, 14, 17};
    int64_t lo = bounds[comm.rank()], hi = bounds[comm.rank() + 1];
    Tensor flat = Tensor::empty({hi - lo});
    for (int64_t i = lo; i < hi; ++i) flat.data<float>()[i - lo] = 0.5f * static_cast<float>(i);
    keep.push_back(flat);
    EXPECT_TRUE(w.add_flat("optimizer.exp_avg", numel, lo, flat).ok());
    Status s = w.commit({{"world", {{"tp", 2}, {"pp", 2}}}});
    EXPECT_TRUE(s.ok()) << "rank " << comm.rank() << ": " << s.to_string();
  });
  StatusOr<CheckpointReader> r = CheckpointReader::open(tmp.path());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->metadata()["shards"].size(), 4u);
  EXPECT_EQ(r->metadata()["world_size"], 4);
  // TP1 x PP4: stage s holds layer s whole.
  for (int layer = 0; layer < 4; ++layer) {
    StatusOr<Tensor> t = r->read("layers." + std::to_string(layer) + ".w", {V, H});
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    expect_grid(*t, whole_box({V, H}), 1000.0f * static_cast<float>(layer));
  }
  // TP3: rows in thirds cross the saved halves.
  for (int64_t part = 0; part < 3; ++part) {
    Box b{{part * 2, 0}, {2, H}};
    StatusOr<Tensor> t = r->read_slice("layers.1.w", {V, H}, b.offsets, b.shape);
    ASSERT_TRUE(t.ok());
    expect_grid(*t, b, 1000.0f);
  }
  // DP3 over the flat state: [0, 6), [6, 12), [12, 17).
  for (int64_t lo : {0, 6, 12}) {
    int64_t len = std::min<int64_t>(6, numel - lo);
    StatusOr<Tensor> t = r->read_flat("optimizer.exp_avg", numel, lo, len);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    for (int64_t i = 0; i < len; ++i) EXPECT_EQ(t->data<float>()[i], 0.5f * static_cast<float>(lo + i));
  }
}

// Rank 1's shard write fails for real (the file-size limit makes write() return EFBIG): every rank
// reports the failure and the previous checkpoint stays the latest.
TEST(Checkpoint, AFailedShardOnOneRankCommitsNothingAnywhere) {
  TempDir tmp;
  ASSERT_TRUE(save_simple(tmp.path(), 10, 1.0f).ok());
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 256 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::vector<std::string> messages(2);
  run_ranks(2, [&](Communicator& comm) {
    CheckpointWriter w(tmp.path(), 20, comm);
    Tensor t = Tensor::zeros({comm.rank() == 0 ? 16 : 200000});  // rank 1: 800 kB, over the limit
    EXPECT_TRUE(w.add("x" + std::to_string(comm.rank()), t).ok());
    Status s = w.commit(nlohmann::json::object());
    EXPECT_FALSE(s.ok());
    messages[static_cast<size_t>(comm.rank())] = s.to_string();
  });
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  EXPECT_NE(messages[1].find("shard_00001.safetensors.tmp: write failed"), std::string::npos) << messages[1];
  EXPECT_NE(messages[0].find("rank 1 failed to write its shard; nothing was committed"), std::string::npos)
      << messages[0];
  expect_latest(tmp.path(), 10, 1.0f);
  EXPECT_FALSE(fs::exists(tmp.path() + "/iter_0000020"));
}

// The files of one iteration directory, by name: their bytes.
std::map<std::string, std::string> iteration_files(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    files[e.path().filename().string()] = read_bytes(e.path().string());
  return files;
}

// --async-save's commit: the files are byte-identical to commit()'s, the pieces are copied at
// start_commit() (the caller changes its tensors at once), and while the background writer is held
// back nothing names the new checkpoint: no iter_0000020/, the tracker still says 10.
TEST(Checkpoint, AsyncCommitWritesTheSameFilesAndTracksThemOnlyWhenFinished) {
  TempDir sync_dir, async_dir;
  ASSERT_TRUE(save_simple(async_dir.path(), 10, 1.0f).ok());
  const Box flat_box{{3}, {5}};
  Tensor flat = Tensor::empty({5});
  for (int64_t i = 0; i < 5; ++i) flat.data<float>()[i] = 0.25f * static_cast<float>(i);
  const nlohmann::json sections = {{"base", 2.0f}, {"trainer", {{"iteration", 20}}}};
  {
    Comm self = make_self_communicator();
    CheckpointWriter w(sync_dir.path(), 20, *self);
    Tensor t = grid_piece(whole_box({4, 8}), 2.0f);
    ASSERT_TRUE(w.add("w", t).ok());
    ASSERT_TRUE(w.add_flat("optimizer.exp_avg.w", 12, 3, flat).ok());
    ASSERT_TRUE(w.commit(sections).ok());
  }
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  CheckpointWriterOptions options;
  options.before_shard_write = [released] { released.wait(); };
  Comm self = make_self_communicator();
  CheckpointWriter w(async_dir.path(), 20, *self, options);
  Tensor t = grid_piece(whole_box({4, 8}), 2.0f);
  ASSERT_TRUE(w.add("w", t).ok());
  Tensor flat_copy = flat.clone();
  ASSERT_TRUE(w.add_flat("optimizer.exp_avg.w", 12, 3, flat_copy).ok());
  ASSERT_TRUE(w.start_commit(sections).ok());
  t.fill(-1.0f);  // training goes on: the checkpoint must hold the values at start_commit()
  flat_copy.fill(-1.0f);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(w.shard_written());
  EXPECT_FALSE(fs::exists(async_dir.path() + "/iter_0000020"));
  EXPECT_EQ(read_bytes(async_dir.path() + "/latest_checkpointed_iteration.txt"), "10");
  release.set_value();
  for (int i = 0; i < 6000 && !w.shard_written(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(w.shard_written());
  // Written, but not finished: still untracked.
  EXPECT_FALSE(fs::exists(async_dir.path() + "/iter_0000020"));
  EXPECT_EQ(read_bytes(async_dir.path() + "/latest_checkpointed_iteration.txt"), "10");
  Status s = w.finish_commit();
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(read_bytes(async_dir.path() + "/latest_checkpointed_iteration.txt"), "20");
  EXPECT_EQ(iteration_files(async_dir.path() + "/iter_0000020"), iteration_files(sync_dir.path() + "/iter_0000020"));
  expect_latest(async_dir.path(), 20, 2.0f);
  EXPECT_EQ(w.finish_commit().code(), StatusCode::kFailedPrecondition);  // finished once only
}

// Two ranks commit asynchronously: each rank's writer runs on its own thread, the commit's
// collectives stay on the ranks' threads, and the result loads like a synchronous save.
TEST(Checkpoint, AsyncCommitOnTwoRanksIsTheSameAsCommit) {
  TempDir sync_dir, async_dir;
  for (bool async : {false, true}) {
    run_ranks(2, [&](Communicator& comm) {
      CheckpointWriter w(async ? async_dir.path() : sync_dir.path(), 30, comm);
      Box b{{2 * comm.rank(), 0}, {2, 8}};
      Tensor piece = grid_piece(b, 3.0f);
      EXPECT_TRUE(w.add("w", {4, 8}, b.offsets, piece).ok());
      if (!async) {
        EXPECT_TRUE(w.commit({{"base", 3.0f}}).ok());
        return;
      }
      EXPECT_TRUE(w.start_commit({{"base", 3.0f}}).ok());
      piece.fill(0.0f);
      Status s = w.finish_commit();
      EXPECT_TRUE(s.ok()) << "rank " << comm.rank() << ": " << s.to_string();
    });
  }
  expect_latest(async_dir.path(), 30, 3.0f);
  EXPECT_EQ(iteration_files(async_dir.path() + "/iter_0000030"), iteration_files(sync_dir.path() + "/iter_0000030"));
}

// A writer destroyed while its background write runs (an error elsewhere ended the run) waits for
// it and leaves the previous checkpoint the latest.
TEST(Checkpoint, AnUnfinishedAsyncCommitIsNeverTracked) {
  TempDir tmp;
  ASSERT_TRUE(save_simple(tmp.path(), 10, 1.0f).ok());
  {
    Comm self = make_self_communicator();
    CheckpointWriter w(tmp.path(), 20, *self);
    Tensor t = grid_piece(whole_box({4, 8}), 2.0f);
    ASSERT_TRUE(w.add("w", t).ok());
    ASSERT_TRUE(w.start_commit({{"base", 2.0f}}).ok());
  }
  expect_latest(tmp.path(), 10, 1.0f);
  EXPECT_FALSE(fs::exists(tmp.path() + "/iter_0000020"));
}

struct CrashCase {
  CheckpointCommitStep step;
  bool new_visible;  // does a reader see the new checkpoint after stopping here?
};

// Saves iteration 10 (base 1), then iteration 20 (base 2) stopping after `step`; the reader must see
// a complete checkpoint: the old one until the tracker is updated, then the new one.
TEST(Checkpoint, ACrashAtAnyStepLeavesTheLastCheckpointLoadable) {
  const CrashCase cases[] = {
      {CheckpointCommitStep::kShardsWritten, false},    {CheckpointCommitStep::kMetadataWritten, false},
      {CheckpointCommitStep::kRenamedIntoPlace, false}, {CheckpointCommitStep::kTrackerTempWritten, false},
      {CheckpointCommitStep::kTrackerUpdated, true},    {CheckpointCommitStep::kPreviousRemoved, true},
  };
  for (const CrashCase& c : cases) {
    SCOPED_TRACE(checkpoint_commit_step_name(c.step));
    TempDir tmp;
    ASSERT_TRUE(save_simple(tmp.path(), 10, 1.0f).ok());
    CheckpointWriterOptions crash;
    crash.after_step = [&](CheckpointCommitStep s) { return s != c.step; };
    Status s = save_simple(tmp.path(), 20, 2.0f, crash);
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_NE(s.message().find(checkpoint_commit_step_name(c.step)), std::string::npos) << s.message();
    expect_latest(tmp.path(), c.new_visible ? 20 : 10, c.new_visible ? 2.0f : 1.0f);
    // The next save after the "restart" succeeds and cleans up what the crash left.
    ASSERT_TRUE(save_simple(tmp.path(), 20, 3.0f).ok());
    expect_latest(tmp.path(), 20, 3.0f);
    for (const auto& e : fs::directory_iterator(tmp.path())) {
      std::string name = e.path().filename().string();
      EXPECT_TRUE(name == "iter_0000010" || name == "iter_0000020" || name == "latest_checkpointed_iteration.txt" ||
                  name == "latest_checkpointed_iteration.txt.tmp")
          << "left behind: " << name;
    }
  }
}

// Re-saving the same iteration replaces it; a crash at any step leaves the old or the new copy whole,
// both with the atomic swap and with the move-aside fallback.
TEST(Checkpoint, ReplacingAnIterationIsCrashSafe) {
  for (bool exchange : {true, false}) {
    for (CheckpointCommitStep step :
         {CheckpointCommitStep::kShardsWritten, CheckpointCommitStep::kMetadataWritten,
          CheckpointCommitStep::kPreviousMovedAside, CheckpointCommitStep::kRenamedIntoPlace,
          CheckpointCommitStep::kTrackerUpdated, CheckpointCommitStep::kPreviousRemoved}) {
      if (exchange && step == CheckpointCommitStep::kPreviousMovedAside) continue;  // not a step of the swap path
      SCOPED_TRACE(std::string(exchange ? "swap, " : "move aside, ") + checkpoint_commit_step_name(step));
      TempDir tmp;
      ASSERT_TRUE(save_simple(tmp.path(), 10, 1.0f).ok());
      CheckpointWriterOptions crash;
      crash.use_rename_exchange = exchange;
      crash.after_step = [&](CheckpointCommitStep s) { return s != step; };
      EXPECT_FALSE(save_simple(tmp.path(), 10, 2.0f, crash).ok());
      bool new_visible = step == CheckpointCommitStep::kRenamedIntoPlace ||
                         step == CheckpointCommitStep::kTrackerUpdated ||
                         step == CheckpointCommitStep::kPreviousRemoved;
      expect_latest(tmp.path(), 10, new_visible ? 2.0f : 1.0f);
      CheckpointWriterOptions again;
      again.use_rename_exchange = exchange;
      ASSERT_TRUE(save_simple(tmp.path(), 10, 3.0f, again).ok());
      expect_latest(tmp.path(), 10, 3.0f);
      int dirs = 0;
      for (const auto& e : fs::directory_iterator(tmp.path())) dirs += e.is_directory();
      EXPECT_EQ(dirs, 1);
    }
  }
}

TEST(Checkpoint, MissingOrBrokenCheckpointsGiveClearErrors) {
  TempDir tmp;
  // Nothing saved yet.
  StatusOr<CheckpointReader> none = CheckpointReader::open(tmp.path());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(none.status().message(),
            tmp.path() + "/latest_checkpointed_iteration.txt: not found (no checkpoint has been saved in " +
                tmp.path() + ")");
  // A garbled tracker.
  write_bytes(tmp.path() + "/latest_checkpointed_iteration.txt", "12abc\n");
  EXPECT_EQ(
      CheckpointReader::open(tmp.path()).status().message(),
      tmp.path() + "/latest_checkpointed_iteration.txt: expected an iteration number or 'release', found '12abc'");
  // A tracker naming a directory that is not there.
  write_bytes(tmp.path() + "/latest_checkpointed_iteration.txt", "30\n");
  EXPECT_EQ(CheckpointReader::open(tmp.path()).status().code(), StatusCode::kNotFound);

  ASSERT_TRUE(save_simple(tmp.path(), 10, 1.0f).ok());
  std::string it_dir = tmp.path() + "/iter_0000010";
  std::string shard = it_dir + "/shard_00000.safetensors";
  std::string shard_bytes = read_bytes(shard);
  StatusOr<CheckpointReader> r = CheckpointReader::open(tmp.path());
  ASSERT_TRUE(r.ok());
  // Missing tensor, wrong global shape, bad slice.
  StatusOr<Tensor> missing = r->read("decoder.layers.9.mlp.linear_fc1.weight", {4, 8});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "checkpoint " + it_dir + ": no tensor 'decoder.layers.9.mlp.linear_fc1.weight'");
  StatusOr<Tensor> mismatch = r->read("w", {8, 8});
  EXPECT_EQ(mismatch.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(mismatch.status().message(), "checkpoint " + it_dir +
                                             ": tensor 'w' was saved with shape [4, 8] but the model expects [8, 8] "
                                             "(saved with another model configuration?)");

  // Truncated shard: found when opening, naming the file.
  write_bytes(shard, shard_bytes.substr(0, shard_bytes.size() - 10));
  StatusOr<CheckpointReader> truncated = CheckpointReader::open(tmp.path());
  EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(truncated.status().message(), shard + ": " + std::to_string(shard_bytes.size() - 10) +
                                              " bytes on disk but metadata.json records " +
                                              std::to_string(shard_bytes.size()) + " (truncated or overwritten shard)");
  // Same size, one flipped bit in the data: found by the CRC on first read (unless disabled).
  std::string flipped = shard_bytes;
  flipped[flipped.size() - 3] ^= 0x10;
  write_bytes(shard, flipped);
  StatusOr<CheckpointReader> corrupt = CheckpointReader::open(tmp.path());
  ASSERT_TRUE(corrupt.ok());
  StatusOr<Tensor> bad = corrupt->read("w", {4, 8});
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(bad.status().message(), shard + ": CRC-32 does not match metadata.json (corrupt shard)");
  CheckpointReaderOptions no_crc;
  no_crc.verify_checksums = false;
  EXPECT_TRUE(CheckpointReader::open(tmp.path(), no_crc)->read("w", {4, 8}).ok());
  // A deleted shard.
  fs::remove(shard);
  EXPECT_EQ(CheckpointReader::open(tmp.path()).status().message(),
            shard + ": shard listed in metadata.json is missing");
  write_bytes(shard, shard_bytes);
  // No metadata.json: an unfinished save, refused.
  fs::remove(it_dir + "/metadata.json");
  StatusOr<CheckpointReader> incomplete = CheckpointReader::open(tmp.path());
  EXPECT_EQ(incomplete.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(incomplete.status().message(),
            it_dir + ": incomplete checkpoint (no metadata.json: the save did not finish)");
  // Megatron checkpoints are recognised, not misread.
  fs::create_directory(it_dir + "/mp_rank_00");
  EXPECT_EQ(CheckpointReader::open(tmp.path()).status().code(), StatusCode::kUnimplemented);
  fs::remove(it_dir + "/mp_rank_00");
  write_bytes(it_dir + "/metadata.json", R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})");
  EXPECT_EQ(CheckpointReader::open(tmp.path()).status().code(), StatusCode::kUnimplemented);
  // A newer format version.
  write_bytes(it_dir + "/metadata.json",
              R"({"format": "gale-checkpoint", "version": 2, "iteration": 10, "shards": []})");
  EXPECT_EQ(CheckpointReader::open(tmp.path()).status().code(), StatusCode::kUnimplemented);
  // Truncated metadata.json.
  write_bytes(it_dir + "/metadata.json", R"({"format": "gale-checkpoint", "vers)");
  EXPECT_EQ(CheckpointReader::open(tmp.path()).status().code(), StatusCode::kDataLoss);
}

TEST(Checkpoint, PartlySavedTensorsAreReportedWithTheirPieces) {
  TempDir tmp;
  Comm self = make_self_communicator();
  CheckpointWriter w(tmp.path(), 1, *self);
  std::vector<Tensor> keep;
  for (int64_t pr = 0; pr < 2; ++pr)
    for (int64_t pc = 0; pc < 2; ++pc) {
      if (pr == 1 && pc == 1) continue;  // this piece's rank never saved it
      Box b{{pr * 2, pc * 4}, {2, 4}};
      keep.push_back(grid_piece(b, 0.0f));
      ASSERT_TRUE(w.add("w", {4, 8}, b.offsets, keep.back()).ok());
    }
  ASSERT_TRUE(w.commit(nlohmann::json::object()).ok());
  StatusOr<CheckpointReader> r = CheckpointReader::open(tmp.path());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->read_slice("w", {4, 8}, {0, 0}, {4, 4}).ok());  // the covered part still loads
  StatusOr<Tensor> whole = r->read("w", {4, 8});
  EXPECT_EQ(whole.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(whole.status().message(),
            "checkpoint " + tmp.path() +
                "/iter_0000001: tensor 'w' [4, 8]: slice [0:4, 0:8] is only partly saved (24 of 32 "
                "elements; saved pieces: [0:2, 0:4] in shard_00000.safetensors, [0:2, 4:8] in "
                "shard_00000.safetensors, [2:4, 0:4] in shard_00000.safetensors)");
}

TEST(Checkpoint, WriterRejectsInconsistentPieces) {
  TempDir tmp;
  Comm self = make_self_communicator();
  CheckpointWriter w(tmp.path(), 1, *self);
  Tensor p = Tensor::zeros({2, 4});
  EXPECT_TRUE(w.add("w", {4, 8}, {0, 0}, p).ok());
  EXPECT_EQ(w.add("w", {4, 8}, {1, 2}, p).code(), StatusCode::kInvalidArgument);        // overlaps
  EXPECT_EQ(w.add("w", {4, 8}, {3, 0}, p).code(), StatusCode::kInvalidArgument);        // outside
  EXPECT_EQ(w.add("w", {4, 8, 1}, {2, 0, 0}, p).code(), StatusCode::kInvalidArgument);  // rank
  EXPECT_EQ(w.add("w", {6, 8}, {2, 0}, p).code(), StatusCode::kInvalidArgument);        // other global shape
  EXPECT_EQ(w.commit({{"iteration", 5}}).code(), StatusCode::kInvalidArgument);         // reserved section
  EXPECT_FALSE(fs::exists(tmp.path() + "/latest_checkpointed_iteration.txt"));
}

TEST(Checkpoint, ReleaseTrackerAndExplicitIterations) {
  TempDir tmp;
  ASSERT_TRUE(save_simple(tmp.path(), 10, 1.0f).ok());
  ASSERT_TRUE(save_simple(tmp.path(), 20, 2.0f).ok());
  StatusOr<CheckpointReader> older = CheckpointReader::open_iteration(tmp.path(), 10);
  ASSERT_TRUE(older.ok());
  EXPECT_EQ(older->section("base").value().get<float>(), 1.0f);
  fs::rename(tmp.path() + "/iter_0000020", tmp.path() + "/release");
  write_bytes(tmp.path() + "/latest_checkpointed_iteration.txt", "release");
  StatusOr<CheckpointReader> release = CheckpointReader::open(tmp.path());
  ASSERT_TRUE(release.ok()) << release.status().to_string();
  EXPECT_EQ(release->section("base").value().get<float>(), 2.0f);
}

}  // namespace
}  // namespace gale
