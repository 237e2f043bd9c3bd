// MindSpeed's QADQuantEngineFeature (--qad-enable) in the registry: implemented (no longer a
// planned row), level 0 (as MindSpeed's), active only with the flag; its requirements and the
// layouts it does not cover yet are errors naming the flags; the KL flags alone need --qad-enable.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

std::vector<std::string> qad(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--qad-enable", "--qad-teacher-load", "/tmp/teacher"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(QadFeature, ImplementedAtLevelZero) {
  ResolvedFeatures off({});
  ASSERT_TRUE(off.status.ok()) << off.status.to_string();
  const Feature* f = off.registry->find("qad-enable");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(f->flag(), "--qad-enable");
  EXPECT_FALSE(off.registry->active("qad-enable"));
  for (const char* level : {"0", "2"}) {
    ResolvedFeatures on(qad({"--optimization-level", level, "--kl-temperature", "2", "--kl-loss-weight", "0.5",
                             "--kl-loss-reduction", "sum"}));
    ASSERT_TRUE(on.status.ok()) << on.status.to_string();
    EXPECT_TRUE(on.registry->active("qad-enable"));
    EXPECT_EQ(on.args.qad.qad_teacher_load, "/tmp/teacher");
    EXPECT_EQ(on.args.qad.kl_temperature, 2.0);
    EXPECT_EQ(on.args.qad.kl_loss_weight, 0.5);
    EXPECT_EQ(on.args.qad.kl_loss_reduction, "sum");
  }
  ResolvedFeatures defaults(qad());
  ASSERT_TRUE(defaults.status.ok()) << defaults.status.to_string();
  EXPECT_EQ(defaults.args.qad.kl_temperature, 1.0);  // MindSpeed's defaults
  EXPECT_EQ(defaults.args.qad.kl_loss_weight, 1.0);
  EXPECT_EQ(defaults.args.qad.kl_loss_reduction, "mean");
  ResolvedFeatures no(qad({"--no-qad-enable"}));
  ASSERT_TRUE(no.status.ok()) << no.status.to_string();
  EXPECT_FALSE(no.registry->active("qad-enable"));
}

TEST(QadFeature, RequirementsAndRefusals) {
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> expected;  // every piece must be in the message
  };
  const std::vector<Case> cases = {
      {{"--qad-enable"}, {"--qad-enable needs --qad-teacher-load", "found none"}},
      {qad({"--kl-loss-reduction", "batchmean"}), {"--kl-loss-reduction", "batchmean"}},
      {qad({"--kl-temperature", "0"}), {"--kl-temperature: expected a positive number, found 0"}},
      {qad({"--kl-temperature", "-1"}), {"--kl-temperature: expected a positive number, found -1"}},
      {qad({"--kl-loss-weight", "-0.5"}), {"--kl-loss-weight: expected a non-negative number, found -0.5"}},
      {qad({"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}),
       {"--num-layers-per-virtual-pipeline-stage", "not supported yet"}},
      {qad({"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"}),
       {"--num-virtual-stages-per-pipeline-rank", "not supported yet"}},
      {qad({"--pipeline-model-parallel-size", "2", "--schedules-method", "dualpipev"}),
       {"--schedules-method dualpipev", "not supported yet"}},
      {qad({"--pipeline-model-parallel-size", "2", "--use-multiparameter-pipeline-model-parallel"}),
       {"--use-multiparameter-pipeline-model-parallel", "not supported yet"}},
      {qad({"--context-parallel-size", "2"}), {"--context-parallel-size 2", "not supported yet"}},
      {qad({"--num-experts", "4"}), {"--num-experts", "not supported yet"}},
      {qad({"--mtp-num-layers", "1"}), {"--mtp-num-layers", "not supported yet"}},
      {qad({"--lora-target-modules", "linear_qkv"}), {"--lora-target-modules", "not supported yet"}},
      {qad({"--stage", "dpo"}), {"--stage dpo", "not supported yet"}},
      {qad({"--fp16"}), {"--fp16", "not supported yet"}},
      {qad({"--calculate-per-token-loss"}), {"--calculate-per-token-loss", "not supported yet"}},
  };
  for (const Case& c : cases) {
    ResolvedFeatures r(c.flags);
    ASSERT_FALSE(r.status.ok()) << c.expected[0];
    for (const std::string& piece : c.expected)
      EXPECT_NE(r.status.message().find(piece), std::string::npos)
          << "expected '" << piece << "' in: " << r.status.message();
  }
}

// The KL flags without --qad-enable (validate_all_pretrain_args: train/arguments_qad.cc).
Status validated(const std::vector<std::string>& flags) { return validated_pretrain_args(flags); }

TEST(QadFeature, KlFlagsNeedQadEnable) {
  EXPECT_TRUE(validated(qad()).ok()) << validated(qad()).message();
  for (const char* flag : {"--qad-teacher-load", "--kl-temperature", "--kl-loss-weight", "--kl-loss-reduction"}) {
    const std::string value = std::string(flag) == "--kl-loss-reduction" ? "sum"
                              : std::string(flag) == "--qad-teacher-load" ? "/tmp/t"
                                                                          : "2";
    const Status st = validated({flag, value});
    EXPECT_FALSE(st.ok()) << flag;
    EXPECT_NE(st.message().find(std::string(flag) + " needs --qad-enable"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace gale
