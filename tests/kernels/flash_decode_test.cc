// Split-K flash decoding (kernels/cpu/flash_decode.h) against its plain double-precision reference
// and against attention_forward_ref for the same single query: odd key counts, chunk sizes that do
// and do not divide them (1, 3, 7, 64, one chunk for all), GQA, a sliding window, ALiBi and sink logits
// (--softmax-type).
#include "kernels/cpu/flash_decode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace gale {
namespace {

struct DecodeCase {
  int64_t L, NH, KV, HD, window;
  bool alibi;
  int sink = 0;  // --softmax-type: 0 vanilla, 1 off-by-one (zero logits), 2 learnable logits
};

// Tolerance: the kernel sums in float over at most a few hundred keys of O(1) scores and values, the
// reference in double; 2e-5 absolute is ~100 float ulps at these magnitudes and far below the
// differences a wrong merge (a missing rescale or a dropped chunk: > 1e-2 here) gives.
constexpr double kTol = 2e-5;

TEST(FlashDecode, MatchesThePlainReferenceForEveryChunkSize) {
  std::mt19937 gen(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> slopes = alibi_slopes(8);
  for (const DecodeCase& c : {DecodeCase{1, 4, 4, 8, 0, false}, DecodeCase{37, 4, 2, 16, 0, false},
                              DecodeCase{101, 8, 2, 8, 0, true}, DecodeCase{129, 6, 3, 16, 20, false},
                              DecodeCase{250, 8, 1, 4, 0, false},
                              // sink logits: merged once, whatever the chunks
                              DecodeCase{37, 4, 2, 16, 0, false, 1}, DecodeCase{101, 8, 2, 8, 0, true, 2},
                              DecodeCase{129, 6, 3, 16, 20, false, 2}, DecodeCase{1, 4, 4, 8, 0, false, 2}}) {
    const int64_t W = (c.NH + 2 * c.KV) * c.HD;  // one packed QKV row per position
    std::vector<float> qkv(static_cast<size_t>(c.L * W));
    for (float& x : qkv) x = normal(gen);
    const HeadLayout ql = qkv_query_layout(c.NH, c.KV, c.HD), kl = qkv_key_layout(c.NH, c.KV, c.HD),
                     vl = qkv_value_layout(c.NH, c.KV, c.HD);
    const int32_t qpos = static_cast<int32_t>(c.L - 1);
    AttentionProblem p;
    p.B = 1;
    p.Sq = 1;
    p.Sk = c.L;
    p.NH = c.NH;
    p.KV = c.KV;
    p.HD = c.HD;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.HD));
    p.window = c.window;
    p.q_positions = &qpos;
    p.alibi_slopes = c.alibi ? slopes.data() : nullptr;
    p.heads_total = c.NH;
    p.max_positions = c.L;
    std::vector<float> sinks(static_cast<size_t>(c.NH), 0.0f);
    if (c.sink == 2)
      for (int64_t h = 0; h < c.NH; ++h) sinks[h] = h == 1 ? 5.0f : -1.5f + 0.75f * static_cast<float>(h);
    if (c.sink) p.softmax_offset = sinks.data();
    const float* q = qkv.data() + (c.L - 1) * W;  // the last position's query
    std::vector<float> want(static_cast<size_t>(c.NH * c.HD)), want_lse(static_cast<size_t>(c.NH));
    flash_decode_forward_ref(p, q, ql, qkv.data(), kl, qkv.data(), vl, want.data(), want_lse.data());
    std::vector<float> attn(want.size()), attn_lse(want_lse.size());
    attention_forward_ref(p, q, ql, qkv.data(), kl, qkv.data(), vl, attn.data(), attn_lse.data());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(attn[i], want[i], kTol) << "attention_forward_ref, L " << c.L;
    for (int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{7}, int64_t{64}, c.L, c.L + 5}) {
      std::vector<float> got(want.size()), lse(want_lse.size());
      flash_decode_forward(p, q, ql, qkv.data(), kl, qkv.data(), vl, chunk, got.data(), lse.data());
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], kTol) << "L " << c.L << ", chunk " << chunk << ", element " << i;
      for (size_t h = 0; h < lse.size(); ++h) ASSERT_NEAR(lse[h], want_lse[h], kTol) << "lse, chunk " << chunk;
    }
  }
}

TEST(FlashDecode, AQueryThatSeesNoKeyGetsZeroAndMinusInfinity) {
  std::vector<float> qkv(static_cast<size_t>(5 * 3 * 4), 1.0f);
  const int32_t qpos = 1;  // keys at positions 0..4 with a causal mask: keys 2..4 are ahead; window 1 hides 0
  AttentionProblem p;
  p.B = p.Sq = 1;
  p.Sk = 5;
  p.NH = p.KV = 1;
  p.HD = 4;
  p.q_positions = &qpos;
  const int32_t kpos[5] = {-3, 2, 3, 4, 5};  // the only earlier key is outside a window of 1
  p.k_positions = kpos;
  p.window = 1;
  float out[4], lse[1];
  flash_decode_forward(p, qkv.data(), qkv_query_layout(1, 1, 4), qkv.data(), qkv_key_layout(1, 1, 4), qkv.data(),
                       qkv_value_layout(1, 1, 4), 2, out, lse);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  EXPECT_TRUE(std::isinf(lse[0]) && lse[0] < 0);
  // With a sink logit the row holds the sink alone: out 0, lse σ.
  const float sink = 0.75f;
  p.softmax_offset = &sink;
  flash_decode_forward(p, qkv.data(), qkv_query_layout(1, 1, 4), qkv.data(), qkv_key_layout(1, 1, 4), qkv.data(),
                       qkv_value_layout(1, 1, 4), 2, out, lse);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  EXPECT_FLOAT_EQ(lse[0], sink);
}

}  // namespace
}  // namespace gale
