// --swap-layer-input on a tiny GPT and a LLaMA-style model (single process): the same losses,
// gradient norms and parameters as the run without it, bit for bit (alone, with --swap-attention,
// bf16, full recomputation of a layer, several micro-batches in flight); the allocator's training
// peak drops by exactly the swapped inputs; the files leave nothing behind; an unusable
// --swap-attention-dir is a start-up error naming it.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "swap_runs.h"

namespace gale {
namespace {

const std::vector<std::string>& kFlags = testing::kActivationSwapFlags;
constexpr int64_t kVocab = testing::kSwapTestVocab;

std::string fresh_dir(const std::string& name) { return testing::fresh_swap_dir("gale_swapinput", name); }

struct InputRun : testing::TestRun {
  explicit InputRun(const std::vector<std::string>& extra)
      : TestRun(testing::join({kFlags, extra}), make_self_communicator("world"), kVocab) {}
};

struct Case {
  const char* name;
  std::vector<std::string> flags;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class SwapLayerInput : public ::testing::TestWithParam<Case> {};

TEST_P(SwapLayerInput, TrainsBitIdenticallyToTheRunWithoutIt) {
  const std::string dir = fresh_dir(GetParam().name);
  InputRun plain(GetParam().flags);
  InputRun swapped(testing::join({GetParam().flags, {"--swap-layer-input", "--swap-attention-dir", dir}}));
  ASSERT_TRUE(swapped.args.training.swap_layer_input);
  testing::expect_trains_bit_identically(plain, swapped, dir);
}

INSTANTIATE_TEST_SUITE_P(
    Models, SwapLayerInput,
    ::testing::Values(
        Case{"gpt", {}}, Case{"gpt_with_swap_attention", {"--swap-attention"}},
        Case{"llama_bf16",
             testing::join({testing::kTinyLlama, {"--num-attention-heads", "4", "--num-query-groups", "2", "--bf16"}})},
        Case{"gpt_full_recompute_first_layer",
             {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"}},
        Case{"gpt_four_microbatches", {"--micro-batch-size", "1"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The allocator's exact peak over training: 6 layers, T = 64 tokens of H = 32 (f32), each layer's
// input [T, H] = 8 KiB. The peak is in the last layer's backward; by then the inputs of the first
// four layers are in the file (layer 5's is back, layer 4's read ahead), so the peak falls by 4 inputs.
TEST(SwapLayerInputMemory, TrainingPeakDropsByTheSwappedInputs) {
  const std::string dir = fresh_dir("memory");
  const auto [before, after] = testing::training_peaks<InputRun>(
      {"--num-layers", "6"}, {"--swap-layer-input", "--swap-attention-dir", dir});
  const int64_t per_layer = 64 * 32 * 4;
  std::cout << "[ swap-layer-input ] training peak " << before << " -> " << after << " bytes ("
            << before - after << " = " << static_cast<double>(before - after) / per_layer
            << " layer inputs of " << per_layer << " bytes)\n";
  EXPECT_EQ(before - after, 4 * per_layer);
  std::filesystem::remove_all(dir);
}

TEST(SwapLayerInputErrors, UnusableDirectoryIsAStartUpError) {
  const std::string missing = "/nonexistent-gale-swap-dir";
  const std::string m = testing::engine_build_error(
      testing::join({kFlags, {"--swap-layer-input", "--swap-attention-dir", missing}}), kVocab);
  EXPECT_NE(m.find("--swap-attention-dir " + missing), std::string::npos) << m;
}

}  // namespace
}  // namespace gale
