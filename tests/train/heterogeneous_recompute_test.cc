// Heterogeneous layers with selective recomputation (--recompute-modules core_attn / layernorm / mlp,
// --recompute-norm, --recompute-activation-function) and activation swapping (--swap-attention,
// --swap-layer-input): the same losses, gradient norms and parameters as the run without them, bit
// for bit, and a lower allocator peak by at least what the layers of each kind drop.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "swap_runs.h"

namespace gale {
namespace {

// Four layers, one of each kind: 0 one query group and FFN 48; 1 no-op attention, linear MLP;
// 2 linear attention, FFN 40; 3 four query groups (the flags say 2), no-op MLP.
const char* kBlocks = R"({"block_configs": [
  {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_hidden_size": 48}},
  {"attention": {"no_op": true}, "ffn": {"replace_with_linear": true}},
  {"attention": {"replace_with_linear": true}, "ffn": {"ffn_hidden_size": 40}},
  {"attention": {"num_query_groups": 4}, "ffn": {"no_op": true}}]})";

// The swap tests' tiny model (hidden 32, sequence 32, micro-batches of 2: T = 64 tokens, dropout 0.1)
// as a LLaMA (RMSNorm, SwiGLU, RoPE, GQA) with 4 heads of 8 channels in 2 groups.
std::vector<std::string> flags(const std::vector<std::string>& extra) {
  return testing::join({testing::kActivationSwapFlags,
                        {"--num-layers", "4", "--num-attention-heads", "4", "--group-query-attention",
                         "--num-query-groups", "2", "--normalization", "RMSNorm", "--swiglu", "--ffn-hidden-size",
                         "64", "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights",
                         "--heterogeneous-layers-config-encoded-json", kBlocks},
                        extra});
}

// MindSpeed's --recompute-norm [--recompute-norm-num-layers N] and --recompute-activation-function
// [...-num-layers N] are features-manager flags (features/feature_recompute_*.cc): what they install
// into the RecomputePlan is given here directly.
struct Recompute {
  int64_t norm_layers = 0, activation_layers = 0;
};
EngineOptions with(const Recompute& r) {
  EngineOptions o;
  o.recompute.norm_layers = r.norm_layers;
  o.recompute.activation_layers = r.activation_layers;
  return o;
}
constexpr int64_t kAll = RecomputePlan::kAllLayers;

struct HeteroRun : testing::TestRun {
  explicit HeteroRun(const std::vector<std::string>& extra, const Recompute& r = {})
      : TestRun(flags(extra), make_self_communicator("world"), testing::kSwapTestVocab, with(r)) {}
};

std::string fresh_dir(const std::string& name) { return testing::fresh_swap_dir("gale_hetero_swap", name); }

