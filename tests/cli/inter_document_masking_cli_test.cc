// `gale pretrain --dataloader-inter-document-masking` (Megatron's cu_seqlens of the dataset's
// documents): on documents that each end with one EOD it trains exactly as --reset-attention-mask
// --reset-position-ids; on documents without EODs it still separates them (where
// --reset-attention-mask trains as plain causal attention); at CP 2 it reproduces one process.
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

TEST(GalePretrainInterDocumentMasking, DocumentsOfTheDatasetNotOfTheEods) {
  testing::TempDir tmp;
  const std::string with_eod = tmp.file("eod_text_document"), without = tmp.file("plain_text_document");
  write_short_documents(with_eod, true);
  write_short_documents(without, false);
  auto losses = [&](int np, const std::string& data, std::vector<std::string> extra) {
    test::RunResult r = test::run_with_timeout(short_documents_pretrain(np, data, extra), kMpiEnv, 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<double> l = testing::logged_values(r.output, "lm loss");
    EXPECT_EQ(l.size(), 4u) << r.output;
    return l;
  };
  const std::vector<double> inter = losses(1, with_eod, {"--dataloader-inter-document-masking"});
  EXPECT_EQ(inter, losses(1, with_eod, {"--reset-attention-mask", "--reset-position-ids"}));
  EXPECT_NE(inter, losses(1, with_eod, {})) << "the documents do not change the attention";
  const std::vector<double> plain_inter = losses(1, without, {"--dataloader-inter-document-masking"});
  const std::vector<double> causal = losses(1, without, {});
  EXPECT_EQ(losses(1, without, {"--reset-attention-mask"}), causal) << "no EOD: --reset-attention-mask sees one document";
  ASSERT_EQ(plain_inter.size(), causal.size());
  for (size_t i = 0; i < causal.size(); ++i) EXPECT_NE(plain_inter[i], causal[i]) << "iteration " << i + 1;
  // Context parallelism: the documents are document ids at global positions, as one process.
  const std::vector<double> cp =
      losses(2, without, {"--dataloader-inter-document-masking", "--context-parallel-size", "2"});
  ASSERT_EQ(cp.size(), plain_inter.size());
  for (size_t i = 0; i < cp.size(); ++i) EXPECT_NEAR(cp[i], plain_inter[i], 1e-5 * plain_inter[i]) << i + 1;
}

}  // namespace
}  // namespace gale
