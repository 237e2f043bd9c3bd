// --experimental-attention-variant gdn2 (train/arguments_gdn.cc, train/model_setup.cc,
// train/checkpoint_args.cc): in a GPT model it needs --linear-attention-freq and makes those layers
// Gated DeltaNet-2; in a hybrid model it makes the 'G' layers GDN2 (and changes nothing without them);
// the checkpoint args record and restore it; refusals name the flags; conversion refuses it.
#include <gtest/gtest.h>

#include "features/resolved_features.h"  // validated_pretrain_args
#include "model/gated_delta_net.h"
#include "train/checkpoint_args.h"
#include "train/model_setup.h"

namespace gale {
namespace {

const std::vector<std::string> kGdnSizes = {"--swiglu", "--normalization", "RMSNorm", "--linear-num-key-heads", "2",
                                            "--linear-num-value-heads", "4", "--linear-key-head-dim", "8",
                                            "--linear-value-head-dim", "6", "--linear-conv-kernel-dim", "3",
                                            "--ffn-hidden-size", "32"};

// validate_all_pretrain_args of `flags` (one process); on success `args` holds the resolved flags.
struct Validated {
  ArgParser parser{"gale pretrain", "test"};
  Arguments args;
  Status status;
  explicit Validated(std::vector<std::string> flags) {
    add_all_pretrain_args(parser, args);
    flags.insert(flags.begin(), "gale");
    std::vector<char*> ptrs;
    for (auto& f : flags) ptrs.push_back(f.data());
    status = parser.parse(static_cast<int>(ptrs.size()), ptrs.data());
    if (status.ok()) status = validate_all_pretrain_args(args, parser, 1);
  }
  ModelConfig config() const {  // the vocabulary padded as the trainer would
    Arguments a = args;
    a.model.padded_vocab_size = 128;
    return model_config_from_args(a);
  }
};

// `flags`, the GDN sizes, then `after` (which overrides them).
std::vector<std::string> with_sizes(std::vector<std::string> flags, const std::vector<std::string>& after = {}) {
  flags.insert(flags.end(), kGdnSizes.begin(), kGdnSizes.end());
  flags.insert(flags.end(), after.begin(), after.end());
  return flags;
}

TEST(ArgumentsGdn2, GptLayersAreGatedDeltaNet2) {
  Validated r(with_sizes({"--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2",
                                 "--seq-length", "8", "--max-position-embeddings", "8", "--micro-batch-size", "1",
                                 "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--experimental-attention-variant",
                                 "gdn2", "--linear-attention-freq", "2"}));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const ModelConfig c = r.config();
  EXPECT_TRUE(c.gdn.enabled);
  EXPECT_EQ(c.gdn.pattern, (std::vector<int>{2, 0}));  // 2: a GDN2 layer
  EXPECT_TRUE(GdnDims::of(c).gdn2);
  // gdn stays Gated DeltaNet.
  Validated g(with_sizes({"--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2",
                                 "--seq-length", "8", "--max-position-embeddings", "8", "--micro-batch-size", "1",
                                 "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--experimental-attention-variant",
                                 "gdn", "--linear-attention-freq", "2"}));
  ASSERT_TRUE(g.status.ok()) << g.status.to_string();
  EXPECT_EQ(g.config().gdn.pattern, (std::vector<int>{1, 0}));
  EXPECT_FALSE(GdnDims::of(g.config()).gdn2);
}

TEST(ArgumentsGdn2, HybridGLayersAreGatedDeltaNet2) {
  auto hybrid = [](const char* pattern, std::vector<std::string> more) {
    std::vector<std::string> flags = {"--num-layers", "4", "--hidden-size", "16", "--num-attention-heads", "2",
                                      "--seq-length", "8", "--max-position-embeddings", "8", "--micro-batch-size",
                                      "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--is-hybrid-model",
                                      "--hybrid-override-pattern", pattern, "--experimental-attention-variant", "gdn2",
                                      "--mamba-head-dim", "8", "--mamba-num-groups", "1", "--mamba-state-dim", "8"};
    flags.insert(flags.end(), more.begin(), more.end());
    return flags;
  };
  Validated r(hybrid("G*G-", kGdnSizes));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  ModelConfig c = r.config();
  EXPECT_TRUE(c.gdn.enabled);
  EXPECT_EQ(c.gdn.pattern, (std::vector<int>{2, 0, 2, 0}));
  EXPECT_TRUE(GdnDims::of(c).gdn2);
  // Without 'G' layers the variant changes nothing (as in Megatron).
  Validated m(hybrid("M*M-", {"--swiglu", "--normalization", "RMSNorm", "--ffn-hidden-size", "32"}));
  ASSERT_TRUE(m.status.ok()) << m.status.to_string();
  EXPECT_FALSE(m.config().gdn.enabled);
  // --linear-attention-freq is the GPT pattern's, not the hybrid model's.
  Validated f(hybrid("G*G-", with_sizes({"--linear-attention-freq", "2"})));
  ASSERT_FALSE(f.status.ok());
  EXPECT_NE(f.status.message().find("--linear-attention-freq needs Gated DeltaNet layers ('G') in "
                                    "--hybrid-override-pattern"),
            std::string::npos)
      << f.status.to_string();
}

TEST(ArgumentsGdn2, RefusalsNameTheFlags) {
  struct Case {
    std::vector<std::string> flags;
    std::string expected;
  };
  const Case cases[] = {
      {{"--experimental-attention-variant", "gdn2"}, "--experimental-attention-variant gdn2 needs --linear-attention-freq"},
      {with_sizes({"--experimental-attention-variant", "gdn2", "--linear-attention-freq", "2", "--lora-target-modules",
                   "in_proj", "--lora-r", "4"}),
       "--lora-target-modules in_proj with --experimental-attention-variant gdn2: not supported yet"},
      {{"--experimental-attention-variant", "gdn2", "--linear-attention-freq", "2", "--normalization", "RMSNorm"},
       "--experimental-attention-variant gdn2 needs --swiglu"},
      {with_sizes({"--experimental-attention-variant", "gdn2", "--linear-attention-freq", "2"},
                  {"--linear-num-value-heads", "3"}),
       "--linear-num-value-heads: expected a multiple of --linear-num-key-heads (2), found 3"},
      {{"--experimental-attention-variant", "gdn3"}, "expected dsa, gdn (or gated_delta_net) or gdn2, found gdn3"},
  };
  for (const Case& c : cases) {
    const Status s = validated_pretrain_args(c.flags);
    ASSERT_FALSE(s.ok()) << c.expected;
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s.message();
  }
}

ModelArgs gdn2_args() {
  ModelArgs m;
  m.num_layers = 4;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.swiglu = true;
  m.normalization = "RMSNorm";
  m.experimental_attention_variant = "gdn2";
  m.linear_attention_freq = "2";
  m.linear_attention_pattern = {1, 0, 1, 0};
  m.linear_conv_kernel_dim = 3;
  m.linear_key_head_dim = 8;
  m.linear_value_head_dim = 6;
  m.linear_num_key_heads = 2;
  m.linear_num_value_heads = 4;
  return m;
}

// Megatron's config fields: experimental_attention_variant 'gdn2', the pattern as a list, the sizes.
TEST(ArgumentsGdn2, CheckpointArgsRecordAndRestoreTheVariant) {
  const nlohmann::json args = model_flags_json(gdn2_args());
  EXPECT_EQ(args.at("experimental_attention_variant"), "gdn2");
  EXPECT_EQ(args.at("linear_attention_freq"), (std::vector<int>{1, 0, 1, 0}));
  StatusOr<ModelArgs> back = model_args_from_json(args, "x");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->experimental_attention_variant, "gdn2");
  EXPECT_EQ(back->linear_attention_pattern, (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(back->linear_num_value_heads, 4);
  // A hybrid model's 'G' layers: the variant and the hybrid sizes, no GPT pattern.
  ModelArgs h = gdn2_args();
  h.linear_attention_freq.clear();
  h.linear_attention_pattern.clear();
  h.is_hybrid_model = true;
  h.hybrid_override_pattern = "MG-*";
  h.mamba_state_dim = 16;
  h.mamba_head_dim = 16;
  h.mamba_num_groups = 2;
  const nlohmann::json hargs = model_flags_json(h);
  EXPECT_EQ(hargs.at("experimental_attention_variant"), "gdn2");
  EXPECT_FALSE(hargs.contains("linear_attention_freq"));
  back = model_args_from_json(hargs, "x");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->experimental_attention_variant, "gdn2");
  EXPECT_TRUE(back->is_hybrid_model);
  EXPECT_EQ(back->linear_num_key_heads, 2);
}

TEST(ArgumentsGdn2, ConversionIsRefused) {
  const Status s = refuse_variant_conversion(gdn2_args(), "ckpt/metadata.json");
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("ckpt/metadata.json: a Gated DeltaNet-2 model (args 'experimental_attention_variant' "
                             "\"gdn2\"): conversion to or from Hugging Face's format is not supported yet (no "
                             "Hugging Face architecture holds it; Megatron's torch format does)"),
            std::string::npos)
      << s.to_string();
}

}  // namespace
}  // namespace gale
