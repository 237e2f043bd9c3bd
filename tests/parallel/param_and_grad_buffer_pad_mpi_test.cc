// --param-and-grad-buffer-pad 512 in whole training runs (1 and 2 ranks): every gradient bucket —
// and, with the distributed optimizer, every rank's shard of it — starts at a multiple of 512 bytes
// of the flat buffers, the zeros added are exactly the rule's, get no optimizer state and stay
// zero, and training is bit-identical to the unpadded run (losses, every parameter; gradient norms
// too, except with the distributed optimizer at DP > 1: equal up to rounding) with plain data
// parallelism, the distributed optimizer and overlapped reductions/gathers, --bf16, and PP2 (the
// shared embedding's own bucket); checkpoints hold the same tensors either way and load across
// (padded <-> unpadded) bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_reader.h"
#include "mpi_test_env.h"
#include "optim/optimizer_test_model.h"
#include "testing_checkpoint_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

constexpr int64_t kPadBytes = 512;

struct PadRun : testing::CheckpointRun {
  PadRun(const Comm& world, const std::vector<std::string>& flags, bool pad)
      : CheckpointRun(testing::join({testing::optimizer_test_model("10", "0.1"), flags,
                                     pad ? std::vector<std::string>{"--param-and-grad-buffer-pad", "512"}
                                         : std::vector<std::string>{}}),
                      world, testing::kTinyVocab, EngineOptions{20000, {}}) {}
  const ParamBuffer& pb() const { return engine->chunks[0]->params(); }
};

// Parameter by parameter (same registration order), bit for bit.
void expect_same_parameters(const PadRun& a, const PadRun& b, const std::string& what) {
  finish_param_sync(*a.engine);
  finish_param_sync(*b.engine);
  ASSERT_EQ(a.pb().size(), b.pb().size());
  for (int id = 0; id < a.pb().size(); ++id) {
    const ParamSpec& s = a.pb().spec(id);
    ASSERT_EQ(s.name, b.pb().spec(id).name);
    EXPECT_EQ(std::memcmp(a.pb().param_data(id), b.pb().param_data(id), sizeof(float) * s.local_numel()), 0)
        << what << ": " << s.name;
  }
}

void expect_padding_zero(const ParamBuffer& pb) {
  for (const auto& [at, count] : pb.padding())
    for (int64_t k = at; k < at + count; ++k) {
      ASSERT_EQ(pb.flat_params().data<float>()[k], 0.0f) << "padding element " << k;
      ASSERT_EQ(pb.flat_grads().data<float>()[k], 0.0f) << "padding element " << k;
    }
}

class BufferPad : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(BufferPad, BucketsAlignedAndTrainingBitIdentical) {
  Comm world = test::world();
  const bool pipelined = std::find(GetParam().begin(), GetParam().end(), "--pipeline-model-parallel-size") !=
                         GetParam().end();
  if (pipelined && world->size() != 2) GTEST_SKIP() << "PP2 needs 2 ranks";
  PadRun plain(world, GetParam(), false), padded(world, GetParam(), true);
  const bool sharded = padded.args.parallel.use_distributed_optimizer;
  const DataParallelSync& sync = *padded.engine->dp_sync[0];
  const int64_t dp = sync.dp_size();
  ASSERT_EQ(sync.buckets().size(), plain.engine->dp_sync[0]->buckets().size());
  ASSERT_GT(sync.buckets().size(), 1u);
  int64_t zeros = 0;
  for (const GradBucket& b : sync.buckets()) {
    EXPECT_EQ(b.range.begin * 4 % kPadBytes, 0) << "bucket at element " << b.range.begin;
    EXPECT_EQ(b.numel() * 4 % (sharded ? dp * kPadBytes : kPadBytes), 0) << "bucket of " << b.numel();
    if (sharded)
      for (int64_t r = 0; r < dp; ++r) EXPECT_EQ(bucket_shard(b, dp, r).begin * 4 % kPadBytes, 0) << "shard " << r;
    int64_t held = 0;
    for (int id : b.param_ids) held += padded.pb().spec(id).local_numel();
    const int64_t multiple = (sharded ? dp : 1) * kPadBytes / 4;
    zeros += (held + multiple - 1) / multiple * multiple - held;  // the rule: pad each bucket up
  }
  // Exactly the rule's zeros, nothing else grows.
  EXPECT_EQ(padded.pb().padding_numel(), zeros);
  EXPECT_EQ(padded.pb().numel(), plain.pb().numel() + zeros);
  EXPECT_EQ(plain.pb().padding_numel(), 0);
  // No optimizer state for the zeros: the job's state bytes are unchanged (per rank they shift
  // with the distributed optimizer's shard boundaries).
  EXPECT_EQ(world->all_reduce_scalar(padded.engine->optimizer->state_bytes()),
            world->all_reduce_scalar(plain.engine->optimizer->state_bytes()));
  if (world->rank() == 0)
    std::printf("--param-and-grad-buffer-pad 512 (DP%lld%s, %zu buckets): %lld zero elements = %lld bytes "
                "(values + gradients) on %lld parameters (%.3f%%)\n",
                static_cast<long long>(dp), sharded ? ", distributed optimizer" : "", sync.buckets().size(),
                static_cast<long long>(zeros), static_cast<long long>(8 * zeros),
                static_cast<long long>(plain.pb().numel()), 100.0 * zeros / static_cast<double>(plain.pb().numel()));

