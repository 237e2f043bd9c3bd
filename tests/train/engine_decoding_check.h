// The serving engine's (train/inference_engine.h) decoding checks: a greedy sampler that checks every
// request's logits and token against the whole-sequence forward at every step, the tokens generated,
// and a small dynamic-batching buffer in which requests pause and join mid-flight.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "core/allocator.h"
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

// A fixture holding a decoding model (DecodingModelTest) and the engine's prompts:
// set_up(c, prepare, lengths); options(max_new) checks every step against the full forward in check_.
class EngineDecodingTest : public DecodingModelTest {
 protected:
  void set_up(const ModelConfig& c, void (*prepare)(GPTModel&), const std::vector<int64_t>& lengths) {
    DecodingModelTest::set_up(c, prepare);
    prompts_ = engine_prompts(lengths, c_.vocab);
  }
  EngineOptions options(int64_t max_new) { return full_forward_checked_options(*model_, prompts_, max_new, &check_); }
  std::vector<std::vector<int32_t>> prompts_;
  FullForwardCheck check_;
};

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


// Dynamic batching of `prompts` with `o` (full_forward_checked_options with check) in
// small_dynamic_budget's buffer of blocks of 4 positions: the full forward's tokens
// (expect_full_forward_tokens), requests joined mid-flight, every block and state slot back at the
// end and the allocator's bytes back at their baseline (the KV buffer, the state slots and every
// step's tensors freed). The result in *r for more checks.
inline void expect_dynamic_batching_gives_full_forward_tokens(GPTModel& m,
                                                              const std::vector<std::vector<int32_t>>& prompts,
                                                              EngineOptions o, const FullForwardCheck& check,
                                                              EngineResult* r) {
  o.dynamic = true;
  const KvBlockPool probe(m.config(), m.partition(), 4, 1);
  StatusOr<DynamicBudget> b = small_dynamic_budget(probe.block_bytes());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  o.budget = *b;
  const int64_t before = host_allocator().current_bytes();
  {
    StatusOr<EngineResult> got = run_inference_engine(m, prompts, o);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    *r = std::move(got).value();
  }
  expect_full_forward_tokens(prompts, *r, o, check);
  EXPECT_GT(r->joined_mid_flight, 0);
  EXPECT_EQ(r->free_blocks_at_end, r->num_blocks);
  EXPECT_EQ(r->free_mamba_slots_at_end, r->mamba_slots);
  EXPECT_EQ(host_allocator().current_bytes(), before)
      << "the KV buffer, the state slots and every step's tensors are freed";
}

}  // namespace gale::testing
