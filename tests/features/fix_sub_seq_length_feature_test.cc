// MindSpeed's --fix-sub-seq-length in the registry: implemented (no longer a planned flag), level 2
// in the key-scenarios module, active with --reset-attention-mask and 0 < L <= --seq-length,
// inactive with its reason when L > --seq-length or below level 2, not requested for L <= 0
// (MindSpeed's default -1), refused without --reset-attention-mask and with an instruction dataset.
// What it changes: tests/data/sample_test.cc and tests/cli/fix_sub_seq_length_cli_test.cc.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

const std::vector<std::string> kSeq = {"--seq-length", "64", "--reset-attention-mask"};

std::vector<std::string> with_seq(std::vector<std::string> flags) {
  flags.insert(flags.end(), kSeq.begin(), kSeq.end());
  return flags;
}

TEST(FixSubSeqLengthFeature, ImplementedLevelTwoKeyScenariosFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("fix-sub-seq-length");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->module(), FeatureModule::kKeyScenarios);
  EXPECT_EQ(f->flag(), "--fix-sub-seq-length");
  EXPECT_EQ(r.args.data.fix_sub_seq_length, -1);  // MindSpeed's default: the documents
  EXPECT_FALSE(r.registry->active("fix-sub-seq-length"));
}

TEST(FixSubSeqLengthFeature, ActiveWithResetAttentionMaskUpToTheSequenceLength) {
  for (const char* L : {"1", "16", "64"}) {
    ResolvedFeatures r(with_seq({"--fix-sub-seq-length", L}));
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("fix-sub-seq-length")) << L;
    EXPECT_TRUE(r.notices.empty()) << L;
  }
}

TEST(FixSubSeqLengthFeature, NonPositiveLengthsAreNotRequests) {
  for (const char* L : {"0", "-1", "-5"}) {
    ResolvedFeatures r(with_seq({"--fix-sub-seq-length", L}));
    ASSERT_TRUE(r.status.ok()) << L << ": " << r.status.to_string();
    EXPECT_FALSE(r.registry->active("fix-sub-seq-length")) << L;
  }
}

TEST(FixSubSeqLengthFeature, LongerThanTheSequenceKeepsTheDocuments) {
  ResolvedFeatures r(with_seq({"--fix-sub-seq-length", "65"}));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("fix-sub-seq-length"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_NE(r.notices[0].find("--fix-sub-seq-length is not active: --fix-sub-seq-length 65 is longer than "
                              "--seq-length 64: the attention blocks stay the documents (as MindSpeed)"),
            std::string::npos)
      << r.notices[0];
}

TEST(FixSubSeqLengthFeature, BelowLevelTwoItSaysWhyItIsInactive) {
  ResolvedFeatures r(with_seq({"--optimization-level", "1", "--fix-sub-seq-length", "8"}));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("fix-sub-seq-length"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_NE(r.notices[0].find("--fix-sub-seq-length is not active: it needs --optimization-level 2 (given 1)"),
            std::string::npos)
      << r.notices[0];
}

TEST(FixSubSeqLengthFeature, Refusals) {
  ResolvedFeatures bare({"--seq-length", "64", "--fix-sub-seq-length", "8"});
  ASSERT_FALSE(bare.status.ok());
  EXPECT_NE(bare.status.message().find("--fix-sub-seq-length 8 sets the blocks of --reset-attention-mask's attention: "
                                       "expected --reset-attention-mask"),
            std::string::npos)
      << bare.status.message();
  ResolvedFeatures sft(with_seq({"--fix-sub-seq-length", "8", "--is-instruction-dataset"}));
  ASSERT_FALSE(sft.status.ok());
  EXPECT_NE(sft.status.message().find("--fix-sub-seq-length with --is-instruction-dataset: not supported (MindSpeed "
                                      "applies it to pretraining samples only)"),
            std::string::npos)
      << sft.status.message();
}

}  // namespace
}  // namespace gale
