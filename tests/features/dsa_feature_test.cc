// MindSpeed's DeepSeekSparseAttention (--experimental-attention-variant dsa) in the registry:
// implemented (no longer a planned row), level 0; --use-fused-sparse-flash-attention installs the
// fused kernels; MindSpeed's other fusion flags are "not supported yet"; every requirement and
// refusal is an error naming the flags; the indexer flags' own checks (train/arguments_mla.cc).
#include <gtest/gtest.h>

#include "features/resolved_features.h"
#include "train/model_setup.h"

namespace gale {
namespace {

std::vector<std::string> dsa_flags(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--multi-latent-attention", "--qk-layernorm", "--q-lora-rank", "8", "--kv-lora-rank",
                                "8", "--qk-head-dim", "4", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "4",
                                "--attention-dropout", "0", "--experimental-attention-variant", "dsa",
                                "--dsa-indexer-n-heads", "2", "--dsa-indexer-head-dim", "8", "--dsa-indexer-topk", "4"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(DsaFeature, ImplementedAtLevelZeroWithTheFusedSparseAttentionFlag) {
  ResolvedFeatures off({});
  ASSERT_TRUE(off.status.ok()) << off.status.to_string();
  const Feature* f = off.registry->find("experimental-attention-variant");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(off.registry->find("deepseek-sparse-attention"), nullptr);  // the planned row is gone
  EXPECT_FALSE(off.registry->active("experimental-attention-variant"));
  ResolvedFeatures on(dsa_flags());
  ASSERT_TRUE(on.status.ok()) << on.status.to_string();
  EXPECT_TRUE(on.registry->active("experimental-attention-variant"));
  EXPECT_EQ(on.impl("dsa_sparse_attention"), "reference");
  for (const char* level : {"0", "2"}) {
    ResolvedFeatures fused(dsa_flags({"--use-fused-sparse-flash-attention", "--optimization-level", level}));
    ASSERT_TRUE(fused.status.ok()) << fused.status.to_string();
    EXPECT_EQ(fused.impl("dsa_sparse_attention"), "fused");
    EXPECT_EQ(fused.ops.dsa_sparse_attention_forward, &dsa_sparse_attention_forward_fused);
    EXPECT_EQ(fused.ops.dsa_sparse_attention_backward, &dsa_sparse_attention_backward_fused);
  }
  Arguments a = on.args;
  a.model.padded_vocab_size = 128;
  a.model.num_layers = 2;
  a.model.hidden_size = 16;
  a.model.num_attention_heads = 2;
  const ModelConfig c = model_config_from_args(a);
  EXPECT_TRUE(c.dsa.enabled);
  EXPECT_EQ(c.dsa.n_heads, 2);
  EXPECT_EQ(c.dsa.head_dim, 8);
  EXPECT_EQ(c.dsa.topk, 4);
  EXPECT_EQ(c.dsa.loss_coeff, 0.0);  // Megatron's default: no indexer loss
  EXPECT_FALSE(c.dsa.sparse_loss);
}

TEST(DsaFeature, RefusesWhatItDoesNotCover) {
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> expected;  // every piece must be in the message
  };
  auto without = [](const std::string& flag, int values) {
    std::vector<std::string> a = dsa_flags();
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] == flag) {
        a.erase(a.begin() + i, a.begin() + i + 1 + values);
        break;
      }
    return a;
  };
  std::vector<Case> cases = {
      {{"--experimental-attention-variant", "dsa"}, {"--multi-latent-attention"}},
      {without("--qk-layernorm", 0), {"--qk-layernorm", "MindSpeed"}},
      {dsa_flags({"--tensor-model-parallel-size", "2"}), {"--tensor-model-parallel-size 2", "not supported yet"}},
      {dsa_flags({"--context-parallel-size", "2"}), {"--context-parallel-size 2", "not supported yet"}},
      {without("--attention-dropout", 1), {"--attention-dropout 0.1", "not supported yet"}},
      {dsa_flags({"--dsa-indexer-head-dim", "2"}), {"--dsa-indexer-head-dim", "--qk-pos-emb-head-dim"}},
      {dsa_flags({"--use-dsa-absorb"}), {"--use-dsa-absorb", "not supported yet"}},
      {dsa_flags({"--use-fused-lightning-indexer"}), {"--use-fused-lightning-indexer", "not supported yet"}},
      {dsa_flags({"--use-fused-lightning-indexer-kl-loss"}), {"--use-fused-lightning-indexer-kl-loss", "not supported yet"}},
      {{"--use-fused-sparse-flash-attention"}, {"--use-fused-sparse-flash-attention", "--experimental-attention-variant dsa"}},
  };
  for (const Case& c : cases) {
    ResolvedFeatures r(c.flags);
    ASSERT_FALSE(r.status.ok()) << c.expected[0];
    for (const std::string& piece : c.expected) EXPECT_NE(r.status.message().find(piece), std::string::npos)
        << "expected '" << piece << "' in: " << r.status.message();
  }
}

// The indexer flags (validate_all_pretrain_args: train/arguments_mla.cc).
Status validated(const std::vector<std::string>& flags) { return validated_pretrain_args(flags); }

TEST(DsaFeature, IndexerFlagChecks) {
  EXPECT_TRUE(validated(dsa_flags()).ok()) << validated(dsa_flags()).message();
  // Per-token loss without an indexer loss (coefficient 0, the default) runs.
  EXPECT_TRUE(validated(dsa_flags({"--calculate-per-token-loss"})).ok());
  struct Case {
    std::vector<std::string> flags;
    std::string expected;
  };
  const Case cases[] = {
      {{"--dsa-indexer-topk", "4"}, "--dsa-indexer-topk needs --experimental-attention-variant dsa"},
      {{"--experimental-attention-variant", "gdn2"}, "--experimental-attention-variant gdn2 needs --linear-attention-freq"},
      {{"--experimental-attention-variant", "gated_delta_net"},
       "--experimental-attention-variant gdn needs --linear-attention-freq"},
      {{"--experimental-attention-variant", "nsa"}, "expected dsa"},
      {{"--multi-latent-attention", "--experimental-attention-variant", "dsa", "--dsa-indexer-n-heads", "2",
        "--dsa-indexer-head-dim", "8"},
       "--dsa-indexer-topk: expected a positive integer with --experimental-attention-variant dsa, found none"},
      {dsa_flags({"--dsa-indexer-loss-coeff", "-1"}), "--dsa-indexer-loss-coeff: expected a non-negative number"},
      {dsa_flags({"--dsa-indexer-loss-coeff", "0.5", "--calculate-per-token-loss"}),
       "--calculate-per-token-loss with --dsa-indexer-loss-coeff 0.5: not supported yet"},
  };
  for (const Case& c : cases) {
    const Status s = validated(c.flags);
    ASSERT_FALSE(s.ok()) << c.expected;
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace gale