struct Case {
  const char* name;
  std::vector<std::string> flags;
  Recompute recompute = {};
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class HeterogeneousRecompute : public ::testing::TestWithParam<Case> {};

TEST_P(HeterogeneousRecompute, TrainsBitIdenticallyToTheRunWithoutIt) {
  const std::string dir = fresh_dir(GetParam().name);
  HeteroRun plain({});
  HeteroRun other(testing::join({GetParam().flags, {"--swap-attention-dir", dir}}), GetParam().recompute);
  testing::expect_trains_bit_identically(plain, other, dir);
}

INSTANTIATE_TEST_SUITE_P(
    Flags, HeterogeneousRecompute,
    ::testing::Values(
        Case{"mlp", {"--recompute-granularity", "selective", "--recompute-modules", "mlp"}},
        Case{"layernorm", {"--recompute-granularity", "selective", "--recompute-modules", "layernorm"}},
        Case{"core_attn_layernorm_mlp",
             {"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "layernorm", "mlp"}},
        Case{"recompute_norm", {}, {kAll, 0}},
        Case{"recompute_norm_first_two_layers", {}, {2, 0}},
        Case{"recompute_activation_function", {}, {0, kAll}},
        Case{"recompute_activation_function_first_layer", {}, {0, 1}},
        Case{"mlp_and_activation_first_layer", {"--recompute-granularity", "selective", "--recompute-modules", "mlp"},
             {0, 1}},
        Case{"swap_attention", {"--swap-attention"}},
        Case{"swap_attention_norms", {"--swap-attention", "--swap-modules", "input_norm,post_attention_norm"}},
        Case{"swap_layer_input", {"--swap-layer-input"}},
        Case{"swap_attention_with_recompute_mlp",
             {"--swap-attention", "--recompute-granularity", "selective", "--recompute-modules", "mlp"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

constexpr int64_t T = 64, H = 32, kF32 = 4;

// What each flag drops per layer (fp32); the training peak must fall by all of it: the peak comes
// at the output layer, before any layer's backward recomputes, with every layer's state reduced.
int64_t total(const std::vector<int64_t>& per_layer) {
  int64_t sum = 0;
  for (int64_t b : per_layer) sum += b;
  return sum;
}

// A run with this test's RecomputePlan (for the peaks' second run).
template <int64_t kNorm, int64_t kActivation>
struct PlanRun : HeteroRun {
  explicit PlanRun(const std::vector<std::string>& extra) : HeteroRun(extra, {kNorm, kActivation}) {}
};

// The allocator's peak over 2 training iterations (above what was held before) of the plain run,
// then of Run(extra), after a warm-up run has allocated the process's statics (as
// testing::training_peaks, with the second run of another type).
template <class Run>
std::pair<int64_t, int64_t> peaks(const std::vector<std::string>& extra) {
  { HeteroRun warm({}); }
  Allocator& a = host_allocator();
  const int64_t base = a.current_bytes();
  int64_t out[2];
  for (int other = 0; other < 2; ++other) {
    std::unique_ptr<HeteroRun> run =
        other ? std::unique_ptr<HeteroRun>(std::make_unique<Run>(extra)) : std::make_unique<HeteroRun>(std::vector<std::string>{});
    a.reset_peak();
    run->train(2);
    out[other] = a.peak_bytes() - base;
  }
  return {out[0], out[1]};
}

template <class Run = HeteroRun>
void expect_peak_drops(const char* what, const std::vector<std::string>& extra, const std::vector<int64_t>& per_layer) {
  const auto [before, after] = peaks<Run>(extra);
  std::cout << "[ " << what << " ] training peak " << before << " -> " << after << " bytes (drop " << before - after
            << ", at least " << total(per_layer) << ")\n";
  EXPECT_GE(before - after, total(per_layer)) << what;
}

// --recompute-modules mlp: the usual MLPs' fc1 outputs [T, 2F] and activations [T, F] (layers 0 and
// 2); a linear MLP keeps its input either way, a no-op one has nothing.
TEST(HeterogeneousRecomputeMemory, MlpPeakDrops) {
  expect_peak_drops("recompute mlp", {"--recompute-granularity", "selective", "--recompute-modules", "mlp"},
                    {T * 3 * 48 * kF32, 0, T * 3 * 40 * kF32, 0});
}

// --recompute-norm: the norms' outputs [T, H] before each attention or MLP that is not a no-op.
TEST(HeterogeneousRecomputeMemory, NormPeakDrops) {
  expect_peak_drops<PlanRun<kAll, 0>>("recompute norm", {},
                    {2 * T * H * kF32, T * H * kF32, 2 * T * H * kF32, T * H * kF32});
}

// --recompute-activation-function: the SwiGLU outputs [T, F] of layers 0 and 2.
TEST(HeterogeneousRecomputeMemory, ActivationPeakDrops) {
  expect_peak_drops<PlanRun<0, kAll>>("recompute activation", {}, {T * 48 * kF32, 0, T * 40 * kF32, 0});
}

// --swap-attention (its default modules input_norm, self_attention, post_attention_norm): per layer
// the norm outputs [T, H] before the sub-blocks that are not no-ops, the attention's qkv
// [T, (NH + 2·KV)·HD], context [T, NH·HD] and log-sum-exp [B, NH, S]. At the peak (the last layer's
// backward) that layer and the one read ahead are in memory, the first two swapped out: exactly.
TEST(HeterogeneousRecomputeMemory, SwapAttentionPeakDrops) {
  const std::string dir = fresh_dir("memory");
  const auto [before, after] = peaks<HeteroRun>({"--swap-attention", "--swap-attention-dir", dir});
  const int64_t n = T * H * kF32, lse = 2 * 4 * 32 * kF32;
  const int64_t layer0 = n + T * (4 + 2 * 1) * 8 * kF32 + lse + n + n;  // 1 group
  const int64_t layer1 = n;                                           // no-op attention, linear MLP
  std::cout << "[ swap attention ] training peak " << before << " -> " << after << " bytes\n";
  EXPECT_EQ(before - after, layer0 + layer1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
