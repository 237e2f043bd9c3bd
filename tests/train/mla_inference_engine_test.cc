// Batched generation (train/inference_engine.h) of multi-latent attention and DeepSeek sparse
// attention models: static batches and dynamic batching (requests joining mid-flight) give every request, at every step, the logits (within 1e-4 relative) and greedy tokens
// of rerunning its whole sequence — for DSA each request's indexer keys in its blocks and its top-k
// among its own positions (top-k 4, well below the prompts), with reference and fused sparse
// attention; every block comes back.
#include "train/inference_engine.h"

#include <gtest/gtest.h>

#include "model/mla_test_config.h"
#include "train/engine_decoding_check.h"

namespace gale {
namespace {

void no_preparation(GPTModel&) {}

// Prompts of 1 to 25 positions (the models' last position is 31).
const std::vector<int64_t> kLengths = {5, 1, 17, 9, 3, 12, 2, 25, 7};

class MlaEngineTest : public testing::EngineDecodingTest {
 protected:
  void run_static_and_dynamic(const ModelConfig& c, bool fused_sparse) {
    set_up(c, no_preparation, kLengths);
    if (fused_sparse) {  // --use-fused-sparse-flash-attention
      ops_.dsa_sparse_attention_forward = dsa_sparse_attention_forward_fused;
      ops_.dsa_sparse_attention_backward = dsa_sparse_attention_backward_fused;
    }
    for (int64_t batch : {3, 16}) {
      EngineOptions o = options(10);
      o.max_requests = batch;
      StatusOr<EngineResult> r = run_inference_engine(*model_, prompts_, o);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      testing::expect_full_forward_tokens(prompts_, *r, o, check_);
    }
    EngineResult r;
    testing::expect_dynamic_batching_gives_full_forward_tokens(*model_, prompts_, options(10), check_, &r);
  }
};

TEST_F(MlaEngineTest, MultiLatentAttentionGivesTheFullForwardLogitsAndTokens) {
  for (int64_t q_lora_rank : {6, 0}) {
    SCOPED_TRACE("q latent " + std::to_string(q_lora_rank));
    ModelConfig c = testing::mla_config(/*llama=*/true, q_lora_rank, /*qk_layernorm=*/true, /*v_head_dim=*/3);
    c.max_positions = 32;
    run_static_and_dynamic(c, false);
  }
}

TEST_F(MlaEngineTest, SparseAttentionGivesTheFullForwardLogitsAndTokens) {
  for (int64_t q_lora_rank : {6, 0})
    for (bool fused : {false, true}) {
      SCOPED_TRACE("q latent " + std::to_string(q_lora_rank) + ", fused " + std::to_string(fused));
      run_static_and_dynamic(testing::dsa_decode_config(q_lora_rank, /*topk=*/4), fused);
    }
}

// The blocks hold each DSA layer's indexer keys next to its keys and values.
TEST(MlaEngineBlocks, ADsaBlockHoldsTheIndexerKeys) {
  const ModelConfig dsa = testing::dsa_decode_config(6, 4);
  ModelConfig mla = dsa;
  mla.dsa = DsaConfig{};
  const int64_t bytes = KvBlockPool(dsa, single_process_partition(dsa), 4, 1).block_bytes();
  EXPECT_EQ(bytes - KvBlockPool(mla, single_process_partition(mla), 4, 1).block_bytes(),
            2 * 4 * 6 * static_cast<int64_t>(sizeof(float)));  // 2 layers, 4 positions, DI 6
}

}  // namespace
}  // namespace gale
