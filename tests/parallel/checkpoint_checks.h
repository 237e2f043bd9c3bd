// Checkpoint checks shared by the multi-rank resharding and resume tests (reshard, unaligned linear, tp-2d, Muon, Lion).
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "comm/communicator.h"
#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/checkpointing.h"
#include "train/engine.h"

namespace gale::testing {

// Every parameter this rank holds equals, bit for bit, the checkpoint's tensor of that name.
inline void expect_params_equal_checkpoint(const Engine& engine, const std::string& dir) {
  StatusOr<CheckpointReader> reader = CheckpointReader::open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  for (const auto& chunk : engine.chunks) {
    const ParamBuffer& pb = chunk->params();
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      StatusOr<Tensor> saved = reader->read(s.whole_model_name(), s.global_shape);
      ASSERT_TRUE(saved.ok()) << saved.status().to_string();
      int64_t differ = 0;
      for (int64_t i = 0; i < s.local_numel(); ++i)
        differ += pb.param_data(id)[i] != saved->data<float>()[s.global_index(i)];
      EXPECT_EQ(differ, 0) << s.name;
    }
  }
}

// A directory every rank agrees on (rank 0's pid in the name), for the caller's rank 0 to remove.
inline std::string shared_temp_dir(const Comm& world, const std::string& name) {
  int64_t pid = world->rank() == 0 ? static_cast<int64_t>(::getpid()) : 0;
  pid = world->all_reduce_scalar(pid, ReduceOp::kMax);
  return (std::filesystem::temp_directory_path() / ("gale_" + name + "_" + std::to_string(pid))).string();
}

// Saved with the layout flags `from` after 3 iterations, resumed with `to`: the loaded parameters
// are the saved ones bit for bit, and iterations 4-6 give the uninterrupted single-process run's
// losses and grad norms (1e-5 relative). `run_flags` adds the model flags to a layout's.
inline void expect_checkpoint_moves(
    const std::function<std::vector<std::string>(const std::vector<std::string>&)>& run_flags,
    const std::vector<std::string>& from, const std::vector<std::string>& to, const std::string& name) {
  Comm world = test::world();
  TestRun whole(run_flags({}), make_self_communicator("world"), kTinyVocab);
  whole.train(6);
  const std::string dir = shared_temp_dir(world, name);
  {
    std::vector<std::string> flags = from;
    flags.insert(flags.end(), {"--save", dir, "--save-interval", "3"});
    TestRun first(run_flags(flags), world, kTinyVocab);
    first.train(3);
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(first.losses[i], whole.losses[i], 1e-5 * whole.losses[i]) << i;
    ASSERT_TRUE(save_checkpoint(first.args, *first.engine, first.trainer->state()).ok());
    expect_params_equal_checkpoint(*first.engine, dir);
  }
  std::vector<std::string> flags = to;
  flags.insert(flags.end(), {"--load", dir});
  TestRun resumed(run_flags(flags), world, kTinyVocab);
  bool loaded = false;
  Status st = load_checkpoint(resumed.args, *resumed.engine, resumed.trainer->state(), &loaded);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(loaded);
  EXPECT_EQ(resumed.trainer->state().iteration, 3);
  expect_params_equal_checkpoint(*resumed.engine, dir);
  resumed.train(3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(resumed.losses[i], whole.losses[3 + i], 1e-5 * whole.losses[3 + i]) << "loss of iteration " << 4 + i;
    EXPECT_NEAR(resumed.grad_norms[i], whole.grad_norms[3 + i], 1e-5 * whole.grad_norms[3 + i])
        << "grad norm of iteration " << 4 + i;
  }
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

// Saved after 3 iterations of `flags` on every rank of the world, resumed with the same flags:
// iterations 4-6 give the uninterrupted run's losses and grad norms bit for bit.
inline void expect_resume_bit_exact(const std::vector<std::string>& flags, const std::string& name) {
  const Comm world = test::world();
  TestRun whole(flags, world, kTinyVocab);
  whole.train(6);
  const std::string dir = shared_temp_dir(world, name);
  {
    TestRun first(join({flags, {"--save", dir, "--save-interval", "3"}}), world, kTinyVocab);
    first.train(3);
    ASSERT_TRUE(save_checkpoint(first.args, *first.engine, first.trainer->state()).ok());
  }
  TestRun resumed(join({flags, {"--load", dir}}), world, kTinyVocab);
  bool loaded = false;
  const Status st = load_checkpoint(resumed.args, *resumed.engine, resumed.trainer->state(), &loaded);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(loaded);
  resumed.train(3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed.losses[i], whole.losses[3 + i]) << "loss of iteration " << 4 + i;
    EXPECT_EQ(resumed.grad_norms[i], whole.grad_norms[3 + i]) << "grad norm of iteration " << 4 + i;
  }
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace gale::testing
