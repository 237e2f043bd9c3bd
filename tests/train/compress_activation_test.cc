// --compress-activation and --compress-dense on tiny models (single process): the same losses,
// gradient norms and parameters as the run without them, bit for bit (GPT, LLaMA-style with bf16,
// fused kernels, MoE with a shared expert, full recomputation of a layer, several micro-batches in
// flight, with --swap-attention); what the model compressed is counted, smaller than it was, and the
// allocator's training peak drops; level1's file leaves nothing behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "kernels/cpu/fused_ops.h"
#include "swap_runs.h"

namespace gale {
namespace {

const std::vector<std::string>& kFlags = testing::kActivationSwapFlags;
constexpr int64_t kVocab = testing::kSwapTestVocab;

OpTable ops_with(bool fused) { return testing::swap_test_ops(fused); }

struct ActRun : testing::TestRun {
  explicit ActRun(const std::vector<std::string>& extra, bool fused = false)
      : TestRun(testing::join({kFlags, extra}), make_self_communicator("world"), kVocab, {}, ops_with(fused)) {}
};

const std::vector<std::string> kLlama =
    testing::join({testing::kTinyLlama, {"--num-attention-heads", "4", "--num-query-groups", "2"}});
const std::vector<std::string> kMoe = {"--num-experts", "4", "--moe-router-topk", "2", "--disable-bias-linear",
                                       "--moe-ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "32"};

struct Case {
  const char* name;
  std::vector<std::string> flags;      // the model
  std::vector<std::string> compress;   // the feature's flags
  bool fused = false;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class CompressActivation : public ::testing::TestWithParam<Case> {};

TEST_P(CompressActivation, TrainsBitIdenticallyToTheRunWithoutIt) {
  const Case& c = GetParam();
  const std::string dir = testing::fresh_swap_dir("gale_compressact", c.name);
  setenv("TMPDIR", dir.c_str(), 1);  // --compress-dense level1's file
  ActRun plain(c.flags, c.fused);
  ActRun packed(testing::join({c.flags, c.compress}), c.fused);
  testing::expect_trains_bit_identically(plain, packed, dir);
  unsetenv("TMPDIR");
  const CompressStats& s = packed.model().activation_compress_stats();
  EXPECT_GT(s.tensors, 0);
  EXPECT_LT(s.stored_bytes, s.raw_bytes);
  std::cout << "[ " << c.name << " ] " << s.tensors << " tensors, " << s.raw_bytes << " -> " << s.stored_bytes
            << " bytes in memory (" << s.file_bytes << " in the file), ratio "
            << double(s.stored_bytes + s.file_bytes) / double(s.raw_bytes) << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Layers, CompressActivation,
    ::testing::Values(
        Case{"gpt_all", {}, {"--compress-activation", "0"}},
        Case{"gpt_layers_1_3", {}, {"--compress-activation", "1,3"}},
        Case{"gpt_layer_2_four_microbatches", {"--micro-batch-size", "1"}, {"--compress-activation", "2-2"}},
        Case{"llama_bf16", testing::join({kLlama, {"--bf16"}}), {"--compress-activation", "0"}},
        Case{"llama_fused_kernels", kLlama, {"--compress-activation", "1-3"}, true},
        Case{"moe_shared_expert", testing::join({kLlama, kMoe}), {"--compress-activation", "0"}},
        Case{"gpt_full_recompute_first_layer",
             {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"},
             {"--compress-activation", "0"}},
        Case{"gpt_with_swap_attention", {"--swap-attention", "--swap-modules", "self_attention"},
             {"--compress-activation", "0"}},
        Case{"dense_level0_gpt", {}, {"--compress-dense", "level0"}},
        Case{"dense_level0_llama_bf16", testing::join({kLlama, {"--bf16"}}), {"--compress-dense", "level0"}},
        Case{"dense_level1_llama", kLlama, {"--compress-dense", "level1"}},
        Case{"dense_level1_moe", testing::join({kLlama, kMoe, {"--moe-layer-freq", "[0,1,1]"}}),
             {"--compress-dense", "level1"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The allocator's peak over training falls: at the peak (the last layer's backward) the other
// layers' saved activations are held compressed. Long sequences, so that activations dominate.
// level0 saves less than the whole layers, level1 more than level0.
TEST(CompressActivationMemory, TrainingPeakDrops) {
  const std::vector<std::string> model = {"--num-layers", "6", "--seq-length", "128", "--max-position-embeddings",
                                          "128"};
  const auto [before, all] = testing::training_peaks<ActRun>(model, {"--compress-activation", "0"});
  const auto [before0, level0] = testing::training_peaks<ActRun>(model, {"--compress-dense", "level0"});
  const auto [before1, level1] = testing::training_peaks<ActRun>(model, {"--compress-dense", "level1"});
  std::cout << "[ compress-activation ] training peak " << before << " -> " << all << " bytes (all layers), "
            << level0 << " (--compress-dense level0), " << level1 << " (level1)\n";
  EXPECT_EQ(before, before0);
  EXPECT_EQ(before, before1);
  EXPECT_LT(all, before - before / 33);  // at least 3% lower
  EXPECT_LT(level0, before);
  EXPECT_LT(level1, level0);
  EXPECT_LT(all, level0);
}

}  // namespace
}  // namespace gale
