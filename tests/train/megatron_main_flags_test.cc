// Every flag of Megatron-LM main's pretrain_gpt.py parser (tests/data/reference/megatron_flags_main.txt, from
// tools/reference/megatron_flags.py at the commit its header names) is known to `gale pretrain`: it runs, is
// accepted with a start-up note, or is refused in one line naming it and why (train/arguments_megatron_main.cc).
#include <gtest/gtest.h>

#include "flag_inventory.h"

namespace gale {
namespace {

using testing::expect_one_line_error;
using testing::FlagErrorCase;
using testing::FullCli;
using testing::PretrainCli;

TEST(MegatronMainFlags, NoneIsUnknown) {
  const std::vector<std::string> flags = testing::read_flag_list("reference/megatron_flags_main.txt");
  ASSERT_EQ(flags.size(), 400u);
  testing::expect_none_unknown(flags);
}

// A refused flag is named first in its one-line error, with or without values after it.
TEST(MegatronMainFlags, RefusedFlagsNameThemselves) {
  for (const char* flag :
       {"--inference-dynamic-batching-block-size", "--inference-dynamic-batching-prefix-caching",
        "--no-inference-wandb-logging", "--use-legacy-static-engine", "--inprocess-restart",
        "--inprocess-granularity", "--otel-enabled", "--otel-span-groups", "--cuda-graph-modules",
        "--optimizer-cuda-graph", "--use-nccl-ub", "--gtp-remat-reduce-scatter-with-fp32-accumulation",
        "--megatron-fsdp-version", "--outer-dp-sharding-strategy", "--keep-fp8-transpose-cache", "--fp4-param-gather",
        "--te-precision-config-file", "--kitchen-recipe-number", "--object-storage-cache-path"}) {
    for (const std::vector<std::string>& tail : {std::vector<std::string>{}, std::vector<std::string>{"2"}}) {
      PretrainCli cli;
      std::vector<std::string> extra = {flag};
      extra.insert(extra.end(), tail.begin(), tail.end());
      const Status st = cli.parse_minimal(extra);
      ASSERT_FALSE(st.ok()) << flag;
      EXPECT_EQ(st.message().rfind(std::string(flag) + ": not supported yet (", 0), 0u) << st.message();
      EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
    }
  }
}

// The accepted ones run with a start-up note naming them and saying why they change nothing here.
TEST(MegatronMainFlags, NotedFlagsSayWhy) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--enable-experimental"}, "--enable-experimental: Megatron gates only"},
      {{"--dist-ckpt-workers", "4"}, "--dist-ckpt-workers: Gale writes each rank's checkpoint shard"},
      {{"--ckpt-drop-redundant-extra-state"}, "--ckpt-drop-redundant-extra-state: Gale's checkpoints hold no"},
      {{"--disable-msc"}, "--disable-msc: deprecated in Megatron"},
  };
  for (const auto& [argv, note] : cases) {
    PretrainCli cli;
    const Status st = cli.parse_minimal(argv);
    ASSERT_TRUE(st.ok()) << argv[0] << ": " << st.to_string();
    const std::vector<std::string> notes = cli.parser.compat_notices();
    ASSERT_EQ(notes.size(), 1u) << argv[0];
    EXPECT_EQ(notes[0].rfind(note, 0), 0u) << notes[0];
  }
}

// --enable-msc is refused, unless --disable-msc turns it off again (Megatron's legacy semantics).
TEST(MegatronMainFlags, MultiStorageClient) {
  expect_one_line_error({{"--enable-msc"}, 1, "--enable-msc: not supported yet (Megatron's Multi-Storage Client"});
  PretrainCli both;
  EXPECT_TRUE(both.parse_minimal({"--enable-msc", "--disable-msc"}).ok());
}

TEST(MegatronMainFlags, TorchFsdp2NoReshardAfterForward) {
  expect_one_line_error({{"--torch-fsdp2-no-reshard-after-forward"},
                         1,
                         "--torch-fsdp2-no-reshard-after-forward configures FSDP2: expected --use-torch-fsdp2"});
  PretrainCli plain;
  ASSERT_TRUE(plain.parse_minimal({"--use-torch-fsdp2", "--untie-embeddings-and-output-weights"}).ok());
  EXPECT_TRUE(plain.args.parallel.fsdp2_reshard_after_forward);
  PretrainCli zero2;
  const Status st = zero2.parse_minimal(
      {"--use-torch-fsdp2", "--untie-embeddings-and-output-weights", "--torch-fsdp2-no-reshard-after-forward"});
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_FALSE(zero2.args.parallel.fsdp2_reshard_after_forward);
}

TEST(MegatronMainFlags, DumpParamToParamGroupMapRefusals) {
  PretrainCli ok;
  ASSERT_TRUE(ok.parse_minimal({"--dump-param-to-param-group-map", "/tmp/map"}).ok());
  EXPECT_EQ(ok.args.training.dump_param_to_param_group_map, "/tmp/map");
  for (const FlagErrorCase& e : std::vector<FlagErrorCase>{
           {{"--dump-param-to-param-group-map", "m", "--optimizer", "muon"}, 1,
            "--dump-param-to-param-group-map: Megatron writes the map only for --optimizer adam or sgd, found muon"},
           {{"--dump-param-to-param-group-map", "m", "--use-mup"}, 1,
            "--dump-param-to-param-group-map with --use-mup: not supported yet"},
       })
    expect_one_line_error(e);
}

TEST(MegatronMainFlags, FtNumWarmupIters) {
  PretrainCli defaults;
  ASSERT_TRUE(defaults.parse_minimal({}).ok());
  EXPECT_EQ(defaults.args.ft.num_warmup_iters, 5);
  PretrainCli three;
  const Status st = three.parse_minimal({"--enable-ft-package", "--save", "/tmp/x", "--save-interval", "5", "--ft-num-warmup-iters", "3"});
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(three.args.ft.num_warmup_iters, 3);
  expect_one_line_error({{"--ft-num-warmup-iters", "-1"}, 1,
                         "--ft-num-warmup-iters: expected a number of iterations >= 0, found -1"});
}

}  // namespace
}  // namespace gale
