// Random micro-batches, the mean-loss helper and a comparison of gradients shared by the model tests
// (finite differences, golden comparisons): one definition instead of a copy per test file.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/gpt_model.h"
#include "testing.h"

namespace gale::testing {

// The 2-layer GPT the finite-difference and golden model tests share: small enough for a
// directional derivative per parameter group, large init so that gradients are not tiny.
inline ModelConfig gradcheck_gpt_config() {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = 16;
  c.ffn = 24;
  c.heads = 2;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.vocab = 32;
  c.seq_length = 8;
  c.max_positions = 16;
  c.init_std = 0.3f;
  return c;
}

// A 2-layer GQA model (4 query heads, 2 KV groups) with head_dim 6 (hidden/heads is 4), RoPE, init
// std 0.3; the LLaMA architecture when `llama`. The q/k-norm tests set their norm on it.
inline ModelConfig small_gqa_rope_config(bool llama) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = 16;
  c.ffn = 24;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 6;
  c.vocab = 32;
  c.seq_length = 8;
  c.max_positions = 32;
  c.init_std = 0.3f;
  if (llama) use_llama_architecture(c);
  c.position = PositionEmbedding::kRope;
  return c;
}

// The 3-layer LLaMA-style MoE model the MoE model tests share: layers 0 and 2 MoE (4 experts, top-2,
// expert FFN 6, load-balancing coefficient 0.1), layer 1 dense; GQA with one KV head.
inline ModelConfig tiny_moe_config() {
  ModelConfig c;
  c.num_layers = 3;
  c.hidden = 8;
  c.ffn = 12;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 4;
  c.vocab = 24;
  c.seq_length = 6;
  c.max_positions = 8;
  c.init_std = 0.3f;
  use_llama_architecture(c);
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.ffn = 6;
  c.moe.aux_loss_coeff = 0.1;
  c.moe.pattern = {1, 0, 1};
  return c;
}

// Random tokens and labels; about 20% of the loss mask off; with `documents` each sequence holds
// two documents (positions restart at s = 5).
inline MicroBatch masked_batch(const ModelConfig& c, int64_t B, uint64_t seed, bool documents) {
  MicroBatch mb;
  mb.B = B;
  mb.S = c.seq_length;
  const int64_t T = B * mb.S;
  const auto r = random_vector(3 * T, seed);
  for (int64_t i = 0; i < T; ++i) {
    mb.tokens.push_back(static_cast<int32_t>((r[i] + 1.0f) * 0.5f * (c.vocab - 1)));
    mb.labels.push_back(static_cast<int32_t>((r[T + i] + 1.0f) * 0.5f * (c.vocab - 1)));
    mb.loss_mask.push_back(r[2 * T + i] > -0.6f ? 1.0f : 0.0f);
    const int64_t s = i % mb.S;
    mb.position_ids.push_back(static_cast<int32_t>(documents && s >= 5 ? s - 5 : s));
    if (documents) mb.document_ids.push_back(s >= 5 ? 1 : 0);
  }
  return mb;
}

// Random tokens and labels, every token in the loss, one document per sequence.
inline MicroBatch full_batch(const ModelConfig& c, int64_t B, uint64_t seed) {
  MicroBatch mb;
  mb.B = B;
  mb.S = c.seq_length;
  const int64_t T = B * mb.S;
  const auto r = random_vector(2 * T, seed);
  for (int64_t i = 0; i < T; ++i) {
    mb.tokens.push_back(static_cast<int32_t>((r[i] + 1.0f) * 0.5f * (c.vocab - 1)));
    mb.labels.push_back(static_cast<int32_t>((r[T + i] + 1.0f) * 0.5f * (c.vocab - 1)));
    mb.loss_mask.push_back(1.0f);
    mb.position_ids.push_back(static_cast<int32_t>(i % mb.S));
  }
  return mb;
}

// Tokens [B, S_total] sample-major as a micro-batch over positions [first, first + S) of each
// sample (the KV-cache tests feed a sequence in chunks).
inline MicroBatch position_slice(const std::vector<int32_t>& tokens, int64_t B, int64_t S_total, int64_t first,
                                 int64_t S) {
  MicroBatch mb;
  mb.B = B;
  mb.S = S;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = first; s < first + S; ++s) {
      mb.tokens.push_back(tokens[b * S_total + s]);
      mb.position_ids.push_back(static_cast<int32_t>(s));
    }
  return mb;
}

// The micro-batch's mean loss; with `backward` the gradients of it (zeroed first), otherwise a
// backward with scale 0 that only drops the saved state.
inline double mean_loss(GPTModel& model, const MicroBatch& mb, bool backward) {
  GPTModel::LossSums sums;
  model.forward(0, mb, Tensor(), /*training=*/true, &sums);
  if (backward) model.params().zero_grads();
  model.backward(0, Tensor(), backward ? static_cast<float>(1.0 / sums.tokens) : 0.0f);
  return sums.loss_sum / sums.tokens;
}

// The logits of `c`'s model (reference kernels, parameters initialised with seed 7) on `mb`, flat.
inline std::vector<float> reference_logits(const ModelConfig& c, const MicroBatch& mb) {
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(7);
  const Tensor logits = model.forward_logits(mb, Tensor());
  return std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel());
}

// max_i |a_i − b_i| (equal sizes).
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

// Every parameter's gradient in `b` within rel·max|g| + abs of its gradient g in `a` (the same
// parameters, e.g. one model run with two kernels).
inline void expect_close_grads(const ParamBuffer& a, const ParamBuffer& b, double rel, double abs) {
  for (int id = 0; id < a.size(); ++id) {
    const float* ga = a.grad_data(id);
    const float* gb = b.grad_data(id);
    double scale = 0.0, worst = 0.0;
    for (int64_t i = 0; i < a.spec(id).local_numel(); ++i) {
      scale = std::max(scale, std::abs(double(ga[i])));
      worst = std::max(worst, std::abs(double(ga[i]) - double(gb[i])));
    }
    EXPECT_LE(worst, rel * scale + abs) << a.spec(id).name;
  }
}

// Every parameter of a model of `c` (reference kernels, initialize(42), masked_batch(c, 2, 7)) against
// five-point directional derivatives in fp32 with step h, 5e-3 unless given (as
// tests/model/gpt_model_test.cc, whose tolerance discussion applies: 1% relative with a `floor`,
// 1e-2 unless given).
inline void expect_every_parameter_matches_finite_differences(const ModelConfig& c, double h = 5e-3,
                                                              double floor = 1e-2) {
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  MicroBatch mb = masked_batch(c, 2, 7, false);
  mean_loss(model, mb, true);
  ParamBuffer& pb = model.params();
  std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  auto loss = [&] { return mean_loss(model, mb, false); };
  for (int id = 0; id < pb.size(); ++id) {
    const int64_t n = pb.spec(id).local_numel();
    auto dir = random_vector(n, 100 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative_5point(loss, pb.param_data(id), dir.data(), n, h);
    EXPECT_LT(rel_diff(analytic, numeric, floor), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
  }
}

}  // namespace gale::testing
