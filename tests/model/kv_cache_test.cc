// Incremental decoding with a KvCache gives the logits of the whole-sequence forward: GPT (learned
// positions) and LLaMA (RoPE, GQA), two samples, chunks of several and of one token, the reference
// and the flash attention kernel, a model with a noop layer, and sliding windows (W = 5 and 1)
// shorter than the sequence: the cache keeps every position and the window hides the old keys;
// ALiBi (the bias at the cached keys' absolute positions), also with a window and the flash kernel;
// --flash-decode's split-K one-token steps.
#include "model/kv_cache.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/fused_ops.h"
#include "model_test_batches.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

struct Case {
  const char* name;
  bool llama, flash, noop;
  int64_t window = 0;  // --sliding-window (0: none)
  bool alibi = false;  // --position-embedding-type alibi
};

class KvCacheDecoding : public ::testing::TestWithParam<Case> {};

TEST_P(KvCacheDecoding, EqualsTheWholeSequenceForward) {
  const Case& p = GetParam();
  ModelConfig c = p.llama ? testing::tiny_llama_config() : testing::tiny_gpt_config();
  c.attention_dropout = c.hidden_dropout = 0.0f;
  c.sliding_window = p.window;
  if (p.alibi) c.position = PositionEmbedding::kAlibi;
  if (p.noop) {
    c.num_layers = 3;
    c.noop_layers = {1};
  }
  OpTable ops = reference_ops();
  if (p.flash) GALE_CHECK_OK(install_fused_kernel(ops, "attention", detected_isa()));
  const ModelPartition part = single_process_partition(c);
  GPTModel model(c, part, &ops);
  model.params().initialize(5);
  const int64_t B = 2, S = 23;
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < B * S; ++i) tokens.push_back(static_cast<int32_t>((i * 37 + 11) % c.vocab));
  const Tensor whole = model.forward_logits(testing::position_slice(tokens, B, S, 0, S), Tensor());  // [B, S, V]

  KvCache cache = make_kv_cache(c, part, B, S);
  int64_t done = 0;
  for (int64_t chunk : {7, 1, 1, 5, 1, 8}) {
    const Tensor part_logits = model.forward_logits(testing::position_slice(tokens, B, S, done, chunk), Tensor(), &cache);
    ASSERT_EQ(cache.length, done + chunk);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < chunk; ++s) {
        const float* got = part_logits.data<float>() + (b * chunk + s) * c.vocab;
        const float* want = whole.data<float>() + (b * S + done + s) * c.vocab;
        double worst = 0.0;
        for (int64_t v = 0; v < c.vocab; ++v) worst = std::max(worst, std::abs(double(got[v]) - double(want[v])));
        EXPECT_LT(worst, 2e-5) << "sample " << b << ", position " << done + s;
      }
    done += chunk;
  }
  EXPECT_EQ(done, S);
}

// --flash-decode: the one-token steps attend with split-K flash decoding (chunks of 3 cached
// positions) and still give the whole-sequence logits (LLaMA: RoPE, GQA; a sliding window of 5).
TEST(KvCacheFlashDecode, OneTokenStepsEqualTheWholeSequenceForward) {
  for (int64_t window : {0, 5}) {
    ModelConfig c = testing::tiny_llama_config();
    c.sliding_window = window;
    OpTable ops = reference_ops();
    const ModelPartition part = single_process_partition(c);
    GPTModel model(c, part, &ops);
    model.params().initialize(5);
    const int64_t S = 19;
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < S; ++i) tokens.push_back(static_cast<int32_t>((i * 37 + 11) % c.vocab));
    const Tensor whole = model.forward_logits(testing::position_slice(tokens, 1, S, 0, S), Tensor());
    KvCache cache = make_kv_cache(c, part, 1, S);
    cache.flash_decode_chunk = 3;
    int64_t done = 0;
    for (int64_t chunk : {6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
      const Tensor got = model.forward_logits(testing::position_slice(tokens, 1, S, done, chunk), Tensor(), &cache);
      for (int64_t s = 0; s < chunk; ++s) {
        double worst = 0.0;
        for (int64_t v = 0; v < c.vocab; ++v)
          worst = std::max(worst, std::abs(double(got.data<float>()[s * c.vocab + v]) -
                                           double(whole.data<float>()[(done + s) * c.vocab + v])));
        EXPECT_LT(worst, 2e-5) << "window " << window << ", position " << done + s;
      }
      done += chunk;
    }
    EXPECT_EQ(done, S);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, KvCacheDecoding,
                         ::testing::Values(Case{"gpt", false, false, false}, Case{"llama", true, false, false},
                                           Case{"llama_flash", true, true, false}, Case{"gpt_flash_noop", false, true, true},
                                           Case{"llama_window5", true, false, false, 5},
                                           Case{"llama_window5_flash", true, true, false, 5},
                                           Case{"gpt_window1_flash", false, true, false, 1},
                                           Case{"gpt_alibi", false, false, false, 0, true},
                                           Case{"llama_alibi_flash", true, true, false, 0, true},
                                           Case{"llama_alibi_window5_flash", true, true, false, 5, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace gale
