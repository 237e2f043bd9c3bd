// `gale pretrain --context-parallel-size 2` under mpirun as a user runs it: the feature reported at
// start-up, the same training and validation losses as one process (fp32 at level 0, bf16 with
// flash attention at level 2, Ulysses), and its flag errors.
#include <gtest/gtest.h>

#include <regex>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::regex_values;
using testing::kMpiEnv;
using testing::launch_argv;

// A tiny LLaMA-style model with dropout and document masks, on `np` ranks (np > 1: under mpirun).
std::vector<std::string> tiny(int np, std::vector<std::string> extra) {
  const std::vector<std::string> pretrain = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--group-query-attention", "--num-query-groups", "2", "--swiglu", "--normalization", "RMSNorm",
      "--position-embedding-type", "rope", "--disable-bias-linear", "--attention-dropout", "0.1", "--hidden-dropout",
      "0.1", "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2",
      "--global-batch-size", "4", "--train-iters", "4", "--lr", "3e-3", "--mock-data", "--vocab-size", "4096",
      "--reset-attention-mask", "--log-interval", "1", "--eval-interval", "2", "--eval-iters", "1",
      "--num-threads", "1"};
  return launch_argv(np, pretrain, extra);
}

// Trains with `flags` on one process and on `cp_size` ranks with --context-parallel-size cp_size
// and `cp_only` added; the logged training and validation losses agree within `tolerance` (relative).
void expect_same_losses(const std::vector<std::string>& flags, double tolerance, int cp_size = 2,
                        const std::vector<std::string>& cp_only = {}) {
  test::RunResult one = test::run_with_timeout(tiny(1, flags), kMpiEnv, 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  std::vector<std::string> cp_flags = flags;
  cp_flags.insert(cp_flags.end(), {"--context-parallel-size", std::to_string(cp_size)});
  cp_flags.insert(cp_flags.end(), cp_only.begin(), cp_only.end());
  test::RunResult cp = test::run_with_timeout(tiny(cp_size, cp_flags), kMpiEnv, 300);
  ASSERT_EQ(cp.exit_code, 0) << cp.output;
  const std::string world = "world " + std::to_string(cp_size) + " = TP 1 x CP " + std::to_string(cp_size) +
                            " x DP 1 x PP 1";
  EXPECT_NE(cp.output.find(world), std::string::npos) << cp.output;
  EXPECT_NE(cp.output.find("active: context-parallel-algo (parallel, level 0)"), std::string::npos) << cp.output;
  for (const char* pattern : {R"(\| lm loss: ([0-9.E+-]+) \|)", R"(\| lm loss value: ([0-9.E+-]+) \|)"}) {
    const std::vector<double> a = regex_values(one.output, pattern), b = regex_values(cp.output, pattern);
    ASSERT_EQ(a.size(), b.size()) << pattern << "\n" << cp.output;
    ASSERT_GE(a.size(), 2u) << pattern << "\n" << one.output;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], tolerance * a[i]) << pattern << " #" << i;
  }
}

TEST(GalePretrainContextParallel, SameLossesAsOneProcess) { expect_same_losses({"--optimization-level", "0"}, 1e-5); }

// --bf16 GEMMs and the level-2 flash attention kernel: bf16 rounding of differently shaped GEMMs
// allows a looser bound (measured: 2e-6).
TEST(GalePretrainContextParallel, Bf16AndFlashAttentionAsOneProcess) {
  expect_same_losses({"--bf16", "--use-flash-attn"}, 1e-4);
}

// --cp-comm-type allgather (the default, p2p, is the ring the tests above run).
TEST(GalePretrainContextParallel, AllGatherSameLossesAsOneProcess) {
  expect_same_losses({"--optimization-level", "0", "--cp-comm-type", "allgather"}, 1e-5);
}

TEST(GalePretrainContextParallel, UlyssesSameLossesAsOneProcess) {
  expect_same_losses({"--optimization-level", "0", "--context-parallel-algo", "ulysses_cp_algo"}, 1e-5);
}

