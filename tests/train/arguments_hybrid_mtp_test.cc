// A hybrid model's multi-token-prediction depths at the argument level: every layer symbol Gale
// builds (M, G, *, +, -, E) is accepted after '/' as Megatron main's MTP pattern takes them, their
// checks run with the decoder's ('E' needs --num-experts, '+' sets --multi-latent-attention, not
// beside '*', 'G' sized by --linear-*), 'D' is refused; Megatron main's deprecated
// --mtp-hybrid-override-pattern converts to the unified '/' depths or is ignored as Megatron does.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using testing::FlagErrorCase;

std::vector<std::string> layer_pattern(const std::string& pattern, std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--is-hybrid-model", "--hybrid-layer-pattern", pattern, "--mamba-head-dim", "16",
                                    "--mamba-num-groups", "2"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

const std::vector<std::string> kMoe = {"--num-experts", "4", "--moe-router-topk", "2"};
const std::vector<std::string> kGdn = {"--normalization", "RMSNorm", "--swiglu", "--linear-num-key-heads", "2",
                                       "--linear-num-value-heads", "4", "--linear-key-head-dim", "8",
                                       "--linear-value-head-dim", "8"};

TEST(HybridMtpArguments, EveryBuiltSymbolIsAnMtpLayer) {
  testing::PretrainCli moe;  // 'E' only in the MTP depths: the MoE flags apply to them
  Status s = moe.parse_minimal(layer_pattern("M*M*/ME/ME", kMoe));
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(moe.args.model.mtp_num_layers, 2);
  EXPECT_EQ(moe.args.moe.layer_pattern, (std::vector<int>{0, 0, 0, 0}));  // the decoder's

  testing::PretrainCli gdn;  // 'G' only in the MTP depths, at TP 2 (2 key heads)
  s = gdn.parse_minimal(layer_pattern("M*M*/GM", [] {
                          std::vector<std::string> f = kGdn;
                          f.insert(f.end(), {"--tensor-model-parallel-size", "2"});
                          return f;
                        }()),
                        2);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(gdn.args.model.mtp_num_layers, 1);

  testing::PretrainCli mla;  // '+' only in the MTP depths sets --multi-latent-attention (Megatron main)
  s = mla.parse_minimal(layer_pattern("MM-M/+M/+M", {"--position-embedding-type", "rope"}));
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(mla.args.model.multi_latent_attention);
  EXPECT_EQ(mla.args.model.mtp_num_layers, 2);
}

// The model's config: the MTP depths' 'G' and 'E' layers get the GDN mixer and the experts (global
// layers 4.. after the decoder's "M*M*"), also when the decoder has none of them.
TEST(HybridMtpArguments, ModelConfigBuildsTheDepthsLayers) {
  testing::PretrainCli gdn;
  ASSERT_TRUE(gdn.parse_minimal(layer_pattern("M*M*/GM/GM", kGdn)).ok());
  gdn.args.model.padded_vocab_size = 128;  // what data setup sets from the tokenizer
  const ModelConfig g = model_config_from_args(gdn.args);
  EXPECT_EQ(g.hybrid.mtp, "GM");
  EXPECT_TRUE(g.gdn.enabled);
  EXPECT_EQ(g.gdn.pattern, (std::vector<int>{0, 0, 0, 0, 1, 0, 1, 0}));
  testing::PretrainCli moe;
  ASSERT_TRUE(moe.parse_minimal(layer_pattern("M*M*/ME", kMoe)).ok());
  moe.args.model.padded_vocab_size = 128;
  const ModelConfig e = model_config_from_args(moe.args);
  EXPECT_EQ(e.moe.pattern, (std::vector<int>{0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(e.num_moe_layers(), 1);
}

TEST(HybridMtpArguments, MtpLayersAreCheckedWithTheDecoders) {
  for (const FlagErrorCase& e : std::vector<FlagErrorCase>{
           {layer_pattern("M*M*/ME", {}), 1,
            "--hybrid-override-pattern: the MoE layers ('E') of 'M*M*ME' need --num-experts, found no --num-experts"},
           {layer_pattern("M*M*/M*", kMoe), 1,
            "--num-experts with --is-hybrid-model: expected MoE layers ('E') in --hybrid-override-pattern, found none "
            "in 'M*M*M*'"},
           {layer_pattern("M*M*/+M", {}), 1,
            "--multi-latent-attention with --is-hybrid-model: expected the attention layers as multi-latent attention "
            "layers ('+') in --hybrid-override-pattern, found '*' in 'M*M*+M'"},
           {layer_pattern("M*M*/DM", {}), 1,
            "--hybrid-layer-pattern 'M*M*/DM': the DeepSeek sparse attention layers ('D') of the "
            "multi-token-prediction block 'DM': not supported yet"},
           {layer_pattern("M*M*/GM", [] {
              std::vector<std::string> f = kGdn;
              f.insert(f.end(), {"--tensor-model-parallel-size", "4", "--mamba-num-groups", "4"});
              return f;
            }()),
            4,
            "--linear-num-key-heads: expected a multiple of --tensor-model-parallel-size (4: each rank holds 1/TP of "
            "the Gated DeltaNet heads of the 'G' layers), found 2"}})
    testing::expect_one_line_error(e);
}

// Megatron main: with --mtp-num-layers N and a pattern without '/', the legacy MTP pattern becomes
// N '/' depths; without --mtp-num-layers, with a unified pattern, or for a GPT model it is ignored.
TEST(HybridMtpArguments, LegacyMtpPatternConvertsToUnifiedDepths) {
  for (const char* main_flag : {"--hybrid-override-pattern", "--hybrid-layer-pattern"}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal({"--is-hybrid-model", main_flag, "M*M*", "--mamba-head-dim", "16",
                                        "--mamba-num-groups", "2", "--mtp-hybrid-override-pattern", "*M-",
                                        "--mtp-num-layers", "2"});
    ASSERT_TRUE(s.ok()) << main_flag << ": " << s.to_string();
    EXPECT_EQ(cli.args.model.hybrid_override_pattern, "M*M*/*M-/*M-") << main_flag;
    EXPECT_EQ(cli.args.model.num_layers, 4) << main_flag;
    EXPECT_EQ(cli.args.model.mtp_num_layers, 2) << main_flag;
  }
  testing::PretrainCli no_mtp;  // no --mtp-num-layers: nothing to convert
  ASSERT_TRUE(no_mtp.parse_minimal(layer_pattern("M*", {"--mtp-hybrid-override-pattern", "MM"})).ok());
  EXPECT_EQ(no_mtp.args.model.hybrid_override_pattern, "M*");
  EXPECT_EQ(no_mtp.args.model.mtp_num_layers, kUnset);
  testing::PretrainCli unified;  // the unified pattern's depths win
  ASSERT_TRUE(unified.parse_minimal(layer_pattern("M*/M-", {"--mtp-hybrid-override-pattern", "MM", "--mtp-num-layers",
                                                            "1"}))
                  .ok());
  EXPECT_EQ(unified.args.model.hybrid_override_pattern, "M*/M-");
  EXPECT_EQ(unified.args.model.mtp_num_layers, 1);
  testing::PretrainCli gpt;  // a GPT model: Megatron warns and ignores it
  ASSERT_TRUE(gpt.parse_minimal({"--mtp-hybrid-override-pattern", "MM", "--mtp-num-layers", "1",
                                 "--position-embedding-type", "rope"})
                  .ok());
  EXPECT_EQ(gpt.args.model.mtp_num_layers, 1);
  EXPECT_FALSE(gpt.args.model.is_hybrid_model);
  for (const FlagErrorCase& e : std::vector<FlagErrorCase>{
           {{"--is-hybrid-model", "--hybrid-attention-ratio", "0.5", "--mamba-head-dim", "16", "--mamba-num-groups",
             "2", "--mtp-hybrid-override-pattern", "MM", "--mtp-num-layers", "1"},
            1,
            "--mtp-hybrid-override-pattern 'MM' with --mtp-num-layers 1: expected the decoder's pattern in "
            "--hybrid-layer-pattern"},
           {layer_pattern("M*", {"--mtp-hybrid-override-pattern", "M|M", "--mtp-num-layers", "1"}), 1,
            "in the MTP pattern, '|' is not a valid layer symbol"}})
    testing::expect_one_line_error(e);
}

}  // namespace
}  // namespace gale
