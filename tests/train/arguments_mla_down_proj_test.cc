// --mla-down-proj-fusion's flag: Megatron's name and default (off), the model config it gives, and
// its refusals (Megatron's: MLA, a query latent, latent widths divisible by the TP size; Gale's:
// no FP8 / QAT emulation of the fused GEMM yet), each one line naming the flag.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

TEST(MlaDownProjArguments, OffByDefaultAndIntoTheModelConfig) {
  Cli off;
  ASSERT_TRUE(off.parse_minimal({"--multi-latent-attention", "--q-lora-rank", "8"}).ok());
  EXPECT_FALSE(off.args.model.mla_down_proj_fusion);
  off.args.model.padded_vocab_size = 128;
  EXPECT_FALSE(model_config_from_args(off.args).mla.down_proj_fusion);
  Cli on;
  ASSERT_TRUE(on.parse_minimal({"--multi-latent-attention", "--q-lora-rank", "8", "--mla-down-proj-fusion"}).ok());
  on.args.model.padded_vocab_size = 128;
  EXPECT_TRUE(model_config_from_args(on.args).mla.down_proj_fusion);
  // TP 2 with SP: q_lora_rank 8 and kv_lora_rank 32 + qk_pos_emb_head_dim 64 both divisible.
  Cli tp;
  EXPECT_TRUE(tp.parse_minimal({"--multi-latent-attention", "--q-lora-rank", "8", "--mla-down-proj-fusion",
                                "--tensor-model-parallel-size", "2", "--sequence-parallel"},
                               2)
                  .ok());
}

using Refusal = testing::FlagErrorCase;
class MlaDownProjRefusal : public ::testing::TestWithParam<Refusal> {};
TEST_P(MlaDownProjRefusal, OneLineNamingTheFlag) { testing::expect_one_line_error(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Cases, MlaDownProjRefusal,
    ::testing::Values(
        Refusal{{"--mla-down-proj-fusion"}, 1, "--mla-down-proj-fusion requires --multi-latent-attention"},
        Refusal{{"--multi-latent-attention", "--mla-down-proj-fusion"},
                1,
                "--mla-down-proj-fusion requires --q-lora-rank (Megatron's FusedMLASelfAttention needs q_lora_rank "
                "set), found no --q-lora-rank"},
        Refusal{{"--multi-latent-attention", "--q-lora-rank", "7", "--mla-down-proj-fusion",
                 "--tensor-model-parallel-size", "2"},
                2,
                "q_lora_rank must be divisible by tensor model parallel size when using MLA down projection fusion "
                "(found --q-lora-rank 7, --tensor-model-parallel-size 2)"},
        Refusal{{"--multi-latent-attention", "--q-lora-rank", "8", "--kv-lora-rank", "31", "--mla-down-proj-fusion",
                 "--tensor-model-parallel-size", "2"},
                2,
                "kv_lora_rank + qk_pos_emb_head_dim must be divisible by tensor model parallel size when using MLA "
                "down projection fusion (found --kv-lora-rank 31 + --qk-pos-emb-head-dim 64"},
        Refusal{{"--multi-latent-attention", "--q-lora-rank", "8", "--mla-down-proj-fusion", "--fp8-format", "e4m3",
                 "--bf16"},
                1,
                "--mla-down-proj-fusion with --fp8-format e4m3: not supported yet"},
        Refusal{{"--multi-latent-attention", "--q-lora-rank", "8", "--mla-down-proj-fusion", "--qat-scheme",
                 "w8a16-mxfp8", "--bf16"},
                1,
                "--mla-down-proj-fusion with --qat-scheme w8a16-mxfp8: not supported yet"}));

}  // namespace
}  // namespace gale
