// The tiny multi-latent-attention model the MLA and DSA tests share.
#pragma once

#include "model/gpt_model.h"
#include "model_test_batches.h"

namespace gale::testing {

// A 2-layer model with MLA: Dn 4, R 4 (Dq 8), Dv 3 (V padded to 8) or 10 (Q/K padded to 10).
inline ModelConfig mla_config(bool llama, int64_t q_lora_rank, bool qk_layernorm, int64_t v_head_dim) {
  ModelConfig c = testing::gradcheck_gpt_config();
  if (llama) use_llama_architecture(c);
  c.mla.enabled = true;
  c.mla.q_lora_rank = q_lora_rank;
  c.mla.kv_lora_rank = 5;
  c.mla.qk_head_dim = 4;
  c.mla.qk_pos_emb_head_dim = 4;
  c.mla.v_head_dim = v_head_dim;
  c.mla.qk_layernorm = qk_layernorm;
  return c;
}

// The 2-layer MLA model (Dn 4, R 4, Dv 3, latent norms; a query latent of `q_lora_rank` or none)
// with a DSA indexer of 2 heads of 6 and top-k `topk`, 32 positions: the DSA decoding tests' model.
inline ModelConfig dsa_decode_config(int64_t q_lora_rank, int64_t topk) {
  ModelConfig c = mla_config(/*llama=*/true, q_lora_rank, /*qk_layernorm=*/true, /*v_head_dim=*/3);
  c.max_positions = 32;
  c.dsa.enabled = true;
  c.dsa.n_heads = 2;
  c.dsa.head_dim = 6;
  c.dsa.topk = topk;
  return c;
}

}  // namespace gale::testing
