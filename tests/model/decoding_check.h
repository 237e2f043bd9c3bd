// The checks that decoding through a KvCache equals rerunning the whole sequence, shared by the
// decoding tests of every model family (attention, MLA, DSA, Mamba, Gated DeltaNet) and by the
// serving engine's tests (tests/train/engine_decoding_check.h builds on these).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/fused_ops.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "model/model_test_batches.h"

namespace gale::testing {

// The reference ops with every fused kernel of this CPU.
inline OpTable decoding_ops() {
  OpTable ops = reference_ops();
  GALE_CHECK_OK(install_all_fused_kernels(ops, detected_isa()));
  return ops;
}

// A model of `c` on one process over `ops` (which must outlive it), its parameters initialized with `seed`.
inline std::unique_ptr<GPTModel> decoding_model(const ModelConfig& c, const OpTable* ops, uint64_t seed) {
  auto m = std::make_unique<GPTModel>(c, single_process_partition(c), ops);
  m->params().initialize(seed);
  return m;
}

// A fixture holding a decoding model: set_up(c, prepare) builds it (decoding_ops, seed 7) and runs
// `prepare` on it (e.g. make_mamba_state_carry).
class DecodingModelTest : public ::testing::Test {
 protected:
  void set_up(const ModelConfig& c, void (*prepare)(GPTModel&)) {
    c_ = c;
    ops_ = decoding_ops();
    model_ = decoding_model(c_, &ops_, 7);
    prepare(*model_);
  }
  ModelConfig c_;
  OpTable ops_;
  std::unique_ptr<GPTModel> model_;
};

// A prompt of `len` tokens, token i = (len·salt + 7·i + 3) mod V: prompts of different lengths differ.
inline std::vector<int32_t> test_prompt(int64_t len, int64_t vocab, int64_t salt = 13) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back(static_cast<int32_t>((len * salt + i * 7 + 3) % vocab));
  return p;
}

// `n` tokens, token i = (37·i + 11) mod V (the chunked-decoding tests' [B, S] sample-major).
inline std::vector<int32_t> test_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return t;
}

// The logits row [V] after `ids` by a whole-sequence forward (no cache: every position from scratch).
inline std::vector<float> full_forward_last_logits(GPTModel& m, const std::vector<int32_t>& ids) {
  const int64_t S = static_cast<int64_t>(ids.size()), V = m.config().vocab;
  const Tensor l = m.forward_logits(position_slice(ids, 1, S, 0, S), Tensor());
  return std::vector<float>(l.data<float>() + (S - 1) * V, l.data<float>() + S * V);
}

// max |got − want| / max |want| over a logits row.
inline double logits_rel_diff(const float* got, const std::vector<float>& want) {
  double diff = 0.0, scale = 1e-30;
  for (size_t v = 0; v < want.size(); ++v) {
    diff = std::max(diff, std::abs(static_cast<double>(got[v]) - want[v]));
    scale = std::max(scale, std::abs(static_cast<double>(want[v])));
  }
  return diff / scale;
}

