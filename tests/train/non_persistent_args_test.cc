// Megatron's non-persistent checkpoint flags: accepted combinations, Megatron's validate_args errors
// (and Gale's own), each one line naming the flag.
#include <gtest/gtest.h>

#include "ckpt/local_checkpoint.h"
#include "pretrain_cli.h"

namespace gale {
namespace {

using testing::expect_one_line_error;
using testing::FlagErrorCase;
using testing::PretrainCli;

const std::vector<std::string> kSave = {"--save", "ckpt", "--save-interval", "100"};

std::vector<std::string> with_save(std::vector<std::string> flags) {
  flags.insert(flags.end(), kSave.begin(), kSave.end());
  return flags;
}

TEST(NonPersistentArgs, AcceptedCombinations) {
  for (const std::vector<std::string>& ok : std::vector<std::vector<std::string>>{
           with_save({"--non-persistent-save-interval", "5", "--non-persistent-ckpt-type", "global"}),
           with_save({"--non-persistent-save-interval", "5", "--non-persistent-ckpt-type", "global",
                      "--non-persistent-global-ckpt-dir", "np"}),
           with_save({"--non-persistent-save-interval", "5", "--non-persistent-ckpt-type", "local",
                      "--non-persistent-local-ckpt-dir", "local", "--non-persistent-local-ckpt-algo", "atomic"}),
           {"--non-persistent-ckpt-type", "local", "--non-persistent-local-ckpt-dir", "local", "--load", "ckpt"}}) {
    PretrainCli cli;
    const Status st = cli.parse_minimal(ok);
    EXPECT_TRUE(st.ok()) << ok[0] << ": " << st.to_string();
  }
  PretrainCli cli;
  ASSERT_TRUE(cli.parse_minimal(with_save({"--non-persistent-save-interval", "5", "--non-persistent-ckpt-type", "local",
                                           "--non-persistent-local-ckpt-dir", "l", "--replication",
                                           "--replication-jump", "2"}),
                                /*world=*/4)
                  .ok());
  EXPECT_EQ(cli.args.checkpoint.non_persistent_local_ckpt_algo, "fully_parallel");  // Megatron's default
  EXPECT_EQ(cli.args.checkpoint.replication_factor, 2);
  // Without --replication the jump is ignored (Megatron's warning).
  PretrainCli ignored;
  ASSERT_TRUE(ignored.parse_minimal({"--replication-jump", "2"}).ok());
  EXPECT_EQ(ignored.args.checkpoint.replication_jump, kUnset);
}

TEST(NonPersistentArgs, MegatronsErrorsAndGalesOwn) {
  const std::vector<std::string> local = {"--non-persistent-ckpt-type", "local", "--non-persistent-local-ckpt-dir", "l"};
  auto local_with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = local;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  for (const FlagErrorCase& e : std::vector<FlagErrorCase>{
           {{"--non-persistent-ckpt-type", "in_memory"}, 1,
            "--non-persistent-ckpt-type in_memory: Currently only global and local checkpoints are supported"},
           {{"--non-persistent-ckpt-type", "ssd"}, 1, "--non-persistent-ckpt-type: ssd not in {global,local,in_memory}"},
           {{"--non-persistent-local-ckpt-algo", "fast"}, 1,
            "--non-persistent-local-ckpt-algo: fast not in {fully_parallel,atomic}"},
           {{"--non-persistent-ckpt-type", "local"}, 1,
            "--non-persistent-ckpt-type local: Tried to use local checkpointing without specifying "
            "--non-persistent-local-ckpt-dir"},
           {local_with({"--replication"}), 1, "--replication requires the value of --replication-jump"},
           {{"--replication", "--replication-jump", "1"}, 1,
            "--replication requires --non-persistent-ckpt-type local, but got: None"},
           {{"--non-persistent-ckpt-type", "global", "--replication", "--replication-jump", "1"}, 1,
            "--replication requires --non-persistent-ckpt-type local, but got: global"},
           {local_with({"--replication", "--replication-jump", "0"}), 2,
            "--replication-jump: expected a positive integer, found 0"},
           {local_with({"--replication", "--replication-jump", "1", "--replication-factor", "0"}), 2,
            "--replication-factor: expected a positive integer, found 0"},
           {local_with({"--replication", "--replication-jump", "2"}), 2,
            "--replication: the world size (2) must be divisible by --replication-jump x --replication-factor (2 x 2 = "
            "4)"},
           {with_save({"--non-persistent-save-interval", "5"}), 1,
            "--non-persistent-save-interval needs --non-persistent-ckpt-type: Please use local or global "
            "non-persistent checkpoints (got: None)"},
           {with_save({"--non-persistent-save-interval", "0", "--non-persistent-ckpt-type", "global"}), 1,
            "--non-persistent-save-interval: expected a positive integer, found 0"},
           {{"--non-persistent-save-interval", "5", "--non-persistent-ckpt-type", "global"}, 1,
            "--non-persistent-save-interval needs --save"},
           {{"--non-persistent-ckpt-type", "global", "--lora-target-modules", "linear_qkv", "--lora-r", "4"}, 1,
            "--non-persistent-ckpt-type global with LoRA (--lora-target-modules): not supported yet"}})
    expect_one_line_error(e);
}

// CliqueReplicationStrategy's groups: n, n+J, ..., n+(F-1)J with n = a·J·F + b.
TEST(NonPersistentArgs, ReplicationCliques) {
  EXPECT_EQ(replication_clique(0, 32, 8, 2), (std::vector<int>{0, 8}));
  EXPECT_EQ(replication_clique(8, 32, 8, 2), (std::vector<int>{0, 8}));
  EXPECT_EQ(replication_clique(19, 32, 8, 2), (std::vector<int>{19, 27}));
  EXPECT_EQ(replication_clique(5, 12, 2, 3), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(replication_clique(6, 12, 2, 3), (std::vector<int>{6, 8, 10}));
  EXPECT_EQ(replication_clique(1, 2, 1, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(local_part_file_name(6, 1), "iter_0000006_1_local.safetensors");
}

}  // namespace
}  // namespace gale
