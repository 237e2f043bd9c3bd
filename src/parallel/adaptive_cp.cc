// Adaptive context parallelism: the mask's unit pairs, the remap search and the layouts it yields.
#include "parallel/adaptive_cp.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "core/check.h"
#include "parallel/context_split.h"

namespace gale {

namespace {

// Visible (query, key) pairs between query unit a and key unit b, summed over the samples:
// w[a·G + b]. Query q sees the keys of an interval ending at q (causal; the window's start; its
// document's start when the ids are sorted, as the data loader makes them); unsorted ids fall back
// to testing every key of the window.
std::vector<int64_t> unit_pairs(const CpMaskSpec& m, int64_t G) {
  const int64_t S = m.S, u = S / G;
  std::vector<int64_t> w(static_cast<size_t>(G * G), 0);
  for (int64_t b = 0; b < m.B; ++b) {
    const int32_t* doc = m.document_ids ? m.document_ids + b * S : nullptr;
    bool sorted = true;
    for (int64_t i = 1; doc && i < S; ++i) sorted = sorted && doc[i] >= doc[i - 1];
    int64_t start = 0;  // first position of q's document (sorted ids)
    for (int64_t q = 0; q < S; ++q) {
      if (doc && q > 0 && doc[q] != doc[q - 1]) start = q;
      int64_t lo = m.window > 0 ? std::max<int64_t>(0, q - m.window + 1) : 0;
      int64_t* row = w.data() + (q / u) * G;
      if (doc && !sorted) {
        for (int64_t k = lo; k <= q; ++k)
          if (doc[k] == doc[q]) ++row[k / u];
        continue;
      }
      if (doc) lo = std::max(lo, start);
      for (int64_t ub = lo / u; ub <= q / u; ++ub) row[ub] += std::min(q, (ub + 1) * u - 1) - std::max(lo, ub * u) + 1;
    }
  }
  return w;
}

// The cost of a layout's block counts (adaptive_cp.h): attention calls of the busiest rank,
// visible pairs of the busiest rank, non-empty blocks.
using Cost = std::tuple<int64_t, int64_t, int64_t>;

Cost cost_of(const std::vector<int64_t>& cnt, int64_t N) {
  int64_t max_blocks = 0, max_pairs = 0, blocks = 0;
  for (int64_t r = 0; r < N; ++r) {
    int64_t row_blocks = 0, row_pairs = 0;
    for (int64_t k = 0; k < N; ++k) {
      const int64_t c = cnt[static_cast<size_t>(r * N + k)];
      row_blocks += c > 0 ? 1 : 0;
      row_pairs += c;
    }
    max_blocks = std::max(max_blocks, row_blocks);
    max_pairs = std::max(max_pairs, row_pairs);
    blocks += row_blocks;
  }
  return {max_blocks, max_pairs, blocks};
}

// Whether cost `a` is better than `b`: fewer calls on the busiest rank; or as many, and the
// busiest rank's pairs down by more than 1/32; or no more pairs and fewer non-empty blocks; or
// the same blocks and fewer pairs. (A pairs gain within 1/32 does not buy an extra non-empty
// block.) Every accepted step lowers (calls, pairs, blocks) lexicographically, so the search ends.
bool better(const Cost& a, const Cost& b) {
  const auto& [calls_a, pairs_a, blocks_a] = a;
  const auto& [calls_b, pairs_b, blocks_b] = b;
  if (calls_a != calls_b) return calls_a < calls_b;
  if (32 * pairs_a < 31 * pairs_b) return true;
  if (pairs_a <= pairs_b && blocks_a < blocks_b) return true;
  return pairs_a < pairs_b && blocks_a == blocks_b;
}

std::vector<int64_t> block_counts(const std::vector<int64_t>& w, const std::vector<int64_t>& owner, int64_t N) {
  const int64_t G = static_cast<int64_t>(owner.size());
  std::vector<int64_t> cnt(static_cast<size_t>(N * N), 0);
  for (int64_t a = 0; a < G; ++a)
    for (int64_t b = 0; b < G; ++b) cnt[static_cast<size_t>(owner[a] * N + owner[b])] += w[static_cast<size_t>(a * G + b)];
  return cnt;
}

// The layout of a unit assignment (owner[x]: the rank of unit x).
CpLayout layout_of(const std::vector<int64_t>& w, const std::vector<int64_t>& owner, int64_t N, int64_t S) {
  const int64_t G = static_cast<int64_t>(owner.size()), u = S / G;
  CpLayout l;
  l.cp_size = N;
  l.seq_length = S;
  l.positions.reserve(static_cast<size_t>(S));
  for (int64_t r = 0; r < N; ++r) {
    int64_t units = 0;
    for (int64_t x = 0; x < G; ++x) {
      if (owner[x] != r) continue;
      ++units;
      for (int64_t p = x * u; p < (x + 1) * u; ++p) l.positions.push_back(static_cast<int32_t>(p));
    }
    GALE_CHECK_EQ(units * N, G) << "adaptive cp: rank " << r << " holds " << units << " of " << G << " units";
  }
  l.block_pairs = block_counts(w, owner, N);
  for (int64_t r = 0; r < N; ++r)
    GALE_CHECK(l.nonempty(r, r)) << "adaptive cp: every query sees itself, so block (" << r << ", " << r << ") has pairs";
  return l;
}

std::vector<int64_t> contiguous_owner(int64_t G, int64_t N) {
  std::vector<int64_t> owner(static_cast<size_t>(G));
  for (int64_t x = 0; x < G; ++x) owner[x] = x / (G / N);
  return owner;
}

// Megatron's split at unit granularity (G a multiple of 2N): chunk c of 2N goes to rank c or 2N − 1 − c.
std::vector<int64_t> load_balanced_owner(int64_t G, int64_t N) {
  std::vector<int64_t> owner(static_cast<size_t>(G));
  const int64_t per_chunk = G / (2 * N);
  for (int64_t x = 0; x < G; ++x) {
    const int64_t c = x / per_chunk;
    owner[x] = c < N ? c : 2 * N - 1 - c;
  }
  return owner;
}

// Swaps of two units on different ranks while the cost falls (adaptive_cp.h), at most `budget`
// candidate swaps. R[x·N + k] / C[x·N + k]: the pairs of unit x as query / key with the units of
// rank k, kept up to date so that a candidate costs O(N²).
void improve_by_swaps(const std::vector<int64_t>& w, int64_t N, std::vector<int64_t>& owner, int64_t budget) {
  const int64_t G = static_cast<int64_t>(owner.size());
  const auto W = [&](int64_t a, int64_t b) { return w[static_cast<size_t>(a * G + b)]; };
  std::vector<int64_t> R(static_cast<size_t>(G * N), 0), C(static_cast<size_t>(G * N), 0);
  for (int64_t x = 0; x < G; ++x)
    for (int64_t y = 0; y < G; ++y) {
      R[static_cast<size_t>(x * N + owner[y])] += W(x, y);
      C[static_cast<size_t>(x * N + owner[y])] += W(y, x);
    }
  std::vector<int64_t> cnt = block_counts(w, owner, N), trial;
  Cost cost = cost_of(cnt, N);
  int64_t evaluated = 0;
  for (bool improved = true; improved && evaluated < budget;) {
    improved = false;
    for (int64_t a = 0; a < G && evaluated < budget; ++a)
      for (int64_t c = a + 1; c < G && evaluated < budget; ++c) {
        const int64_t i = owner[a], j = owner[c];
        if (i == j) continue;
        ++evaluated;
        trial = cnt;
        const auto at = [&](int64_t p, int64_t q) -> int64_t& { return trial[static_cast<size_t>(p * N + q)]; };
        const int64_t waa = W(a, a), wcc = W(c, c), wac = W(a, c), wca = W(c, a);
        for (int64_t k = 0; k < N; ++k) {
          // a and c as queries, against the keys other than a and c (they move rows i <-> j) ...
          const int64_t ra = R[a * N + k] - (k == i ? waa : 0) - (k == j ? wac : 0);
          const int64_t rc = R[c * N + k] - (k == j ? wcc : 0) - (k == i ? wca : 0);
          at(i, k) += rc - ra;
          at(j, k) += ra - rc;
          // ... and as keys, against the queries other than a and c (they move columns).
          const int64_t ca = C[a * N + k] - (k == i ? waa : 0) - (k == j ? wca : 0);
          const int64_t cc = C[c * N + k] - (k == j ? wcc : 0) - (k == i ? wac : 0);
          at(k, i) += cc - ca;
          at(k, j) += ca - cc;
        }
        // The pairs among a and c themselves.
        at(i, i) += wcc - waa;
        at(j, j) += waa - wcc;
        at(i, j) += wca - wac;
        at(j, i) += wac - wca;
        const Cost c2 = cost_of(trial, N);
        if (!better(c2, cost)) continue;
        cost = c2;
        cnt.swap(trial);
        for (int64_t x = 0; x < G; ++x) {
          R[x * N + i] += W(x, c) - W(x, a);
          R[x * N + j] += W(x, a) - W(x, c);
          C[x * N + i] += W(c, x) - W(a, x);
          C[x * N + j] += W(a, x) - W(c, x);
        }
        std::swap(owner[a], owner[c]);
        improved = true;
      }
  }
  GALE_CHECK(cnt == block_counts(w, owner, N)) << "adaptive cp: the swap search's block counts drifted";
}

void check_mask(const CpMaskSpec& m, int64_t N) {
  GALE_CHECK(N >= 1 && m.S > 0 && m.S % N == 0 && m.B >= 1)
      << "adaptive cp: " << m.B << " sequences of " << m.S << " positions over " << N << " ranks";
}

}  // namespace

int64_t adaptive_cp_units(int64_t S, int64_t N, bool coarse) {
  if (!coarse) return S;
  // Units of at least S/1024 positions and of a flash-attention tile (64), but at least 4 per rank.
  const int64_t unit = std::max<int64_t>({1, S / 1024, std::min<int64_t>(64, S / (4 * N))});
  int64_t best = N;
  for (int64_t g = N; g <= S / unit; g += N)
    if (S % g == 0) best = g;
  return best;
}

CpLayout load_balanced_cp_layout(const CpMaskSpec& mask, int64_t N) {
  check_mask(mask, N);
  GALE_CHECK_EQ(mask.S % (2 * N), 0) << "Megatron's split needs 2N chunks";
  const int64_t G = 2 * N;
  return layout_of(unit_pairs(mask, G), load_balanced_owner(G, N), N, mask.S);
}

CpLayout contiguous_cp_layout(const CpMaskSpec& mask, int64_t N) {
  check_mask(mask, N);
  return layout_of(unit_pairs(mask, N), contiguous_owner(N, N), N, mask.S);
}

CpLayout adaptive_cp_layout(const CpMaskSpec& mask, int64_t N, const AdaptiveCpOptions& options) {
  check_mask(mask, N);
  if (!options.remap) return contiguous_cp_layout(mask, N);
  const int64_t G = adaptive_cp_units(mask.S, N, options.coarse);
  const std::vector<int64_t> w = unit_pairs(mask, G);
  std::vector<int64_t> owner = contiguous_owner(G, N);
  if (G % (2 * N) == 0) {
    std::vector<int64_t> balanced = load_balanced_owner(G, N);
    if (better(cost_of(block_counts(w, balanced, N), N), cost_of(block_counts(w, owner, N), N))) owner.swap(balanced);
  }
  improve_by_swaps(w, N, owner, /*budget=*/int64_t{1} << 18);
  return layout_of(w, owner, N, mask.S);
}

CpLayout hybrid_cp_layout(std::shared_ptr<const CpLayout> ring, int64_t U) {
  GALE_CHECK(ring && U >= 1 && ring->local_length() % (2 * U) == 0)
      << "hybrid adaptive cp: ring blocks of " << (ring ? ring->local_length() : 0) << " positions over " << U
      << " Ulysses ranks";
  const int64_t R = ring->cp_size, N = R * U, Sb = ring->local_length(), Sl = Sb / U;
  CpLayout l;
  l.cp_size = N;
  l.seq_length = ring->seq_length;
  l.positions.resize(static_cast<size_t>(ring->seq_length));
  for (int64_t c = 0; c < N; ++c) {
    const ContextSplit inner{Sb, U, c % U, {}};
    for (int64_t s = 0; s < Sl; ++s) l.positions[c * Sl + s] = ring->position(c / U, inner.global_position(s));
  }
  l.ring = std::move(ring);
  return l;
}

std::shared_ptr<const CpLayout> AdaptiveCpPlanner::layout_for(const CpMaskSpec& mask) {
  if (cached_ && !dynamic_ && cached_->seq_length == mask.S) {
    GALE_CHECK(!mask.document_ids) << "adaptive cp: a layout reused for a document mask (needs the dynamic mode)";
    return cached_;
  }
  cached_ = std::make_shared<const CpLayout>(adaptive_cp_layout(mask, N_, options_));
  ++computed_;
  return cached_;
}

}  // namespace gale
