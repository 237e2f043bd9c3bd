// Shared parts of the swap and compression tests (--swap-attention, --swap-layer-input, --swap-optimizer,
// --compress-*): the tiny model, op tables, scratch directories, bit-identical runs and the start-up error of an engine.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "kernels/cpu/fused_ops.h"
#include "testing_checkpoint_run.h"
#include "train/grad_sync.h"

namespace gale::testing {

// The tiny 3-layer GPT the activation swap/compression tests train (hidden 32, sequence 32, dropout
// 0.1, 4 iterations of 2 micro-batches of 2).
inline const std::vector<std::string> kActivationSwapFlags = {
    "--num-layers", "3", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
    "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4",
    "--lr", "3e-3", "--lr-warmup-iters", "1", "--mock-data", "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
    "--eval-iters", "0", "--log-interval", "1000", "--make-vocab-size-divisible-by", "64"};
// The token ids of these tests' mock data (padded to 64).
constexpr int64_t kSwapTestVocab = 60;

// The reference op table; with every fused kernel (flash attention among them) when `fused`, or with
// only the vectorised AdamW when `fused_adamw`; the best build the CPU has.
inline OpTable swap_test_ops(bool fused, bool fused_adamw = false) {
  OpTable ops = reference_ops();
  if (fused) GALE_CHECK_OK(install_all_fused_kernels(ops, Isa::kAvx512));
  if (fused_adamw && !fused) GALE_CHECK_OK(install_fused_kernel(ops, "adamw", Isa::kAvx512));
  return ops;
}

// <system temp>/<prefix>_<name>_<pid>, emptied; created unless `create` is false.
inline std::string fresh_swap_dir(const std::string& prefix, const std::string& name, bool create = true) {
  auto dir = std::filesystem::temp_directory_path() / (prefix + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  if (create) std::filesystem::create_directories(dir);
  return dir.string();
}

// Trains both runs 4 iterations: losses, grad norms and final parameters equal bit for bit, the
// loss moved, and the swap files were unlinked from `dir`, which is then removed.
inline void expect_trains_bit_identically(TestRun& plain, TestRun& swapped, const std::string& dir) {
  const std::vector<double> a = plain.train(4), b = swapped.train(4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(a[i], b[i]) << "loss of iteration " << i + 1;
    EXPECT_EQ(plain.grad_norms[i], swapped.grad_norms[i]) << "grad norm of iteration " << i + 1;
  }
  EXPECT_NE(a[0], a[3]);  // it trained
  EXPECT_EQ(param_bits(plain), param_bits(swapped));
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the swap files are unlinked";
  std::filesystem::remove_all(dir);
}

// What build_engine reports for the pretrain flags `flags` (one process, `vocab` token ids, the
// reference ops): its error message, or "" when the engine builds. The flags must parse and validate.
inline std::string engine_build_error(const std::vector<std::string>& flags, int64_t vocab) {
  ArgParser parser{"gale pretrain", "test"};
  Arguments args;
  add_all_pretrain_args(parser, args);
  std::vector<std::string> argv = join({{"gale"}, flags});
  std::vector<char*> ptrs;
  for (auto& s : argv) ptrs.push_back(s.data());
  GALE_CHECK_OK(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()));
  GALE_CHECK_OK(validate_all_pretrain_args(args, parser, 1));
  args.model.padded_vocab_size = pad_vocab_size(vocab, args.model.make_vocab_size_divisible_by, 1);
  auto built = build_engine(args, make_self_communicator("world"), reference_ops(), {});
  return built.ok() ? std::string() : built.status().message();
}

// The allocator's peak over 2 training iterations (above what was held before) of Run(flags), then
// of Run(flags + swap_flags), after a warm-up run has allocated the process's statics.
template <class Run>
std::pair<int64_t, int64_t> training_peaks(const std::vector<std::string>& flags,
                                           const std::vector<std::string>& swap_flags) {
  { Run warm({}); }
  Allocator& a = host_allocator();
  const int64_t base = a.current_bytes();
  int64_t peaks[2];
  for (int swap = 0; swap < 2; ++swap) {
    auto run = std::make_unique<Run>(swap ? join({flags, swap_flags}) : flags);
    a.reset_peak();
    run->train(2);
    peaks[swap] = a.peak_bytes() - base;
  }
  return {peaks[0], peaks[1]};
}

}  // namespace gale::testing
