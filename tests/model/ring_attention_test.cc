// Ring attention's partial-output merge: attention over two key blocks, merged, equals attention over all keys.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "model/ring_attention.h"
#include "testing.h"

namespace gale {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// B = 2, 2 query heads sharing 1 KV head, HD = 4; 3 queries at positions 0, 4, 5 against 6 keys
// at positions 0..5 (block A: 0..2, block B: 3..5), causal, with documents. The query at position
// 0 sees no key of block B; the query at position 5 of sample 1 is in a document no key has.
// Attention dropout is on.
struct Problem {
  static constexpr int64_t B = 2, NH = 2, KV = 1, HD = 4, Sq = 3, Sk = 6;
  std::vector<int32_t> q_pos{0, 4, 5}, k_pos{0, 1, 2, 3, 4, 5};
  std::vector<int32_t> q_docs{0, 0, 0, 0, 1, 9}, k_docs{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1};
  std::vector<float> q = testing::random_vector(Sq * B * NH * HD, 1), k = testing::random_vector(Sk * B * KV * HD, 2),
                     v = testing::random_vector(Sk * B * KV * HD, 3);

  AttentionProblem base() const {
    AttentionProblem p;
    p.B = B;
    p.Sq = Sq;
    p.Sk = Sk;
    p.NH = NH;
    p.KV = KV;
    p.HD = HD;
    p.scale = 0.5f;
    p.q_positions = q_pos.data();
    p.k_positions = k_pos.data();
    p.q_doc_ids = q_docs.data();
    p.k_doc_ids = k_docs.data();
    p.dropout_p = 0.3f;  // indexed by global positions, so the blocks draw the whole attention's masks
    p.dropout_seed = 5;
    p.dropout_stream = 7;
    p.heads_total = NH;
    p.max_positions = Sk;
    return p;
  }
  // The problem of the queries against keys [first, first + n); `docs` receives their document ids.
  AttentionProblem block(int64_t first, int64_t n, std::vector<int32_t>& docs) const {
    AttentionProblem p = base();
    p.Sk = n;
    p.k_positions = k_pos.data() + first;
    docs.clear();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = first; j < first + n; ++j) docs.push_back(k_docs[b * Sk + j]);
    p.k_doc_ids = docs.data();
    return p;
  }
  // Attention of the queries against keys [first, first + n): out [Sq·B, NH·HD], lse [B, NH, Sq].
  void run(int64_t first, int64_t n, std::vector<int32_t>& docs, std::vector<float>& out,
           std::vector<float>& lse) const {
    const AttentionProblem p = block(first, n, docs);
    out.assign(Sq * B * NH * HD, 0.0f);
    lse.assign(B * NH * Sq, 0.0f);
    const HeadLayout ql = contiguous_heads_layout(NH, HD), kl = contiguous_heads_layout(KV, HD);
    attention_forward_ref(p, q.data(), ql, k.data() + first * B * KV * HD, kl, v.data() + first * B * KV * HD, kl,
                          out.data(), lse.data());
  }
};

TEST(RingAttentionMerge, TwoBlocksMergeToTheWholeAttention) {
  const Problem pr;
  std::vector<int32_t> docs;
  std::vector<float> out, lse, out_a, lse_a, out_b, lse_b;
  pr.run(0, 6, docs, out, lse);
  pr.run(0, 3, docs, out_a, lse_a);
  pr.run(3, 3, docs, out_b, lse_b);
  // The cases the merge must handle are there: a query seeing no key of block B only, and one
  // seeing no key at all.
  EXPECT_EQ(lse_b[0], kNegInf);  // sample 0, head 0, query at position 0
  EXPECT_NE(lse_a[0], kNegInf);
  EXPECT_EQ(lse[(1 * Problem::NH + 0) * Problem::Sq + 2], kNegInf);  // sample 1, position 5, document 9
  for (int order = 0; order < 2; ++order) {  // A then B, and B then A
    std::vector<float> o = order == 0 ? out_a : out_b, l = order == 0 ? lse_a : lse_b;
    merge_attention_partial(Problem::B, Problem::NH, Problem::Sq, Problem::HD, o.data(), l.data(),
                            order == 0 ? out_b.data() : out_a.data(), order == 0 ? lse_b.data() : lse_a.data());
    for (size_t i = 0; i < lse.size(); ++i) {
      if (lse[i] == kNegInf)
        EXPECT_EQ(l[i], kNegInf) << i;
      else
        EXPECT_NEAR(l[i], lse[i], 1e-5f) << i;
    }
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(o[i], out[i], 1e-5f) << "order " << order << ", " << i;
  }
}

