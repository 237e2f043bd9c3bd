// --fake-process-group's arguments: off by default, Megatron's forced --no-check-for-nan-in-loss-and-grad
// and flex refusal, Gale's refusals (train/arguments_fake_process_group.h).
#include "train/arguments_fake_process_group.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pretrain_cli.h"

namespace gale {
namespace {

struct FakeCli : testing::PretrainCli {
  FakeProcessGroupArgs fake;
  FakeCli() { add_fake_process_group_args(parser, fake); }
  // As `gale pretrain`: the fake-process-group checks, then every other validation.
  Status run(const std::vector<std::string>& extra) {
    std::vector<std::string> all = {"gale"};
    const std::vector<std::string> minimal = testing::minimal_pretrain_flags();
    all.insert(all.end(), minimal.begin(), minimal.end());
    all.insert(all.end(), extra.begin(), extra.end());
    std::vector<char*> ptrs;
    for (auto& a : all) ptrs.push_back(a.data());
    GALE_RETURN_IF_ERROR(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()));
    GALE_RETURN_IF_ERROR(validate_fake_process_group(fake, args, parser));
    return validate_all_pretrain_args(args, parser, 1);
  }
};

TEST(FakeProcessGroupArgs, OffByDefaultAndTheNanCheckStays) {
  FakeCli cli;
  ASSERT_TRUE(cli.run({}).ok());
  EXPECT_FALSE(cli.fake.fake_process_group);
  EXPECT_TRUE(cli.args.training.check_for_nan_in_loss_and_grad);
}

TEST(FakeProcessGroupArgs, TurnsTheNanCheckOffAsMegatron) {
  FakeCli cli;
  const Status st = cli.run({"--fake-process-group", "--check-for-nan-in-loss-and-grad"});
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(cli.fake.fake_process_group);
  EXPECT_FALSE(cli.args.training.check_for_nan_in_loss_and_grad);
}

TEST(FakeProcessGroupArgs, Refusals) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--num-experts", "4", "--moe-token-dispatcher-type", "flex"},
       "--fake-process-group with --moe-token-dispatcher-type flex: expected allgather or alltoall (Fake process "
       "group is not supported with flex token dispatcher.)"},
      {{"--save", "/tmp/x"}, "--fake-process-group with --save: expected no checkpoint saving"},
      {{"--pretrained-checkpoint", "/tmp/x"}, "--fake-process-group with --pretrained-checkpoint: not supported yet"},
      {{"--auto-parallel"}, "--fake-process-group with --auto-parallel: not supported yet"},
  };
  for (const auto& [flags, error] : cases) {
    FakeCli cli;
    std::vector<std::string> argv = {"--fake-process-group"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const Status st = cli.run(argv);
    ASSERT_FALSE(st.ok()) << flags[0];
    EXPECT_EQ(st.message().rfind(error, 0), 0u) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace gale
