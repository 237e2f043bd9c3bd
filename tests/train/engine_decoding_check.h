// The serving engine's (train/inference_engine.h) decoding checks: a greedy sampler that checks every
// request's logits and token against the whole-sequence forward at every step, the tokens generated,
// and a small dynamic-batching buffer in which requests pause and join mid-flight.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "model/decoding_check.h"
#include "train/inference_engine.h"

namespace gale::testing {

// Prompts of the given lengths (test_prompt with salt 31).
inline std::vector<std::vector<int32_t>> engine_prompts(const std::vector<int64_t>& lengths, int64_t vocab) {
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t len : lengths) prompts.push_back(test_prompt(len, vocab, 31));
  return prompts;
}

// What the checking sampler saw: each request's tokens so far and the largest relative difference
// of its logits from the whole-sequence forward's.
struct FullForwardCheck {
  std::map<int64_t, std::vector<int32_t>> so_far;
  double worst = 0.0;
};

// Greedy engine options (max_length and kv_length the model's positions) whose sampler checks each
// request's logits against the full forward of its prompt and the tokens it has so far (the same
// greedy token), recording in *check (reset). `m`, `prompts` and *check must outlive the options.
inline EngineOptions full_forward_checked_options(GPTModel& m, const std::vector<std::vector<int32_t>>& prompts,
                                                  int64_t max_new, FullForwardCheck* check) {
  EngineOptions o;
  o.max_new_tokens = max_new;
  o.max_length = m.config().max_positions;
  o.kv_length = m.config().max_positions;
  *check = FullForwardCheck{};
  o.sample = [&m, &prompts, check](const float* l, int64_t request, int64_t step) {
    const int64_t V = m.config().vocab;
    std::vector<int32_t>& got = check->so_far[request];
    EXPECT_EQ(static_cast<int64_t>(got.size()), step);
    std::vector<int32_t> seq = prompts[static_cast<size_t>(request)];
    seq.insert(seq.end(), got.begin(), got.end());
    const std::vector<float> want = full_forward_last_logits(m, seq);
    check->worst = std::max(check->worst, logits_rel_diff(l, want));
    const int32_t t = argmax_row(l, V);
    EXPECT_EQ(t, argmax_row(want.data(), V)) << "request " << request << ", step " << step;
    got.push_back(t);
    return t;
  };
  return o;
}

// The engine generated for every prompt (no stop tokens) what the checking sampler drew, until
// max_new_tokens or the last position: the greedy continuation by whole-sequence forwards, since the
// sampler checked each token; and every step's logits were within 1e-4 relative of the full forward's.
inline void expect_full_forward_tokens(const std::vector<std::vector<int32_t>>& prompts, const EngineResult& r,
                                       const EngineOptions& o, const FullForwardCheck& check) {
  ASSERT_EQ(r.generated.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto drawn = check.so_far.find(static_cast<int64_t>(i));
    EXPECT_EQ(r.generated[i], drawn == check.so_far.end() ? std::vector<int32_t>{} : drawn->second) << "prompt " << i;
    EXPECT_EQ(static_cast<int64_t>(r.generated[i].size()),
              std::min(o.max_new_tokens, o.max_length - static_cast<int64_t>(prompts[i].size())))
        << "prompt " << i;
  }
  EXPECT_LT(check.worst, 1e-4);
  std::printf("largest relative logits difference %.2e\n", check.worst);
}

// Megatron's sizing of a dynamic-batching buffer of 808 blocks of `block_bytes` (4 positions each)
// for requests of up to 48 positions, with steps of at most 64 tokens: the 64 guaranteed requests
// reserve 768 blocks, so requests pause for blocks, and prompts of more than 64 tokens in all join
// mid-flight.
inline StatusOr<DynamicBudget> small_dynamic_budget(int64_t block_bytes) {
  DynamicBufferFlags f;
  f.buffer_size_gb = static_cast<double>(808 * block_bytes) / (1024.0 * 1024.0 * 1024.0) + 1e-12;
  f.max_tokens_override = 64;
  return dynamic_budget(f, 4, block_bytes, 48);
}

}  // namespace gale::testing
