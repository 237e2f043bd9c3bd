// `gale pretrain --is-hybrid-model --hybrid-layer-pattern 'M*|-M|*M|M-/*M' --pipeline-model-parallel-size 2`:
// four pipe-delimited segments over two pipeline ranks are two virtual stages per rank (Megatron
// main's select_pipeline_segment: segment k = v·PP + r), run by the interleaved schedule, the MTP
// block on the last virtual chunk; the LM and MTP losses are the one-process run's ("M*-M*MM-/*M").
#include <gtest/gtest.h>

#include "log_line.h"
#include "mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

std::vector<std::string> hybrid(int np, std::vector<std::string> extra) {
  std::vector<std::string> flags = {
      "--is-hybrid-model", "--mamba-state-dim", "16", "--mamba-head-dim", "16", "--mamba-num-groups", "2",
      "--normalization", "RMSNorm", "--position-embedding-type", "none", "--hidden-dropout", "0.1",
      "--lr", "1e-2", "--lr-decay-style", "constant", "--log-interval", "1"};
  return testing::tiny_gpt_pretrain(np, 6, flags, extra);
}

TEST(GalePretrainHybridVirtualStages, InterleavedSegmentsMatchOneProcess) {
  test::RunResult one = test::run_with_timeout(hybrid(1, {"--hybrid-layer-pattern", "M*-M*MM-/*M"}), {}, 600);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  test::RunResult vpp = test::run_with_timeout(
      hybrid(2, {"--hybrid-layer-pattern", "M*|-M|*M|M-/*M", "--pipeline-model-parallel-size", "2"}), testing::kMpiEnv,
      600);
  ASSERT_EQ(vpp.exit_code, 0) << vpp.output;
  for (const char* what : {"lm loss", "mtp_1 loss"}) {
    const std::vector<double> a = testing::logged_values(one.output, what), b = testing::logged_values(vpp.output, what);
    ASSERT_EQ(a.size(), 6u) << what << "\n" << one.output;
    ASSERT_EQ(b.size(), 6u) << what << "\n" << vpp.output;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << what << " of iteration " << i + 1;
  }
}

}  // namespace
}  // namespace gale