// hybrid_cp_algo on 4 ranks: Ulysses pairs {0, 1}, {2, 3}, rings {0, 2}, {1, 3} (4 heads, 2 query
// groups over U = 2).
TEST(GalePretrainContextParallel, HybridSameLossesAsOneProcess) {
  expect_same_losses({"--optimization-level", "0"}, 1e-5, 4,
                     {"--context-parallel-algo", "hybrid_cp_algo", "--ulysses-degree-in-cp", "2"});
}

// adaptive_cp_algo on 4 ranks: the document-masked batches' layouts (one per micro-batch), their
// empty blocks skipped, on flash attention; the start-up line compares the first layout with
// Megatron's split.
TEST(GalePretrainContextParallel, AdaptiveSameLossesAsOneProcess) {
  expect_same_losses({"--use-flash-attn"}, 1e-5, 4,
                     {"--context-parallel-algo", "adaptive_cp_algo", "--adaptive-cp-dynamic-attn-mask"});
}

// --window-size with --window-attn-skip-freq: every other layer windowed (the query and 6 keys back), the others
// full; the ring's blocks take each layer's own mask.
TEST(GalePretrainContextParallel, PerLayerWindowsSameLossesAsOneProcess) {
  const std::vector<std::string> windows = {"--optimization-level", "0", "--window-size", "6,0",
                                            "--window-attn-skip-freq", "2"};
  expect_same_losses(windows, 1e-5);
  expect_same_losses(windows, 1e-5, 2, {"--context-parallel-algo", "ulysses_cp_algo"});
}

// adaptive_cp_algo on 4 ranks of 8 positions: under the window alone some (query rank, key rank)
// blocks are empty, but the full layers need them, so the layout is the full causal mask's.
TEST(GalePretrainContextParallel, PerLayerWindowsAdaptiveSameLossesAsOneProcess) {
  expect_same_losses({"--optimization-level", "0", "--window-size", "6,0", "--window-attn-skip-freq", "2"}, 1e-5, 4,
                     {"--context-parallel-algo", "adaptive_cp_algo", "--adaptive-cp-dynamic-attn-mask"});
}

TEST(GalePretrainContextParallel, ErrorsNameTheFlags) {
  test::RunResult odd = test::run_with_timeout(tiny(2, {"--context-parallel-size", "2", "--seq-length", "30"}),
                                               kMpiEnv, 120);
  EXPECT_NE(odd.exit_code, 0);
  EXPECT_NE(odd.output.find("gale pretrain: error: --seq-length 30 must be divisible by 2 x --context-parallel-size 2 "
                            "= 4 (each sequence is cut into 2 x CP equal chunks)"),
            std::string::npos)
      << odd.output;
  test::RunResult adaptive = test::run_with_timeout(tiny(1, {"--adaptive-cp-manually-set-mask-list"}), {}, 60);
  EXPECT_EQ(adaptive.exit_code, 2);
  EXPECT_EQ(adaptive.output,
            "gale pretrain: error: --adaptive-cp-manually-set-mask-list applies to --context-parallel-algo "
            "adaptive_cp_algo or hybrid_adaptive_cp_algo with --context-parallel-size > 1, found "
            "--context-parallel-size 1\n");
  test::RunResult hybrid = test::run_with_timeout(tiny(1, {"--context-parallel-algo", "hybrid_cp_algo"}), {}, 60);
  EXPECT_EQ(hybrid.exit_code, 2);
  EXPECT_EQ(hybrid.output,
            "gale pretrain: error: --context-parallel-algo hybrid_cp_algo: expected --ulysses-degree-in-cp U with "
            "1 < U < --context-parallel-size 1 and U dividing it (U = 1 is megatron_cp_algo, U = CP "
            "ulysses_cp_algo), found none\n");
  test::RunResult a2a_p2p = test::run_with_timeout(tiny(1, {"--cp-comm-type", "a2a+p2p"}), {}, 60);
  EXPECT_EQ(a2a_p2p.exit_code, 2);
  EXPECT_EQ(a2a_p2p.output,
            "gale pretrain: error: --hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp "
            "comm\n");
}

}  // namespace
}  // namespace gale