TEST(RingAttentionMerge, ABlockWithNoVisibleKeyLeavesTheQueryUnchanged) {
  // One query, one head of 2: the partial with lse −inf is ignored, whatever its out rows hold.
  std::vector<float> out{1.0f, 2.0f}, lse{0.5f};
  const std::vector<float> out_b{std::nanf(""), 7.0f}, lse_b{kNegInf};
  merge_attention_partial(1, 1, 1, 2, out.data(), lse.data(), out_b.data(), lse_b.data());
  EXPECT_EQ(out, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(lse[0], 0.5f);
  // A running result with no key yet takes the partial as it is.
  std::vector<float> none_out{0.0f, 0.0f}, none_lse{kNegInf};
  const std::vector<float> part{3.0f, 4.0f}, part_lse{1.25f};
  merge_attention_partial(1, 1, 1, 2, none_out.data(), none_lse.data(), part.data(), part_lse.data());
  EXPECT_EQ(none_out, part);
  EXPECT_EQ(none_lse[0], 1.25f);
  // Equal lse: the two outputs are averaged and lse grows by log 2.
  std::vector<float> a{1.0f, 3.0f}, la{0.0f};
  const std::vector<float> b{3.0f, 5.0f}, lb{0.0f};
  merge_attention_partial(1, 1, 1, 2, a.data(), la.data(), b.data(), lb.data());
  EXPECT_NEAR(a[0], 2.0f, 1e-6f);
  EXPECT_NEAR(a[1], 4.0f, 1e-6f);
  EXPECT_NEAR(la[0], std::log(2.0f), 1e-6f);
}

// What the ring's backward relies on: attention's backward over one key block with the whole
// attention's out and lse gives that block's share of dQ and exactly the block's dK, dV.
TEST(RingAttentionMerge, BackwardOverBlocksWithTheMergedLseSplitsTheGradient) {
  const Problem pr;
  using P = Problem;
  std::vector<int32_t> docs;
  std::vector<float> out, lse;
  pr.run(0, P::Sk, docs, out, lse);
  const std::vector<float> dout = testing::random_vector(P::Sq * P::B * P::NH * P::HD, 4);
  const HeadLayout ql = contiguous_heads_layout(P::NH, P::HD), kl = contiguous_heads_layout(P::KV, P::HD);
  const int64_t nq = P::Sq * P::B * P::NH * P::HD, kv_row = P::B * P::KV * P::HD;
  std::vector<float> dq(nq), dk(P::Sk * kv_row), dv(P::Sk * kv_row);
  attention_backward_ref(pr.base(), pr.q.data(), ql, pr.k.data(), kl, pr.v.data(), kl, out.data(), lse.data(),
                         dout.data(), dq.data(), dk.data(), dv.data());
  std::vector<float> dq_sum(nq, 0.0f), dq_part(nq), dk_part(3 * kv_row), dv_part(3 * kv_row);
  for (int64_t first : {0, 3}) {
    const AttentionProblem p = pr.block(first, 3, docs);
    attention_backward_ref(p, pr.q.data(), ql, pr.k.data() + first * kv_row, kl, pr.v.data() + first * kv_row, kl,
                           out.data(), lse.data(), dout.data(), dq_part.data(), dk_part.data(), dv_part.data());
    for (int64_t i = 0; i < nq; ++i) dq_sum[i] += dq_part[i];
    for (int64_t i = 0; i < 3 * kv_row; ++i) {
      EXPECT_NEAR(dk_part[i], dk[first * kv_row + i], 1e-5f) << first << ", " << i;
      EXPECT_NEAR(dv_part[i], dv[first * kv_row + i], 1e-5f) << first << ", " << i;
    }
  }
  for (int64_t i = 0; i < nq; ++i) EXPECT_NEAR(dq_sum[i], dq[i], 1e-5f) << i;
}

}  // namespace
}  // namespace gale
