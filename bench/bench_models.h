// The GPT-2-small and LLaMA-style benchmark models (bench/README.md) and synthetic micro-batches.
//
// Shared by the step benchmarks (model_step_bench, kernels_step_profile_bench); the same shapes
// as bench/train_step.py: 12 layers, H 768, 12 heads of 64, S 256, vocabulary 50304; LLaMA-style
// adds RMSNorm, SwiGLU (F 2048), RoPE, 4 query groups, no biases and an untied output layer.
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "model/gpt_model.h"

namespace gale::bench {

inline ModelConfig gpt2_small(bool llama = false, float dropout = 0.0f) {
  ModelConfig c;
  c.num_layers = 12;
  c.hidden = 768;
  c.heads = 12;
  c.kv_heads = llama ? 4 : 12;
  c.head_dim = 64;
  c.ffn = llama ? 2048 : 3072;
  c.vocab = 50304;
  c.seq_length = 256;
  c.max_positions = 256;
  c.attention_dropout = dropout;
  c.hidden_dropout = dropout;
  if (llama) use_llama_architecture(c);
  return c;
}

// B sequences of random GPT-2 token ids (fixed Philox stream), every token counted in the loss.
inline MicroBatch random_batch(const ModelConfig& c, int64_t B) {
  MicroBatch mb;
  mb.B = B;
  mb.S = c.seq_length;
  for (int64_t i = 0; i < B * mb.S; ++i) {
    mb.tokens.push_back(static_cast<int32_t>(uniform_at(1, 2, i) * 50257));
    mb.labels.push_back(static_cast<int32_t>(uniform_at(1, 3, i) * 50257));
    mb.loss_mask.push_back(1.0f);
    mb.position_ids.push_back(static_cast<int32_t>(i % mb.S));
  }
  for (int64_t b = 0; b < B; ++b) mb.sample_ids.push_back(b);
  return mb;
}

}  // namespace gale::bench
