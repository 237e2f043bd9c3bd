// Tiny GPT and LLaMA-style models (odd sizes: vector tails, a partial flash-attention tile) trained
// a few AdamW steps on random micro-batches, for the model tests that compare two ways of running
// the same model (reference vs fused kernels, stored vs recomputed activations).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/allocator.h"
#include "model/gpt_model.h"
#include "testing.h"

namespace gale::testing {

inline ModelConfig tiny_gpt_config() {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = 48;  // not a multiple of 16: vector tails everywhere
  c.ffn = 100;
  c.heads = 3;
  c.kv_heads = 3;
  c.head_dim = 16;
  c.vocab = 97;
  c.seq_length = 70;  // two flash-attention tiles, the second partial
  c.max_positions = 80;
  c.init_std = 0.1f;
  c.attention_dropout = 0.1f;
  c.hidden_dropout = 0.1f;
  return c;
}

inline ModelConfig tiny_llama_config() {
  ModelConfig c = tiny_gpt_config();
  use_llama_architecture(c);
  c.rotary_percent = 0.5;
  c.heads = 8;
  c.kv_heads = 2;
  c.head_dim = 12;  // rotary dims 6; HD not a multiple of any vector width
  c.attention_dropout = 0.0f;
  c.hidden_dropout = 0.0f;
  return c;
}

inline MicroBatch tiny_batch(const ModelConfig& c, int64_t B, uint64_t seed, bool documents) {
  MicroBatch mb;
  mb.B = B;
  mb.S = c.seq_length;
  const int64_t T = B * mb.S;
  auto r = random_vector(3 * T, seed);
  for (int64_t i = 0; i < T; ++i) {
    mb.tokens.push_back(static_cast<int32_t>((r[i] + 1.0f) * 0.5f * (c.vocab - 1)));
    mb.labels.push_back(static_cast<int32_t>((r[T + i] + 1.0f) * 0.5f * (c.vocab - 1)));
    mb.loss_mask.push_back(r[2 * T + i] > -0.8f ? 1.0f : 0.0f);
    const int64_t s = i % mb.S;
    const int64_t doc_start = documents ? (s >= 45 ? 45 : s >= 20 ? 20 : 0) : 0;
    mb.position_ids.push_back(static_cast<int32_t>(s - doc_start));
    if (documents) mb.document_ids.push_back(static_cast<int32_t>(doc_start));
  }
  for (int64_t b = 0; b < B; ++b) mb.sample_ids.push_back(seed * 10 + b);
  return mb;
}

struct TinyTrainingRun {
  std::vector<double> losses;             // per step
  std::vector<std::vector<float>> grads;  // the flat gradient buffer after each step's backward
  int64_t first_step_peak_bytes = 0;      // tensor bytes at the peak of step 1's forward + backward, over the start
};

// `steps` training steps (forward, backward, AdamW over the flat buffer) from the same initial
// weights, on micro-batches of 2 samples.
inline TinyTrainingRun train_tiny(const ModelConfig& config, const OpTable& ops, bool documents, int steps) {
  GPTModel model(config, single_process_partition(config), &ops);
  ParamBuffer& pb = model.params();
  pb.initialize(7);
  std::vector<float> m(pb.numel(), 0.0f), v(pb.numel(), 0.0f);
  TinyTrainingRun run;
  for (int step = 1; step <= steps; ++step) {
    const MicroBatch mb = tiny_batch(config, 2, 100 + step, documents);
    GPTModel::LossSums sums;
    pb.zero_grads();
    const int64_t before = host_allocator().current_bytes();
    host_allocator().reset_peak();
    model.forward(0, mb, Tensor(), /*training=*/true, &sums);
    model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
    if (step == 1) run.first_step_peak_bytes = host_allocator().peak_bytes() - before;
    run.losses.push_back(sums.loss_sum / sums.tokens);
    run.grads.emplace_back(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
    AdamWHyper h;
    h.lr = 1e-3f;
    h.step = step;
    ops.adamw_step(pb.flat_params().data<float>(), pb.flat_grads().data<float>(), m.data(), v.data(), pb.numel(), h);
  }
  return run;
}

// `steps` steps of train_tiny on plain (document-free) micro-batches.
inline TinyTrainingRun train_plain(const ModelConfig& config, const OpTable& ops, int steps) {
  return train_tiny(config, ops, /*documents=*/false, steps);
}

// `c` with three layers (so that "the first N layers" can leave some out), and `c` under --bf16.
inline ModelConfig three_layers(ModelConfig c) {
  c.num_layers = 3;
  return c;
}
inline ModelConfig with_bf16(ModelConfig c) {
  c.bf16 = true;
  return c;
}

// Bit for bit (recomputation runs the same kernels on the same inputs): the same losses and the
// same gradient bytes at every step; `what` names the variant in failures.
inline void expect_identical_runs(const TinyTrainingRun& a, const TinyTrainingRun& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << what << ", step " << i + 1;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i].size(), b.grads[i].size());
    EXPECT_EQ(0, std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * sizeof(float)))
        << what << ": gradients differ at step " << i + 1;
  }
}

}  // namespace gale::testing
