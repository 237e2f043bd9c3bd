// --swap-attention on a tiny GPT and a LLaMA-style model (single process): the same losses,
// gradient norms and parameters as the run without it, bit for bit, for each --swap-modules set,
// with the reference and the fused kernels (flash attention),
// with full recomputation of some layers and with several micro-batches in flight; the
// allocator's training peak drops; the swap files leave nothing in their directory; an unusable
// --swap-attention-dir is a start-up error naming it.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "kernels/cpu/fused_ops.h"
#include "swap_runs.h"

namespace gale {
namespace {

const std::vector<std::string>& kFlags = testing::kActivationSwapFlags;
constexpr int64_t kVocab = testing::kSwapTestVocab;

std::string fresh_dir(const std::string& name) { return testing::fresh_swap_dir("gale_swapattn", name); }

OpTable ops_with(bool fused) { return testing::swap_test_ops(fused); }

struct AttnRun : testing::TestRun {
  explicit AttnRun(const std::vector<std::string>& extra, bool fused = false)
      : TestRun(testing::join({kFlags, extra}), make_self_communicator("world"), kVocab, {}, ops_with(fused)) {}
};

struct Case {
  const char* name;
  std::vector<std::string> flags;
  bool fused = false;  // fused kernels: flash attention, fused norms
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class SwapAttention : public ::testing::TestWithParam<Case> {};

TEST_P(SwapAttention, TrainsBitIdenticallyToTheRunWithoutIt) {
  const std::string dir = fresh_dir(GetParam().name);
  AttnRun plain(GetParam().flags, GetParam().fused);
  AttnRun swapped(testing::join({GetParam().flags, {"--swap-attention", "--swap-attention-dir", dir}}), GetParam().fused);
  testing::expect_trains_bit_identically(plain, swapped, dir);
}

INSTANTIATE_TEST_SUITE_P(
    Modules, SwapAttention,
    ::testing::Values(
        Case{"gpt_all", {}}, Case{"gpt_self_attention", {"--swap-modules", "self_attention"}},
        Case{"gpt_norms", {"--swap-modules", "input_norm,post_attention_norm"}},
        Case{"llama_bf16",
             testing::join({testing::kTinyLlama, {"--num-attention-heads", "4", "--num-query-groups", "2", "--bf16"}})},
        Case{"llama_fused_kernels",
             testing::join({testing::kTinyLlama, {"--num-attention-heads", "4", "--num-query-groups", "2"}}), true},
        Case{"gpt_full_recompute_first_layer",
             {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"}},
        Case{"gpt_four_microbatches", {"--micro-batch-size", "1"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The allocator's exact peak over training falls: the swapped tensors of the layers whose backward
// has not come yet are in the file, not in memory. At the peak (the last layer's backward) all but
// two of the 6 layers (that one, and the one being read ahead) are out.
TEST(SwapAttentionMemory, TrainingPeakDrops) {
  const std::string dir = fresh_dir("memory");
  const auto [before, after] = testing::training_peaks<AttnRun>(
      {"--num-layers", "6"}, {"--swap-attention", "--swap-attention-dir", dir});
  // Per layer the GPT layer keeps norm1_out and norm2_out [T, H], qkv [T, 3H], ctx [T, H] (f32)
  // and lse [B, NH, S]: T = 64 tokens, H = 32.
  const int64_t per_layer = 4 * (64 * 32 * 6 + 2 * 4 * 32);
  std::cout << "[ swap-attention ] training peak " << before << " -> " << after << " bytes (" << per_layer
            << " bytes swappable per layer)\n";
  // Exactly: the read-ahead buffers are allocated when the prefetch starts, not when its thread runs.
  EXPECT_EQ(before - after, 4 * per_layer);
  std::filesystem::remove_all(dir);
}

TEST(SwapAttentionErrors, UnusableDirectoryIsAStartUpError) {
  const std::string missing = "/nonexistent-gale-swap-dir";
  const std::string m =
      testing::engine_build_error(testing::join({kFlags, {"--swap-attention", "--swap-attention-dir", missing}}), kVocab);
  EXPECT_NE(m.find("--swap-attention-dir " + missing), std::string::npos) << m;
  EXPECT_NE(m.find(missing + "/gale-swap-attention-"), std::string::npos) << m;
}

}  // namespace
}  // namespace gale
