// Ring attention on cp groups of 2, 3 and 4 ranks, as one ring, a double ring (--cp-window-size) and with the key/value cache: each rank's output, lse and dQ, dK, dV equal the rows of one attention over the whole sequence.
//
// The odd ring (3 ranks, a sub-group of a 4-rank world) sends and receives to different peers
// every step, so a gradient passed the wrong way round fails here even where the 2-rank ring
// (whose two neighbours are one rank) cannot tell; so does the double ring of 4 ranks in windows
// of 2, whose gradients cross to the next window one inner rank further on. Under an adaptive
// layout (adaptive_cp_algo: positions chosen from the document mask) the ring skips exactly the
// blocks the layout counts as empty, and every block still travels (backward's bytes unchanged). GQA (4 query heads,
// 2 key/value groups), causal and document masks and attention dropout are on. The cache also
// shows in the bytes backward moves: the gradient blocks only (full), plus the values (half).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/attention.h"
#include "model/ring_attention.h"
#include "mpi_test_env.h"
#include "parallel/adaptive_cp.h"
#include "testing.h"

namespace gale {
namespace {

constexpr int64_t B = 2, NH = 4, KV = 2, HD = 8, C = 3;  // C: positions per chunk
constexpr int64_t Wqkv = (NH + 2 * KV) * HD;

// Backward's bytes over the cp group (sent plus received) for blocks of `block` floats.
int64_t expected_backward_bytes(int64_t N, int64_t block, RingKvCache cache) {
  const int64_t kv = cache == RingKvCache::kFull ? 0 : cache == RingKvCache::kHalf ? (N - 1) * block / 2 : (N - 1) * block;
  return 2 * 4 * (kv + N * block);
}

void expect_ring_matches_whole_sequence(int64_t N, RingOptions opts = {}, bool adaptive = false) {
  Comm world = test::world();
  if (world->size() < N) GTEST_SKIP() << "needs " << N << " ranks";
  std::vector<int> members;
  if (world->rank() < N)
    for (int r = 0; r < N; ++r) members.push_back(r);
  Comm cp = world->make_group(members, "cp");
  if (!cp) return;  // a rank outside the ring
  const int64_t S = 2 * N * C;
  ContextSplit split{S, N, cp->rank(), {}};
  const int64_t Sl = split.local_length(), Tl = Sl * B;
  const HeadLayout ql = qkv_query_layout(NH, KV, HD), kl = qkv_key_layout(NH, KV, HD), vl = qkv_value_layout(NH, KV, HD);

  // The whole sequence: packed QKV, documents of 5 positions, the output's gradient.
  const std::vector<float> qkv = testing::random_vector(S * B * Wqkv, 11);
  const std::vector<float> dout = testing::random_vector(S * B * NH * HD, 12);
  std::vector<int32_t> docs(B * S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) docs[b * S + s] = static_cast<int32_t>((s + 2 * b) / 5);
  if (adaptive) {
    split.layout = std::make_shared<const CpLayout>(adaptive_cp_layout({B, S, docs.data(), 0}, N, {}));
    // At CP 2 the layout balances the work over all 4 blocks; at CP 4 some are left empty.
    if (N == 4) ASSERT_LT(split.layout->nonempty_blocks(), N * N) << "a mask with empty blocks";
  }
  AttentionProblem whole;
  whole.B = B;
  whole.Sq = whole.Sk = S;
  whole.NH = NH;
  whole.KV = KV;
  whole.HD = HD;
  whole.scale = 1.0f / std::sqrt(static_cast<float>(HD));
  whole.q_doc_ids = whole.k_doc_ids = docs.data();
  whole.dropout_p = 0.2f;
  whole.dropout_seed = 3;
  whole.dropout_stream = 4;
  whole.heads_total = NH;
  whole.max_positions = S;
  std::vector<float> out(S * B * NH * HD), lse(B * NH * S), dqkv(S * B * Wqkv);
  attention_forward_ref(whole, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out.data(), lse.data());
  attention_backward_ref(whole, qkv.data(), ql, qkv.data(), kl, qkv.data(), vl, out.data(), lse.data(), dout.data(),
                         dqkv.data(), dqkv.data(), dqkv.data());

  // This rank's rows and the all-gather problem of its positions.
  const std::vector<int32_t> pos = split.local_positions();
  std::vector<float> qkv_l(Tl * Wqkv), dout_l(Tl * NH * HD);
  std::vector<int32_t> docs_l(B * Sl);
  for (int64_t s = 0; s < Sl; ++s)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t t = s * B + b, g = pos[s] * B + b;
      std::copy_n(qkv.data() + g * Wqkv, Wqkv, qkv_l.data() + t * Wqkv);
      std::copy_n(dout.data() + g * NH * HD, NH * HD, dout_l.data() + t * NH * HD);
      docs_l[b * Sl + s] = docs[b * S + pos[s]];
    }
  AttentionProblem ap = whole;
  ap.Sq = Sl;
  ap.q_positions = pos.data();
  ap.q_doc_ids = docs_l.data();
  std::vector<float> out_l(Tl * NH * HD), lse_l(B * NH * Sl), dqkv_l(Tl * Wqkv);
  const RingSaved kept = ring_attention_forward(*cp, split, opts, attention_forward_ref, ap, qkv_l.data(), ql, kl, vl,
                                                out_l.data(), lse_l.data());
  EXPECT_EQ(kept.local_kv.numel(), Tl * 2 * KV * HD) << "this rank's block";
  EXPECT_EQ(kept.skipped_blocks, adaptive ? N - split.layout->nonempty_in_row(cp->rank()) : 0) << "blocks skipped";
  const int64_t cached = opts.cache == RingKvCache::kFull ? 2 : opts.cache == RingKvCache::kHalf ? 1 : 0;
  EXPECT_EQ(kept.cache.defined() ? kept.cache.numel() : 0, (N - 1) * Tl * cached * KV * HD) << "the blocks received";
  cp->reset_stats();
  ring_attention_backward(*cp, split, opts, attention_backward_ref, ap, qkv_l.data(), ql, kept, out_l.data(),
                          lse_l.data(), dout_l.data(), dqkv_l.data(), kl, vl);
  EXPECT_EQ(cp->stats().total_bytes(), expected_backward_bytes(N, Tl * 2 * KV * HD, opts.cache));
  for (int64_t s = 0; s < Sl; ++s)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t t = s * B + b, g = pos[s] * B + b;
      for (int64_t c = 0; c < NH * HD; ++c)
        ASSERT_NEAR(out_l[t * NH * HD + c], out[g * NH * HD + c], 1e-5f) << "out, position " << pos[s];
      for (int64_t h = 0; h < NH; ++h)
        ASSERT_NEAR(lse_l[(b * NH + h) * Sl + s], lse[(b * NH + h) * S + pos[s]], 1e-5f) << "lse, position " << pos[s];
      for (int64_t c = 0; c < Wqkv; ++c)
        ASSERT_NEAR(dqkv_l[t * Wqkv + c], dqkv[g * Wqkv + c], 1e-5f)
            << "dQKV column " << c << ", position " << pos[s] << ", cp rank " << cp->rank() << " of " << N;
    }
}

