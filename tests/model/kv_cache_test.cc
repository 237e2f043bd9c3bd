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
#include "model/decoding_check.h"
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
  KvCache cache = make_kv_cache(c, part, B, S);
  testing::expect_chunked_decoding_equals_whole_forward(model, cache, model, testing::test_tokens(B * S, c.vocab), B,
                                                        S, {7, 1, 1, 5, 1, 8}, 2e-5);
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
    KvCache cache = make_kv_cache(c, part, 1, S);
    cache.flash_decode_chunk = 3;
    SCOPED_TRACE("window " + std::to_string(window));
    testing::expect_chunked_decoding_equals_whole_forward(model, cache, model, testing::test_tokens(S, c.vocab), 1, S,
                                                          {6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 2e-5);
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
