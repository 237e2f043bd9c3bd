// Every flag of MindSpeed's feature inventory (tests/data/reference/mindspeed_flags.txt, from
// tools/reference/mindspeed_flags.py) is known to `gale pretrain`: it runs, is accepted with a
// start-up note, or is refused with a one-line reason naming it. And the MindSpeed names that are
// other names of Gale flags, and the band-mask flags mapped onto --sliding-window.
#include <gtest/gtest.h>

#include "flag_inventory.h"
#include "tokenizer/tokenizer.h"

namespace gale {
namespace {

using testing::expect_one_line_error;
using testing::FullCli;
using testing::FlagErrorCase;
using testing::PretrainCli;

TEST(MindSpeedFlags, NoneIsUnknown) {
  const std::vector<std::string> flags = testing::read_flag_list("reference/mindspeed_flags.txt");
  ASSERT_EQ(flags.size(), 225u);
  testing::expect_none_unknown(flags);
}

TEST(MindSpeedFlags, RefusalsNameTheFlagAndWhy) {
  for (const FlagErrorCase& e : std::vector<FlagErrorCase>{
           // Ascend-only features and their sub-flags.
           {{"--hccl-group-buffer", "dp:200;tp:300"}, 1,
            "--hccl-group-buffer: not available in Gale (it sizes Ascend HCCL's buffers"},
           {{"--aiqos-schedule", "{tp:high}"}, 1, "--aiqos-schedule: not available in Gale (it maps traffic"},
           {{"--ai-framework", "mindspore"}, 1, "--ai-framework: not available in Gale (it picks the Python framework"},
           {{"--ttp-dump-dir", "x"}, 1, "--ttp-dump-dir: not available in Gale (it talks to Ascend's MindIO TTP"},
           // Planned features and their sub-flags.
           {{"--adaptive-cp-manually-set-mask-list", "--context-parallel-size", "2", "--context-parallel-algo",
             "adaptive_cp_algo"},
            2, "--adaptive-cp-manually-set-mask-list: not supported yet (MindSpeed takes the mask list"},
           {{"--use-dsa-absorb"}, 1, "--use-dsa-absorb: not supported yet (DSA with MLA's up-projections absorbed"},
           {{"--automated-pipeline-perf"}, 1, "--automated-pipeline-perf: not supported yet"},
           // MindSpeed's FP8 options, with Megatron's, and the profiler's call stacks.
           {{"--te-comparison-with-bf16"}, 1, "--te-comparison-with-bf16: not supported yet (FP8 training options beyond Megatron's emulated FP8 recipes"},
           {{"--profile", "--profile-with-stack"}, 1,
            "--profile-with-stack: not supported yet (Gale's trace records no call stacks"},
           // core_r0.7/r0.8 flags, with what replaced them where something did.
           {{"--enable-zero3"}, 1,
            "--enable-zero3: a flag of MindSpeed's core_r0.7/r0.8 branches that MindSpeed master removed; Gale "
            "follows master (ZeRO-3 is --use-custom-fsdp"},
           {{"--ampipe-degree", "2"}, 1, "--ampipe-degree: a flag of MindSpeed's core_r0.7/r0.8 branches"},
       }) {
    SCOPED_TRACE(e.flags[0]);
    FullCli cli;
    const Status st = cli.parse_minimal(e.flags, e.world);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.message().rfind(e.expected, 0), 0u) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  }
}

TEST(MindSpeedFlags, NoEffectFlagsAreAcceptedWithANote) {
  FullCli cli;
  ASSERT_TRUE(cli.parse_minimal({"--use-cp-send-recv-overlap", "--virtual-optimizer", "6", "5", "4", "3",
                                 "--npu-deterministic", "--tokenizer-not-use-fast"})
                  .ok());
  const std::vector<std::string> n = cli.parser.compat_notices();
  ASSERT_EQ(n.size(), 4u);
  EXPECT_EQ(n[0].rfind("--use-cp-send-recv-overlap: Gale's ring attention always posts", 0), 0u) << n[0];
  EXPECT_EQ(n[1].rfind("--npu-deterministic: ", 0), 0u) << n[1];
  EXPECT_EQ(n[2].rfind("--tokenizer-not-use-fast: ", 0), 0u) << n[2];
  EXPECT_EQ(n[3].rfind("--virtual-optimizer: Gale's optimizer state lives in host memory", 0), 0u) << n[3];
  FullCli none;
  ASSERT_TRUE(none.parse_minimal({}).ok());
  EXPECT_TRUE(none.parser.compat_notices().empty());
  // --virtual-optimizer takes its values, so they do not read as stray arguments; it needs one.
  FullCli bare;
  EXPECT_FALSE(bare.parse_minimal({"--virtual-optimizer"}).ok());
}

TEST(MindSpeedFlags, OtherNamesOfGaleFlags) {
  PretrainCli mla;
  ASSERT_TRUE(mla.parse_minimal({"--multi-head-latent-attention", "--qk-nope-head-dim", "32", "--qk-rope-head-dim", "16",
                                 "--kv-lora-rank", "32", "--v-head-dim", "16", "--position-embedding-type", "rope"})
                  .ok());
  EXPECT_TRUE(mla.args.model.multi_latent_attention);
  EXPECT_EQ(mla.args.model.qk_head_dim, 32);
  EXPECT_EQ(mla.args.model.qk_pos_emb_head_dim, 16);
  EXPECT_TRUE(mla.parser.was_set("--multi-latent-attention"));

  PretrainCli tok;
  const std::string dir = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/llama3_style";
  ASSERT_TRUE(tok.parse({"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
                         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--train-iters", "10", "--lr",
                         "1e-3", "--mock-data", "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", dir})
                  .ok());
  EXPECT_EQ(tok.args.tokenizer.tokenizer_model, dir);
  TokenizerOptions o;
  o.type = tok.args.tokenizer.tokenizer_type;
  o.tokenizer_model = tok.args.tokenizer.tokenizer_model;
  auto built = build_tokenizer(o);
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  EXPECT_EQ((*built)->type(), "HuggingFaceTokenizer");
}

// --pre-tockens P restricts a query at i to the keys i-P .. i: Gale's --sliding-window P+1.
TEST(MindSpeedFlags, BandMaskIsTheSlidingWindow) {
  struct Case {
    std::vector<std::string> flags;
    int64_t window;  // kUnset: full causal attention
  };
  for (const Case& c : std::vector<Case>{
           {{}, kUnset},  // defaults: --sparse-mode 0, --pre-tockens 65536, --next-tockens 0
           {{"--pre-tockens", "7"}, 8},
           {{"--sparse-mode", "4", "--pre-tockens", "3", "--next-tockens", "0"}, 4},
           {{"--sparse-mode", "2", "--pre-tockens", "3"}, kUnset},  // causal modes ignore the band
           {{"--sparse-mode", "3", "--pre-tockens", "3"}, kUnset},
           {{"--pre-tockens", "15"}, kUnset},  // covers all 16 positions
           {{"--pre-tockens", "14"}, 15},
           {{"--pre-tockens", "7", "--sliding-window", "8"}, 8},
           {{"--sparse-mode", "0", "--next-tockens", "5"}, kUnset},  // the causal mask hides later keys
           {{"--attention-mask-type", "causal"}, kUnset},
       }) {
    PretrainCli cli;
    const Status st = cli.parse_minimal(c.flags);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(cli.args.model.sliding_window, c.window) << (c.flags.empty() ? "" : c.flags[0]);
  }
  for (const FlagErrorCase& e : std::vector<FlagErrorCase>{
           {{"--sparse-mode", "1"}, 1, "--sparse-mode 1: not supported (Gale's attention is causal"},
           {{"--sparse-mode", "7"}, 1, "--sparse-mode 7: not supported"},
           {{"--sparse-mode", "4", "--next-tockens", "2"}, 1,
            "--sparse-mode 4 with --next-tockens 2: a query would see later tokens"},
           {{"--pre-tockens", "-1"}, 1, "--pre-tockens and --next-tockens: expected non-negative token counts"},
           {{"--pre-tockens", "7", "--sliding-window", "4"}, 1,
            "--pre-tockens 7 means --sliding-window 8, but --sliding-window 4 is given"},
           {{"--attention-mask-type", "general"}, 1, "--attention-mask-type general: not supported yet"},
           {{"--attention-mask-type", "full"}, 1, "--attention-mask-type: expected causal or general, found 'full'"},
       })
    expect_one_line_error(e);
}

}  // namespace
}  // namespace gale