TEST(RingAttention, TwoRanksMatchTheWholeSequence) { expect_ring_matches_whole_sequence(2); }
TEST(RingAttention, ThreeRanksMatchTheWholeSequence) { expect_ring_matches_whole_sequence(3); }
TEST(RingAttention, FourRanksMatchTheWholeSequence) { expect_ring_matches_whole_sequence(4); }
TEST(RingAttention, DoubleRingMatchesTheWholeSequence) { expect_ring_matches_whole_sequence(4, {2, RingKvCache::kNone}); }
TEST(RingAttention, FullCacheTwoRanks) { expect_ring_matches_whole_sequence(2, {1, RingKvCache::kFull}); }
TEST(RingAttention, FullCacheThreeRanks) { expect_ring_matches_whole_sequence(3, {1, RingKvCache::kFull}); }
TEST(RingAttention, HalfCacheTwoRanks) { expect_ring_matches_whole_sequence(2, {1, RingKvCache::kHalf}); }
TEST(RingAttention, HalfCacheThreeRanks) { expect_ring_matches_whole_sequence(3, {1, RingKvCache::kHalf}); }
TEST(RingAttention, DoubleRingFullCache) { expect_ring_matches_whole_sequence(4, {2, RingKvCache::kFull}); }
TEST(RingAttention, DoubleRingHalfCache) { expect_ring_matches_whole_sequence(4, {2, RingKvCache::kHalf}); }
TEST(RingAttention, AdaptiveLayoutTwoRanks) { expect_ring_matches_whole_sequence(2, {}, true); }
TEST(RingAttention, AdaptiveLayoutThreeRanks) { expect_ring_matches_whole_sequence(3, {}, true); }
TEST(RingAttention, AdaptiveLayoutFourRanks) { expect_ring_matches_whole_sequence(4, {}, true); }

}  // namespace
}  // namespace gale
