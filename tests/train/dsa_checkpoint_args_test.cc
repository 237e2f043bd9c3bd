// A DeepSeek sparse attention model's checkpoint args (train/checkpoint_args.h): the indexer's sizes
// come back for --use-checkpoint-args (gale generate / evaluate), checked as the flags are; Megatron's
// None loss coefficient reads as 0; other variants are refused; conversion accepts DSA (not GDN).
#include <gtest/gtest.h>

#include "train/checkpoint_args.h"

namespace gale {
namespace {

ModelArgs dsa_model_args() {
  ModelArgs m;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.multi_latent_attention = true;
  m.q_lora_rank = 24;
  m.kv_lora_rank = 16;
  m.qk_head_dim = 16;
  m.qk_pos_emb_head_dim = 8;
  m.v_head_dim = 16;
  m.qk_layernorm = true;
  m.experimental_attention_variant = "dsa";
  m.dsa_indexer_n_heads = 2;
  m.dsa_indexer_head_dim = 16;
  m.dsa_indexer_topk = 12;
  m.dsa_indexer_loss_coeff = 0.5;
  m.dsa_indexer_use_sparse_loss = true;
  return m;
}

TEST(DsaCheckpointArgs, TheIndexerSizesComeBack) {
  const nlohmann::json args = model_flags_json(dsa_model_args());
  StatusOr<ModelArgs> back = model_args_from_json(args, "x");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->experimental_attention_variant, "dsa");
  EXPECT_EQ(back->dsa_indexer_n_heads, 2);
  EXPECT_EQ(back->dsa_indexer_head_dim, 16);
  EXPECT_EQ(back->dsa_indexer_topk, 12);
  EXPECT_EQ(back->dsa_indexer_loss_coeff, 0.5);
  EXPECT_TRUE(back->dsa_indexer_use_sparse_loss);
  EXPECT_TRUE(back->multi_latent_attention);
  nlohmann::json megatron = args;  // Megatron records --dsa-indexer-loss-coeff's default as None
  megatron["dsa_indexer_loss_coeff"] = nullptr;
  megatron.erase("dsa_indexer_use_sparse_loss");
  back = model_args_from_json(megatron, "x");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->dsa_indexer_loss_coeff, 0.0);
  EXPECT_FALSE(back->dsa_indexer_use_sparse_loss);
}

TEST(DsaCheckpointArgs, BadValuesAreErrorsNamingTheArgs) {
  struct Case {
    void (*edit)(nlohmann::json&);
    const char* expected;
  };
  const Case cases[] = {
      {[](nlohmann::json& a) { a["dsa_indexer_topk"] = 0; },
       "x: args: --dsa-indexer-topk: expected a positive integer with --experimental-attention-variant dsa, found 0"},
      {[](nlohmann::json& a) { a.erase("dsa_indexer_n_heads"); }, "x: args has no 'dsa_indexer_n_heads'"},
      {[](nlohmann::json& a) { a["multi_latent_attention"] = false; },
       "x: args: --experimental-attention-variant dsa needs --multi-latent-attention"},
      {[](nlohmann::json& a) { a["qk_layernorm"] = false; },
       "x: args: --experimental-attention-variant dsa needs --qk-layernorm"},
      {[](nlohmann::json& a) { a["dsa_indexer_head_dim"] = 4; },
       "x: args: --dsa-indexer-head-dim: expected at least --qk-pos-emb-head-dim (8"},
      {[](nlohmann::json& a) { a["experimental_attention_variant"] = "nsa"; },
       "x: an attention variant (args 'experimental_attention_variant' \"nsa\"): generation, evaluation and "
       "conversion are not supported yet"},
  };
  for (const Case& c : cases) {
    nlohmann::json args = model_flags_json(dsa_model_args());
    c.edit(args);
    const StatusOr<ModelArgs> back = model_args_from_json(args, "x");
    ASSERT_FALSE(back.ok()) << c.expected;
    EXPECT_NE(back.status().message().find(c.expected), std::string::npos) << back.status().message();
  }
}

// DSA models convert (Hugging Face's DeepseekV32ForCausalLM, Megatron's formats), and so do Gated DeltaNet
// ones; Gated DeltaNet-2 has no Hugging Face architecture.
TEST(DsaCheckpointArgs, ConversionAcceptsIt) {
  EXPECT_TRUE(refuse_variant_conversion(dsa_model_args(), "ckpt/metadata.json").ok());
  ModelArgs dense = dsa_model_args();
  dense.experimental_attention_variant.clear();
  EXPECT_TRUE(refuse_variant_conversion(dense, "x").ok());
  ModelArgs gdn = dsa_model_args();
  gdn.experimental_attention_variant = "gdn";  // Qwen3-Next and Megatron's torch format
  EXPECT_TRUE(refuse_variant_conversion(gdn, "x").ok());
  gdn.experimental_attention_variant = "gdn2";  // no Hugging Face architecture holds it
  EXPECT_FALSE(refuse_variant_conversion(gdn, "x").ok());
}

}  // namespace
}  // namespace gale