inline int32_t argmax_row(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// forward_logits through `cache` of the next tokens of each of its B samples ([B][n] ids, n the same
// for all; positions from the cache) -> the last logits row [V] of each.
inline std::vector<std::vector<float>> cached_last_logits(GPTModel& m, KvCache& cache,
                                                          const std::vector<std::vector<int32_t>>& ids) {
  MicroBatch mb;
  mb.B = static_cast<int64_t>(ids.size());
  mb.S = static_cast<int64_t>(ids[0].size());
  for (const auto& v : ids) mb.tokens.insert(mb.tokens.end(), v.begin(), v.end());
  mb.position_ids.assign(mb.tokens.size(), 0);
  const Tensor l = m.forward_logits(mb, Tensor(), &cache);
  const int64_t V = m.config().vocab;
  std::vector<std::vector<float>> rows;
  for (int64_t b = 0; b < mb.B; ++b) {
    const float* r = l.data<float>() + (b * mb.S + mb.S - 1) * V;
    rows.emplace_back(r, r + V);
  }
  return rows;
}

// Greedy decoding of the prompts (one per sample of `cache`, equal lengths) for `steps` tokens:
// every step's cached logits against the whole-sequence forward of that sample's tokens so far,
// which must pick the same token (a failed expectation otherwise). Returns the largest relative
// logits difference; the prompts and their tokens in *seqs when given.
inline double greedy_against_full_forward(GPTModel& m, KvCache& cache, const std::vector<std::vector<int32_t>>& prompts,
                                          int64_t steps, std::vector<std::vector<int32_t>>* seqs = nullptr) {
  const int64_t V = m.config().vocab;
  std::vector<std::vector<int32_t>> all = prompts, next = prompts;
  double worst = 0.0;
  for (int64_t k = 0; k <= steps; ++k) {
    const std::vector<std::vector<float>> rows = cached_last_logits(m, cache, next);
    for (size_t b = 0; b < all.size(); ++b) {
      const std::vector<float> want = full_forward_last_logits(m, all[b]);
      worst = std::max(worst, logits_rel_diff(rows[b].data(), want));
      const int32_t tok = argmax_row(rows[b].data(), V);
      EXPECT_EQ(tok, argmax_row(want.data(), V)) << "sample " << b << ", step " << k;
      all[b].push_back(tok);
      next[b] = {tok};
    }
  }
  if (seqs) *seqs = std::move(all);
  return worst;
}

// Greedy decoding against the full forward (greedy_against_full_forward, 12 steps, logits within
// 1e-4 relative) of a prompt of each of `lengths` alone, then of the prompts `together` in one cache.
// Returns the last cache.
inline KvCache expect_greedy_decoding_of_prompts(GPTModel& m, const std::vector<int64_t>& lengths,
                                                 const std::vector<std::vector<int32_t>>& together) {
  const ModelConfig& c = m.config();
  for (int64_t len : lengths) {
    KvCache cache = make_kv_cache(c, m.partition(), 1, c.max_positions);
    const double worst = greedy_against_full_forward(m, cache, {test_prompt(len, c.vocab)}, 12);
    EXPECT_LT(worst, 1e-4) << "prompt of " << len;
    std::printf("prompt of %lld: largest relative logits difference %.2e\n", static_cast<long long>(len), worst);
  }
  KvCache cache = make_kv_cache(c, m.partition(), static_cast<int64_t>(together.size()), c.max_positions);
  const double worst = greedy_against_full_forward(m, cache, together, 12);
  EXPECT_LT(worst, 1e-4) << together.size() << " prompts together";
  std::printf("%zu prompts together: largest relative logits difference %.2e\n", together.size(), worst);
  return cache;
}

// Beam search's branching (train/generate.cc): a one-sample cache cloned after `prompt` continues
// with tokens 10 + k while the original continues with b_first − 3k, for `steps` steps; each step's
// logits of both within 1e-4 relative of the whole-sequence forward (the clone's state is its own).
inline void expect_cloned_caches_branch_independently(GPTModel& m, const std::vector<int32_t>& prompt, int steps,
                                                      int32_t b_first) {
  KvCache a = make_kv_cache(m.config(), m.partition(), 1, m.config().max_positions);
  cached_last_logits(m, a, {prompt});
  KvCache b = clone_kv_cache(a);
  std::vector<int32_t> sa = prompt, sb = prompt;
  for (int k = 0; k < steps; ++k) {
    const int32_t ta = static_cast<int32_t>(10 + k), tb = static_cast<int32_t>(b_first - 3 * k);
    sa.push_back(ta);
    sb.push_back(tb);
    const std::vector<float> ra = cached_last_logits(m, a, {{ta}})[0];
    const std::vector<float> rb = cached_last_logits(m, b, {{tb}})[0];
    EXPECT_LT(logits_rel_diff(ra.data(), full_forward_last_logits(m, sa)), 1e-4) << k;
    EXPECT_LT(logits_rel_diff(rb.data(), full_forward_last_logits(m, sb)), 1e-4) << k;
  }
}

// Tokens [B, S] (sample-major) fed to `cached` through `cache` in chunks of positions (summing to S):
// the cache's length follows, and every position's logits are within `tol` (absolute) of `whole`'s
// whole-sequence forward ([B, S, V]; `whole` may be `cached`).
inline void expect_chunked_decoding_equals_whole_forward(GPTModel& cached, KvCache& cache, GPTModel& whole,
                                                         const std::vector<int32_t>& tokens, int64_t B, int64_t S,
                                                         const std::vector<int64_t>& chunks, double tol) {
  const int64_t V = cached.config().vocab;
  const Tensor all = whole.forward_logits(position_slice(tokens, B, S, 0, S), Tensor());
  int64_t done = 0;
  for (int64_t chunk : chunks) {
    const Tensor got = cached.forward_logits(position_slice(tokens, B, S, done, chunk), Tensor(), &cache);
    ASSERT_EQ(cache.length, done + chunk);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < chunk; ++s) {
        const float* g = got.data<float>() + (b * chunk + s) * V;
        const float* w = all.data<float>() + (b * S + done + s) * V;
        double worst = 0.0;
        for (int64_t v = 0; v < V; ++v) worst = std::max(worst, std::abs(double(g[v]) - double(w[v])));
        EXPECT_LT(worst, tol) << "sample " << b << ", position " << done + s;
      }
    done += chunk;
  }
  EXPECT_EQ(done, S);
}

// A reference-kernel model of `c` (initialize(5)) decoding 2 sequences of 12 tokens in chunks of 5, 1, 1
// and 5 through a KvCache gives the whole-sequence forward's logits within 2e-5.
inline void expect_reference_model_decoding_equals_whole_forward(const ModelConfig& c) {
  OpTable ops = reference_ops();
  const ModelPartition part = single_process_partition(c);
  GPTModel model(c, part, &ops);
  model.params().initialize(5);
  const int64_t B = 2, S = 12;
  KvCache cache = make_kv_cache(c, part, B, S);
  expect_chunked_decoding_equals_whole_forward(model, cache, model, test_tokens(B * S, c.vocab), B, S, {5, 1, 1, 5},
                                               2e-5);
}

}  // namespace gale::testing
