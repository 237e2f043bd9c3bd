// Parallel invariance of heterogeneous layers with --experimental-attention-variant gdn (Megatron
// main's experimental-attention block spec with each layer's query groups and FFN size): TP 2,
// TP 2 + SP, PP 2, CP 2 (the GDN layers' head all-to-alls, ring attention in the attention layers)
// and DP 2 with the distributed optimizer reproduce the single-process run (losses, grad norms,
// final parameters and gradients, as tests/parallel/gdn_invariance_mpi_test.cc).
#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"dp2_distopt", 2, {"--use-distributed-optimizer"}},
  };
  return all;
}

// Layers 0 and 2 GDN (--linear-attention-freq 2), 1 and 3 attention: 0 FFN 48; 1 two query
// groups, FFN 32; 2 the flags' sizes; 3 the flags' four groups, FFN 64.
const char* kBlocks = R"({"block_configs": [
  {"attention": {}, "ffn": {"ffn_hidden_size": 48}},
  {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_hidden_size": 32}},
  {"attention": {}, "ffn": {}},
  {"attention": {"num_query_groups": 4}, "ffn": {"ffn_hidden_size": 64}}]})";

const std::vector<std::string> kHeteroGdn = {
    "--experimental-attention-variant", "gdn", "--linear-attention-freq", "2", "--linear-num-key-heads", "2",
    "--linear-num-value-heads", "4", "--linear-key-head-dim", "8", "--linear-value-head-dim", "6",
    "--linear-conv-kernel-dim", "3", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
    "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear", "--position-embedding-type", "rope",
    "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
    "--train-iters", "5", "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--heterogeneous-layers-config-encoded-json", kBlocks};

class HeterogeneousGdnInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(HeterogeneousGdnInvariance, MatchesSingleProcess) {
  testing::expect_layout_matches_single_process(layouts(), GetParam(), kHeteroGdn, 3e-5, "linear_fc1.weight");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HeterogeneousGdnInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
