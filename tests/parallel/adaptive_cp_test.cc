// Adaptive context parallelism's layouts (parallel/adaptive_cp.h): exact block counts, the blocks it empties and the work it balances.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "parallel/adaptive_cp.h"

namespace gale {
namespace {

// Document ids of `B` samples of S positions cut into documents of `len` positions (the last shorter).
std::vector<int32_t> fixed_documents(int64_t B, int64_t S, int64_t len) {
  std::vector<int32_t> ids(static_cast<size_t>(B * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) ids[b * S + s] = static_cast<int32_t>(s / len);
  return ids;
}

// The mask by definition: causal, same document, inside the window.
bool visible(const CpMaskSpec& m, int64_t b, int64_t q, int64_t k) {
  if (k > q) return false;
  if (m.window > 0 && q - k >= m.window) return false;
  return !m.document_ids || m.document_ids[b * m.S + q] == m.document_ids[b * m.S + k];
}

// Every layout holds each position once, S/N per rank in ascending order, and its block counts
// are the visible pairs counted one by one (a block called empty must be empty: it is skipped).
void expect_exact(const CpMaskSpec& m, const CpLayout& l) {
  const int64_t N = l.cp_size, Sl = m.S / N;
  ASSERT_EQ(l.seq_length, m.S);
  ASSERT_EQ(static_cast<int64_t>(l.positions.size()), m.S);
  std::vector<int32_t> sorted = l.positions;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t p = 0; p < m.S; ++p) ASSERT_EQ(sorted[p], p);
  for (int64_t r = 0; r < N; ++r)
    EXPECT_TRUE(std::is_sorted(l.positions.begin() + r * Sl, l.positions.begin() + (r + 1) * Sl)) << "rank " << r;
  for (int64_t qr = 0; qr < N; ++qr)
    for (int64_t kr = 0; kr < N; ++kr) {
      int64_t pairs = 0;
      for (int64_t b = 0; b < m.B; ++b)
        for (int64_t i = 0; i < Sl; ++i)
          for (int64_t j = 0; j < Sl; ++j) pairs += visible(m, b, l.position(qr, i), l.position(kr, j)) ? 1 : 0;
      EXPECT_EQ(l.pairs(qr, kr), pairs) << "block (" << qr << ", " << kr << ")";
    }
}

int64_t busiest_blocks(const CpLayout& l) {
  int64_t n = 0;
  for (int64_t r = 0; r < l.cp_size; ++r) n = std::max(n, l.nonempty_in_row(r));
  return n;
}

int64_t busiest_pairs(const CpLayout& l) {
  int64_t n = 0;
  for (int64_t r = 0; r < l.cp_size; ++r) {
    int64_t row = 0;
    for (int64_t k = 0; k < l.cp_size; ++k) row += l.pairs(r, k);
    n = std::max(n, row);
  }
  return n;
}

TEST(AdaptiveCp, UnitsAreFlashTilesAndAtMost1024) {
  EXPECT_EQ(adaptive_cp_units(4096, 4, true), 64);      // tiles of 64 positions
  EXPECT_EQ(adaptive_cp_units(131072, 4, true), 1024);  // S/1024 = 128 positions per unit
  EXPECT_EQ(adaptive_cp_units(6000, 4, true), 80);      // the largest divisor below 6000/64 that 4 divides
  EXPECT_EQ(adaptive_cp_units(64, 4, true), 16);        // 4 units per rank below a tile
  EXPECT_EQ(adaptive_cp_units(4096, 4, false), 4096);   // --adaptive-cp-without-coarse: single positions
}

TEST(AdaptiveCp, DocumentMaskSkipsMostBlocksAndBalancesThem) {
  // Two samples of 64 positions in documents of 5 (the second sample: of 7), CP 4: Megatron's split
  // cuts documents at 7 of its 8 chunk boundaries, and its ranks hold chunks from both ends.
  const int64_t S = 64, N = 4;
  std::vector<int32_t> ids = fixed_documents(2, S, 5);
  const std::vector<int32_t> second = fixed_documents(1, S, 7);
  std::copy(second.begin(), second.end(), ids.begin() + S);
  const CpMaskSpec m{2, S, ids.data(), 0};
  const CpLayout megatron = load_balanced_cp_layout(m, N), contiguous = contiguous_cp_layout(m, N);
  const CpLayout adaptive = adaptive_cp_layout(m, N, {});
  const CpLayout in_order = adaptive_cp_layout(m, N, AdaptiveCpOptions{false, true});
  for (const CpLayout* l : {&megatron, &contiguous, &adaptive, &in_order}) expect_exact(m, *l);
  // --adaptive-cp-only-reschedule keeps the sequence in order.
  EXPECT_EQ(in_order.positions, contiguous.positions);
  // Counted by hand: the contiguous ranks (16 positions) share a document with the rank before
  // them in both samples (boundaries 16, 32, 48 fall inside documents of 5 and of 7), so 4 + 3
  // blocks; Megatron's ranks meet at 14 chunk boundaries.
  EXPECT_EQ(contiguous.nonempty_blocks(), 7);
  EXPECT_GT(megatron.nonempty_blocks(), contiguous.nonempty_blocks());
  // The adaptive layout: no more non-empty blocks than either, at most 2 per rank, and the work of
  // its busiest rank no more than the contiguous split's.
  EXPECT_LE(adaptive.nonempty_blocks(), contiguous.nonempty_blocks());
  EXPECT_LE(busiest_blocks(adaptive), 2);
  EXPECT_LE(busiest_pairs(adaptive), busiest_pairs(contiguous));
  // Most of the ring's 16 attention calls are skipped: 16 - 7 at least.
  EXPECT_GE(N * N - adaptive.nonempty_blocks(), 9);
  std::printf("documents of 5 and 7, S 64, CP 4: non-empty blocks %lld adaptive (busiest rank %lld, %lld pairs), "
              "%lld contiguous, %lld Megatron (busiest %lld, %lld pairs)\n",
              static_cast<long long>(adaptive.nonempty_blocks()), static_cast<long long>(busiest_blocks(adaptive)),
              static_cast<long long>(busiest_pairs(adaptive)), static_cast<long long>(contiguous.nonempty_blocks()),
              static_cast<long long>(megatron.nonempty_blocks()), static_cast<long long>(busiest_blocks(megatron)),
              static_cast<long long>(busiest_pairs(megatron)));
}

TEST(AdaptiveCp, AlignedDocumentsLeaveOnlyTheDiagonal) {
  // Documents of 8 in 64 positions at CP 4: a remap puts whole documents on every rank, so only
  // the 4 diagonal blocks are left, each with the same work.
  const int64_t S = 64, N = 4;
  const std::vector<int32_t> ids = fixed_documents(1, S, 8);
  const CpMaskSpec m{1, S, ids.data(), 0};
  const CpLayout adaptive = adaptive_cp_layout(m, N, {});
  expect_exact(m, adaptive);
  EXPECT_EQ(adaptive.nonempty_blocks(), N);
  for (int64_t r = 0; r < N; ++r) EXPECT_EQ(adaptive.pairs(r, r), 2 * (8 * 9 / 2)) << "rank " << r;
}

TEST(AdaptiveCp, CausalMaskKeepsTheWorkBalanced) {
  // Plain causal attention has no empty block to gain; the layout must balance the work as
  // Megatron's split does (every rank the same pairs), not fall back to the contiguous split.
  for (int64_t N : {2, 4}) {
    const int64_t S = 16 * N;
    const CpMaskSpec m{1, S, nullptr, 0};
    const CpLayout megatron = load_balanced_cp_layout(m, N), adaptive = adaptive_cp_layout(m, N, {});
    expect_exact(m, adaptive);
    EXPECT_LE(busiest_blocks(adaptive), busiest_blocks(megatron)) << "CP " << N;
    EXPECT_LE(busiest_pairs(adaptive), busiest_pairs(megatron)) << "CP " << N;
    EXPECT_LT(busiest_pairs(adaptive), busiest_pairs(contiguous_cp_layout(m, N))) << "CP " << N;
  }
}

TEST(AdaptiveCp, SlidingWindowIsBanded) {
  // --sliding-window 5 over 64 positions, CP 4: the contiguous band touches only the block before
  // the diagonal, so 7 blocks; the adaptive layout needs no more, and without coarsening neither.
  const int64_t S = 64, N = 4;
  const CpMaskSpec m{1, S, nullptr, 5};
  const CpLayout contiguous = contiguous_cp_layout(m, N);
  EXPECT_EQ(contiguous.nonempty_blocks(), 7);
  for (const CpLayout& l : {adaptive_cp_layout(m, N, {}), adaptive_cp_layout(m, N, AdaptiveCpOptions{true, false})}) {
    expect_exact(m, l);
    EXPECT_LE(l.nonempty_blocks(), 7);
  }
  expect_exact(m, contiguous);
}

TEST(AdaptiveCp, UnsortedDocumentIdsAreCountedExactly) {
  // Ids that are not runs (not what the data loader makes) take the exact fallback count.
  const int64_t S = 32, N = 2;
  std::vector<int32_t> ids(S);
  for (int64_t s = 0; s < S; ++s) ids[s] = static_cast<int32_t>((s / 3) % 2);
  const CpMaskSpec m{1, S, ids.data(), 0};
  expect_exact(m, adaptive_cp_layout(m, N, {}));
  expect_exact(m, contiguous_cp_layout(m, N));
}

TEST(AdaptiveCp, PlannerComputesOnceUnlessDynamic) {
  const CpMaskSpec causal{1, 32, nullptr, 0};
  AdaptiveCpPlanner once(2, {}, /*dynamic=*/false);
  const auto first = once.layout_for(causal);
  EXPECT_EQ(once.layout_for(causal), first);  // the same object, reused
  EXPECT_EQ(once.layouts_computed(), 1);
  AdaptiveCpPlanner dynamic(2, {}, /*dynamic=*/true);
  const std::vector<int32_t> a = fixed_documents(1, 32, 4), b = fixed_documents(1, 32, 16);
  const auto la = dynamic.layout_for({1, 32, a.data(), 0});
  const auto lb = dynamic.layout_for({1, 32, b.data(), 0});
  EXPECT_EQ(dynamic.layouts_computed(), 2);
  EXPECT_NE(la->block_pairs, lb->block_pairs);
}

}  // namespace
}  // namespace gale