  const std::vector<double> a = plain.train(5), b = padded.train(5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(a[i], b[i]) << "loss of iteration " << i + 1;
    // With the distributed optimizer (DP > 1) the norm's partial sums follow the shards, which the
    // padding cuts elsewhere: the same norm up to rounding. Otherwise the same sums in the same order.
    if (sharded && dp > 1)
      EXPECT_NEAR(plain.grad_norms[i], padded.grad_norms[i], 1e-13 * plain.grad_norms[i]) << "iteration " << i + 1;
    else
      EXPECT_EQ(plain.grad_norms[i], padded.grad_norms[i]) << "grad norm of iteration " << i + 1;
  }
  EXPECT_NE(a[0], a[4]);
  expect_same_parameters(plain, padded, "after 5 iterations");
  expect_padding_zero(padded.pb());
}

std::string case_name(const ::testing::TestParamInfo<std::vector<std::string>>& info) {
  static const char* const names[] = {"plain", "overlap", "distopt", "distopt_overlap", "bf16_distopt_overlap",
                                      "pp2_distopt"};
  return names[info.index];
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, BufferPad,
    ::testing::Values(std::vector<std::string>{}, std::vector<std::string>{"--overlap-grad-reduce"},
                      std::vector<std::string>{"--use-distributed-optimizer"},
                      std::vector<std::string>{"--use-distributed-optimizer", "--overlap-grad-reduce",
                                               "--overlap-param-gather"},
                      // the --bf16 GEMM copy follows the padded layout
                      std::vector<std::string>{"--bf16", "--use-distributed-optimizer", "--overlap-grad-reduce",
                                               "--overlap-param-gather"},
                      // the shared embedding's own bucket on each stage (2 ranks: PP2, DP1)
                      std::vector<std::string>{"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}),
    case_name);

// A directory name every rank agrees on (rank 0's pid).
std::string shared_temp_dir(const Comm& world, const std::string& name) {
  int64_t pid = world->rank() == 0 ? static_cast<int64_t>(::getpid()) : 0;
  pid = world->all_reduce_scalar(pid, ReduceOp::kMax);
  return (std::filesystem::temp_directory_path() / ("gale_bufpad_" + name + "_" + std::to_string(pid))).string();
}

std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Saved after the same 3 iterations, the padded and the unpadded run write the same checkpoint (the
// format does not see the padding): the same files byte for byte except the per-rank shard files,
// whose tensors are the same bit for bit (with the distributed optimizer the padding moves the
// shard boundaries, so each rank writes other boxes of the optimizer state); each run loads the
// other's checkpoint bit for bit and continues with the losses of the uninterrupted runs.
TEST(BufferPad, CheckpointsAreTheSameAndLoadAcross) {
  Comm world = test::world();
  const std::vector<std::string> flags = {"--use-distributed-optimizer", "--overlap-grad-reduce"};
  const std::string padded_dir = shared_temp_dir(world, "padded"), plain_dir = shared_temp_dir(world, "plain");
  if (world->rank() == 0) {
    std::filesystem::remove_all(padded_dir);
    std::filesystem::remove_all(plain_dir);
  }
  world->barrier();
  std::vector<double> continued;
  {
    PadRun padded(world, testing::join({flags, {"--save", padded_dir, "--save-interval", "3"}}), true);
    PadRun plain(world, testing::join({flags, {"--save", plain_dir, "--save-interval", "3"}}), false);
    padded.train(3);
    plain.train(3);
    ASSERT_TRUE(padded.save().ok());
    ASSERT_TRUE(plain.save().ok());
    continued = padded.train(2);
    EXPECT_EQ(continued, plain.train(2));
  }
  world->barrier();
  if (world->rank() == 0) {
    int files = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(padded_dir)) {
      if (!e.is_regular_file()) continue;
      const std::filesystem::path other = plain_dir / std::filesystem::relative(e.path(), padded_dir);
      ASSERT_TRUE(std::filesystem::exists(other)) << other;
      // Each rank's shard file holds the optimizer-state boxes of the elements it owns, and the
      // padding moves the shard boundaries: the same tensors, split differently (compared below).
      // metadata.json lists those files' sizes and checksums: everything else in it is the same.
      if (e.path().filename().string().rfind("shard_", 0) == 0) continue;
      if (e.path().filename() == "metadata.json") {
        nlohmann::json ja = nlohmann::json::parse(file_bytes(e.path())), jb = nlohmann::json::parse(file_bytes(other));
        ASSERT_EQ(ja["shards"].size(), jb["shards"].size());
        for (size_t i = 0; i < ja["shards"].size(); ++i)
          for (const char* key : {"crc32", "bytes"}) ja["shards"][i].erase(key), jb["shards"][i].erase(key);
        EXPECT_EQ(ja, jb) << "metadata.json";
        continue;
      }
      EXPECT_TRUE(file_bytes(e.path()) == file_bytes(other)) << "checkpoint file " << e.path() << " differs";
      ++files;
    }
    EXPECT_GT(files, 0);
    auto a = CheckpointReader::open(padded_dir), b = CheckpointReader::open(plain_dir);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->tensor_names(), b->tensor_names());
    for (const std::string& name : a->tensor_names()) {
      auto shape = a->global_shape(name);
      ASSERT_TRUE(shape.ok());
      auto ta = a->read(name, *shape), tb = b->read(name, *shape);
      ASSERT_TRUE(ta.ok() && tb.ok()) << name;
      EXPECT_EQ(std::memcmp(ta->data<float>(), tb->data<float>(), sizeof(float) * ta->numel()), 0)
          << "checkpoint tensor " << name;
    }
    EXPECT_GT(a->tensor_names().size(), 0u);
  }
  for (bool pad : {false, true}) {
    const std::string& dir = pad ? plain_dir : padded_dir;  // each loads the other's
    PadRun loaded(world, testing::join({flags, {"--load", dir}}), pad);
    PadRun source(world, testing::join({flags, {"--load", pad ? padded_dir : plain_dir}}), !pad);
    ASSERT_TRUE(loaded.load().ok());
    ASSERT_TRUE(source.load().ok());
    expect_same_parameters(loaded, source, pad ? "padded run from the unpadded checkpoint"
                                               : "unpadded run from the padded checkpoint");
    expect_padding_zero(loaded.pb());
    EXPECT_EQ(loaded.train(2), continued) << (pad ? "padded <- unpadded" : "unpadded <- padded");
  }
  world->barrier();
  if (world->rank() == 0) {
    std::filesystem::remove_all(padded_dir);
    std::filesystem::remove_all(plain_dir);
  }
}

}  // namespace
}  // namespace gale
