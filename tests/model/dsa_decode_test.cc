// Decoding a DeepSeek sparse attention model with a KvCache (model/kv_cache.h: each layer's keys and
// values and its lightning indexer's keys; model/dsa_indexer.h dsa_indexer_decode): for a tiny DSA
// model whose top-k (4) is well below the sequence, greedy decoding — prompts of 1 to 11 positions,
// one sample or two together, the query latent or none, reference or fused sparse attention — gives
// at every step the tokens and, within 1e-4 relative, the logits of rerunning the whole sequence; a
// cache cloned for a beam continues on its own; the sparse selection matters (a dense top-k gives
// other logits); and the whole-sequence forward `gale evaluate` scores with gives the training
// forward's lm loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "mla_test_config.h"
#include "model/decoding_check.h"
#include "model/kv_cache.h"
#include "train/evaluate_check.h"

namespace gale {
namespace {

constexpr int64_t kTopk = 4;

ModelConfig dsa_decode_config(int64_t q_lora_rank, int64_t topk = kTopk) {
  return testing::dsa_decode_config(q_lora_rank, topk);
}

struct DsaModel {
  DsaModel(const ModelConfig& config, bool fused) : c(config) {
    ops = testing::decoding_ops();
    if (fused) {  // --use-fused-sparse-flash-attention
      ops.dsa_sparse_attention_forward = dsa_sparse_attention_forward_fused;
      ops.dsa_sparse_attention_backward = dsa_sparse_attention_backward_fused;
    }
    model = testing::decoding_model(c, &ops, 11);
  }
  // Greedy decoding of the prompts (equal lengths) for `steps` tokens with a new cache, each step
  // against the whole-sequence forward (testing::greedy_against_full_forward); the cache holds
  // every position but the last token's. Returns the largest relative difference and leaves the
  // sequences in *seqs.
  double greedy_against_full_forward(const std::vector<std::vector<int32_t>>& prompts, int64_t steps,
                                     std::vector<std::vector<int32_t>>* seqs) {
    KvCache cache = make_kv_cache(c, model->partition(), static_cast<int64_t>(prompts.size()), c.max_positions);
    const double worst = testing::greedy_against_full_forward(*model, cache, prompts, steps, seqs);
    EXPECT_EQ(cache.length, static_cast<int64_t>((*seqs)[0].size()) - 1);
    return worst;
  }
  ModelConfig c;
  OpTable ops;
  std::unique_ptr<GPTModel> model;
};

TEST(DsaDecode, CachedGreedyDecodingEqualsTheFullForwardEachStep) {
  for (int64_t q_lora_rank : {6, 0})
    for (bool fused : {false, true}) {
      DsaModel m(dsa_decode_config(q_lora_rank), fused);
      std::vector<std::vector<int32_t>> seqs;
      for (int64_t len : {1, 3, 5, 11}) {  // shorter than, equal to and longer than top-k
        const double worst = m.greedy_against_full_forward({testing::test_prompt(len, m.c.vocab)}, 14, &seqs);
        EXPECT_LT(worst, 1e-4) << "prompt of " << len << ", q latent " << q_lora_rank << ", fused " << fused;
        std::printf("q latent %lld, fused %d, prompt of %lld: largest relative logits difference %.2e\n",
                    static_cast<long long>(q_lora_rank), fused, static_cast<long long>(len), worst);
      }
      // Two samples of 6 together: each picks its own top-k among its own cached positions.
      const double two = m.greedy_against_full_forward({{5, 9, 11, 2, 30, 7}, {23, 1, 8, 8, 20, 21}}, 14, &seqs);
      EXPECT_LT(two, 1e-4) << "two samples, q latent " << q_lora_rank << ", fused " << fused;
      EXPECT_NE(seqs[0], seqs[1]);
    }
}

// The cache holds every layer's indexer keys next to its keys and values, [max_length·B, DI].
TEST(DsaDecode, TheCacheKeepsTheIndexerKeysOfEveryLayer) {
  const ModelConfig c = dsa_decode_config(6);
  const KvCache cache = make_kv_cache(c, single_process_partition(c), 2, 20);
  ASSERT_EQ(cache.layers.size(), 2u);
  ASSERT_EQ(cache.indexer_keys.size(), 2u);
  for (const Tensor& t : cache.indexer_keys) EXPECT_EQ(t.shape(), (Shape{40, 6}));
  ModelConfig dense = c;
  dense.dsa = DsaConfig{};
  EXPECT_TRUE(make_kv_cache(dense, single_process_partition(dense), 2, 20).indexer_keys.empty());
}

// Beam search's branching (train/generate.cc): a cache cloned after the prompt continues with other
// tokens than the original; both give the full forward's logits (the clone's indexer keys are its own).
TEST(DsaDecode, ClonedCachesBranchIndependently) {
  DsaModel m(dsa_decode_config(6), false);
  testing::expect_cloned_caches_branch_independently(*m.model, {4, 17, 23, 9, 1, 30, 3, 12}, 8, 31);
}

// The same weights with a top-k covering every position (dense MLA) give other logits once the
// sequence is longer than the top-k: the decoding test above checks a selection that matters.
TEST(DsaDecode, TheSparseSelectionChangesTheLogits) {
  DsaModel sparse(dsa_decode_config(6), false), dense(dsa_decode_config(6, /*topk=*/32), false);
  ParamBuffer &ps = sparse.model->params(), &pd = dense.model->params();
  ASSERT_EQ(ps.size(), pd.size());
  for (int id = 0; id < ps.size(); ++id) pd.set_param_values(id, ps.param_data(id));
  const std::vector<int32_t> short_seq = testing::test_prompt(kTopk, sparse.c.vocab);
  const std::vector<int32_t> long_seq = testing::test_prompt(20, sparse.c.vocab);
  const std::vector<float> short_dense = testing::full_forward_last_logits(*dense.model, short_seq);
  const std::vector<float> long_dense = testing::full_forward_last_logits(*dense.model, long_seq);
  const double same = testing::logits_rel_diff(testing::full_forward_last_logits(*sparse.model, short_seq).data(),
                                               short_dense);
  const double differs =
      testing::logits_rel_diff(testing::full_forward_last_logits(*sparse.model, long_seq).data(), long_dense);
  EXPECT_LT(same, 1e-5) << "top-k ≥ the sequence: dense";
  EXPECT_GT(differs, 1e-2) << "20 positions, top-4";
  std::printf("sparse against dense logits: %.2e (4 positions), %.2e (20 positions)\n", same, differs);
}

// `gale evaluate --task ppl` scores a document with whole-sequence forwards (no cache): Σ −log p of
// each next token equals the training forward's lm loss sum on the same tokens and labels.
TEST(DsaDecode, EvaluateScoringGivesTheTrainingForwardsLoss) {
  DsaModel d(dsa_decode_config(6), false);
  testing::expect_ppl_scoring_equals_training_loss(&d.model, 25);
}

}  // namespace
}  // namespace gale
