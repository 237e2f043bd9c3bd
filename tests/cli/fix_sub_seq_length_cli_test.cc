// `gale pretrain --reset-attention-mask --fix-sub-seq-length L` (MindSpeed's fixed sub-sequences) on
// packed documents of 3-10 tokens (--seq-length 32): L = 32 is one block per sample, so the run is
// exactly the run without --reset-attention-mask (the documents' EODs no longer cut anything);
// L > 32 keeps the documents (the run of --reset-attention-mask alone, with a notice); L = 8
// attends in blocks of 8, unlike both; at CP 2 that run reproduces one process (the blocks cross
// the load-balanced chunks); without --reset-attention-mask the flag is refused.
#include <gtest/gtest.h>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::kMpiEnv;
using testing::short_documents_pretrain;
using testing::write_short_documents;

TEST(GalePretrainFixSubSeqLength, FixedBlocksReplaceTheDocuments) {
  testing::TempDir tmp;
  const std::string data = tmp.file("docs_text_document");
  write_short_documents(data);
  auto run = [&](int np, std::vector<std::string> extra) {
    test::RunResult r = test::run_with_timeout(short_documents_pretrain(np, data, extra), kMpiEnv, 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r;
  };
  auto losses = [](const test::RunResult& r) { return testing::logged_values(r.output, "lm loss"); };
  const test::RunResult causal = run(1, {});
  const test::RunResult documents = run(1, {"--reset-attention-mask"});
  const test::RunResult whole = run(1, {"--reset-attention-mask", "--fix-sub-seq-length", "32"});
  const test::RunResult longer = run(1, {"--reset-attention-mask", "--fix-sub-seq-length", "40"});
  const test::RunResult blocks = run(1, {"--reset-attention-mask", "--fix-sub-seq-length", "8"});
  ASSERT_EQ(losses(causal).size(), 4u) << causal.output;
  EXPECT_NE(losses(documents), losses(causal)) << "the documents do not change the attention";
  EXPECT_NE(whole.output.find("active: fix-sub-seq-length (key scenarios, level 2)"), std::string::npos)
      << whole.output;
  EXPECT_EQ(losses(whole), losses(causal)) << "L = --seq-length: one block per sample";
  EXPECT_NE(longer.output.find("--fix-sub-seq-length is not active: --fix-sub-seq-length 40 is longer than "
                               "--seq-length 32: the attention blocks stay the documents"),
            std::string::npos)
      << longer.output;
  EXPECT_EQ(losses(longer), losses(documents)) << "L > --seq-length: the documents";
  const std::vector<double> b = losses(blocks), c = losses(causal), d = losses(documents);
  ASSERT_EQ(b.size(), c.size()) << blocks.output;
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_NE(b[i], c[i]) << "iteration " << i + 1;
    EXPECT_NE(b[i], d[i]) << "iteration " << i + 1;
  }
  // Context parallelism: the blocks are document ids at global positions, as one process.
  const test::RunResult cp = run(2, {"--reset-attention-mask", "--fix-sub-seq-length", "8", "--context-parallel-size", "2"});
  const std::vector<double> p = losses(cp);
  ASSERT_EQ(p.size(), b.size()) << cp.output;
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(p[i], b[i], 1e-5 * b[i]) << "iteration " << i + 1;
  // Without --reset-attention-mask there are no blocks to set: refused, naming both flags.
  test::RunResult bare = test::run_with_timeout(short_documents_pretrain(1, data, {"--fix-sub-seq-length", "8"}), kMpiEnv, 120);
  EXPECT_EQ(bare.exit_code, 2) << bare.output;
  EXPECT_NE(bare.output.find("--fix-sub-seq-length 8 sets the blocks of --reset-attention-mask's attention: expected "
                             "--reset-attention-mask"),
            std::string::npos)
      << bare.output;
}

}  // namespace
}  // namespace gale
