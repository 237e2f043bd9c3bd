// Every flag of Megatron-LM main's RL group (_add_rl_args; tests/data/reference/
// megatron_rl_flags_main.txt from tools/reference/megatron_rl_flags.py) is known to `gale pretrain`:
// it runs, is accepted with a start-up note, or is refused in one line naming it and why.
#include <gtest/gtest.h>

#include "flag_inventory.h"

namespace gale {
namespace {

using testing::FullCli;

TEST(MegatronRlFlags, NoneIsUnknown) {
  const std::vector<std::string> flags = testing::read_flag_list("reference/megatron_rl_flags_main.txt");
  ASSERT_EQ(flags.size(), 52u);
  testing::expect_none_unknown(flags);
}

// The refused ones name themselves and say why; the noted ones say they change nothing here.
TEST(MegatronRlFlags, RefusedAndNotedFlagsSaySo) {
  for (const char* flag : {"--rl-partial-rollouts",
                           "--rl-durable-rollout-bank", "--rl-inference-pipeline-model-parallel-size",
                           "--rl-offload-optimizer-during-inference", "--rl-training-cuda-graphs", "--refit-method",
                           "--rl-profile"}) {
    FullCli cli;
    const Status st = cli.parse_minimal({flag});
    ASSERT_FALSE(st.ok()) << flag;
    EXPECT_EQ(st.message().rfind(std::string(flag) + ": not supported yet (", 0), 0u) << st.message();
  }
  for (const char* flag : {"--use-same-sampling-seed-across-dp-ranks"}) {
    FullCli cli;
    ASSERT_TRUE(cli.parse_minimal({flag}).ok()) << flag;
    const std::vector<std::string> notes = cli.parser.compat_notices();
    ASSERT_EQ(notes.size(), 1u) << flag;
    EXPECT_EQ(notes[0].rfind(std::string(flag) + ": Gale's ", 0), 0u) << notes[0];
  }
}

}  // namespace
}  // namespace gale
