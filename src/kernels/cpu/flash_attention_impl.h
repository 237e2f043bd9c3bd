// Flash attention on the CPU (templates over a simd type V): tiled, online softmax, never an
// [Sq, Sk] matrix. Semantics are exactly attention_forward_ref / attention_backward_ref's
// (kernels/cpu/attention.h): causal, document and sliding-window masks, logit soft-capping (a scalar
// pass over each Sᵀ tile after its product; backward scales dS by 1 − (capped / C)²), the ALiBi bias (added to Sᵀ before
// the masks, in forward and in backward's recomputed P), explicit positions, GQA, dropout on the
// probabilities with the reference's Philox mask (each query lane draws one Philox block per 4
// consecutive key positions and uses its 4 words), lse written by forward and used by backward.
//
// Scores are computed transposed, Sᵀ = K·(scale·Q)ᵀ for a tile of kFlashBlockK keys × kFlashBlockQ
// queries, so queries sit in vector lanes: the online softmax (running max m, sum l per query),
// the masks and dropout are plain vertical vector operations over key rows, with no horizontal
// reductions. Tile-product operands are copied next to each other first (Qᵀ, dOᵀ, and the K, V,
// Q, dO rows, rows_operand), never read where the rows of a head sit 4 KiB apart.
// Tiles the masks hide entirely are skipped, before any product: under the causal mask the key
// tiles after the query tile, under a sliding window W also the key tiles W or more positions
// behind every query of the tile, so a windowed sequence of S costs O(S·W) (plus an O(1) test per
// pair of tiles), not O(S²).
// Forward: one task per (batch, head, query tile), largest causal tiles first (dynamic schedule).
// For each key tile the masks do not hide entirely: Sᵀ, mask, m' = max(m, max_j S), α = e^(m − m'),
// P = e^(S − m'), l = α·l + Σ_j P, O = α·O + P'·V with P' = P after dropout. Finally O /= l and
// lse = m + log l. Sink logits (AttentionProblem::softmax_offset) start m at σ_h and l at 1.
// Backward needs nothing of the sink beyond lse (which includes it).
// Backward (FlashAttention-2): one task per (batch, head); key tiles outer, query tiles inner.
// P = exp(S − lse) is recomputed tile by tile, dP' = dO·Vᵀ, dS = P∘(dP − δ) with δ = rowsum(dO∘O),
// dV_j += P'ᵀ·dO, dK_j += dSᵀ·Q·scale, dQ += dS·K·scale (dQ accumulated in a per-task [Sq, HD]
// buffer, so nothing races). With GQA (NH/KV > 1) each query head writes its dK/dV contribution to
// its own [Sk, HD] buffer and the group's heads are summed in head order afterwards: results never
// depend on the thread count.
// Memory: per thread O(tile²) scratch in forward, O(Sq·HD) in backward; O(B·NH·Sk·HD) for GQA
// partials. Tile products use the register-blocked tile GEMM (tile_gemm_impl.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "core/threads.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/fused_common_impl.h"
#include "kernels/cpu/logit_softcap.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/tile_gemm_impl.h"

namespace gale::fused {

constexpr int64_t kFlashBlockQ = 64;  // queries per tile (the lanes of the transposed scores)
constexpr int64_t kFlashBlockK = 64;  // keys per tile
// Largest per-thread copy of one head's K and V rows the forward makes (see FlashForward::run).
constexpr int64_t kFlashForwardHeadKvBytes = int64_t{4} << 20;

namespace {

constexpr float kFlashNegInf = -std::numeric_limits<float>::infinity();

// Range of positions and document ids of the rows of one tile; consecutive: positions are
// pos_min, pos_min + 1, ... in row order (dropout then takes one Philox block per 4 key rows).
struct TileRange {
  int32_t pos_min, pos_max, doc_min, doc_max;
  bool consecutive;
};

enum class TileVisibility { kNone, kPartial, kFull };

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

inline int32_t attn_qpos(const AttentionProblem& p, int64_t i) {
  return p.q_positions ? p.q_positions[i] : static_cast<int32_t>(i);
}
inline int32_t attn_kpos(const AttentionProblem& p, int64_t j) {
  return p.k_positions ? p.k_positions[j] : static_cast<int32_t>(j);
}

// Per (batch, tile) ranges of the query and key tiles.
class AttentionTiles {
 public:
  AttentionTiles(const AttentionProblem& p, int64_t block_q, int64_t block_k)
      : nq_((p.Sq + block_q - 1) / block_q),
        nk_((p.Sk + block_k - 1) / block_k),
        buf_(sizeof(TileRange) * static_cast<size_t>(p.B * (nq_ + nk_))) {
    TileRange* r = buf_.as<TileRange>();
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t t = 0; t < nq_; ++t)
        r[b * nq_ + t] = range(p.q_doc_ids ? p.q_doc_ids + b * p.Sq : nullptr, t * block_q,
                               min_i64(p.Sq, (t + 1) * block_q), [&](int64_t i) { return attn_qpos(p, i); });
      for (int64_t t = 0; t < nk_; ++t)
        r[p.B * nq_ + b * nk_ + t] =
            range(p.k_doc_ids ? p.k_doc_ids + b * p.Sk : nullptr, t * block_k, min_i64(p.Sk, (t + 1) * block_k),
                  [&](int64_t j) { return attn_kpos(p, j); });
    }
    B_ = p.B;
  }
  int64_t num_q() const { return nq_; }
  int64_t num_k() const { return nk_; }
  const TileRange& q(int64_t b, int64_t t) const { return buf_.as<TileRange>()[b * nq_ + t]; }
  const TileRange& k(int64_t b, int64_t t) const { return buf_.as<TileRange>()[B_ * nq_ + b * nk_ + t]; }

 private:
  template <class PosFn>
  static TileRange range(const int32_t* docs, int64_t begin, int64_t end, PosFn&& pos) {
    TileRange r{pos(begin), pos(begin), docs ? docs[begin] : 0, docs ? docs[begin] : 0, true};
    for (int64_t i = begin; i < end; ++i) {
      const int32_t q = pos(i);
      r.consecutive = r.consecutive && q == pos(begin) + (i - begin);
      r.pos_min = q < r.pos_min ? q : r.pos_min;
      r.pos_max = q > r.pos_max ? q : r.pos_max;
      if (docs) {
        r.doc_min = docs[i] < r.doc_min ? docs[i] : r.doc_min;
        r.doc_max = docs[i] > r.doc_max ? docs[i] : r.doc_max;
      }
    }
    return r;
  }

  int64_t nq_, nk_, B_ = 0;
  ScratchBuffer buf_;
};

inline TileVisibility classify_tiles(const AttentionProblem& p, const TileRange& q, const TileRange& k) {
  const bool docs = p.q_doc_ids != nullptr;
  const bool window = p.window > 0;
  if (p.causal && k.pos_min > q.pos_max) return TileVisibility::kNone;
  if (window && int64_t{q.pos_min} - k.pos_max >= p.window) return TileVisibility::kNone;  // all behind the window
  if (docs && (k.doc_min > q.doc_max || k.doc_max < q.doc_min)) return TileVisibility::kNone;
  const bool causal_full = !p.causal || k.pos_max <= q.pos_min;
  const bool window_full = !window || int64_t{q.pos_max} - k.pos_min < p.window;
  const bool docs_full = !docs || (q.doc_min == q.doc_max && k.doc_min == k.doc_max && q.doc_min == k.doc_min);
  return causal_full && window_full && docs_full ? TileVisibility::kFull : TileVisibility::kPartial;
}

// Dropout counter of element (b, h, qpos, kpos = 0) (kernels/cpu/attention.h).
inline uint64_t attn_dropout_row_base(const AttentionProblem& p, int64_t b, int64_t h, int32_t qpos) {
  const uint64_t sample = static_cast<uint64_t>(p.sample_ids ? p.sample_ids[b] : b);
  const uint64_t mp = static_cast<uint64_t>(p.max_positions);
  return ((sample * static_cast<uint64_t>(p.heads_total) + static_cast<uint64_t>(p.head_offset + h)) * mp +
          static_cast<uint64_t>(qpos)) *
         mp;
}

}  // namespace

// Where the query/key/value heads and the output live (as attention_forward_ref's arguments).
struct AttentionIo {
  const float* q;
  HeadLayout ql;
  const float* k;
  HeadLayout kl;
  const float* v;
  HeadLayout vl;
};

// dst[r·ldd + c] = scale·src[r·stride + c] for c < HD, 0 for HD ≤ c < ldd.
template <class V>
void pack_rows(const float* src, int64_t stride, int64_t rows, int64_t HD, float scale, float* dst, int64_t ldd) {
  const typename V::F s = V::set1(scale);
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = src + r * stride;
    float* o = dst + r * ldd;
    for_vectors<V>(HD, [&](int64_t i, int64_t n) GALE_ALWAYS_INLINE { st<V>(o + i, V::mul(s, ld<V>(in + i, n)), n); });
    for (int64_t c = HD; c < ldd; ++c) o[c] = 0.0f;
  }
}

// dst[c·ldd + r] = scale·src[r·stride + c] for r < rows, c < HD; 0 for rows ≤ r < cols_padded
// (a multiple of W). W rows at a time with gathers, so the stores are whole vectors.
template <class V>
void pack_transposed(const float* src, int64_t stride, int64_t rows, int64_t cols_padded, int64_t HD, float scale,
                     float* dst, int64_t ldd) {
  using F = typename V::F;
  if (stride * V::W >= (int64_t{1} << 31)) {  // gather offsets are 32-bit: transpose element by element
    for (int64_t c = 0; c < HD; ++c)
      for (int64_t r = 0; r < cols_padded; ++r) dst[c * ldd + r] = r < rows ? scale * src[r * stride + c] : 0.0f;
    return;
  }
  const typename V::I offsets = V::imul(V::iota(), V::iset1(static_cast<uint32_t>(stride)));
  const F s = V::set1(scale);
  for (int64_t r0 = 0; r0 < cols_padded; r0 += V::W) {
    const int64_t n = rows - r0;
    const float* base = src + (n > 0 ? r0 * stride : 0);
    for (int64_t c = 0; c < HD; ++c)
      V::store(dst + c * ldd + r0, n > 0 ? V::mul(s, V::gather_n(base + c, offsets, n)) : V::zero());
  }
}

// Asks for the cache lines of n floats at `row` ahead of writing them (the rows of one head in
// the [T, ...] activations are far apart, so each row's stores would otherwise wait for its lines).
namespace {
inline void prefetch_for_write(float* row, int64_t n) {
  for (int64_t x = 0; x < n; x += 16) __builtin_prefetch(row + x, 1, 3);
}
}  // namespace
constexpr int64_t kFlashPrefetchRows = 8;

// Rows of a head as a tile-product operand of whole vectors: copied next to each other, with zero
// padding to HDp columns, into `scratch`. Always copied, even when HD is a multiple of W: in place,
// the rows of one head sit a multiple of 4 KiB apart in the [T, ...] activations (row stride
// B·3·H floats), so a tile product reading 64 of them keeps evicting them from the same few L1
// sets; the copy is read from L1 (measured: backward 14.5 → 11.4 ms, GPT-2-small shapes, 1 thread).
struct RowsRef {
  const float* p;
  int64_t stride;
};
template <class V>
RowsRef rows_operand(const float* first_row, int64_t stride, int64_t rows, int64_t HD, int64_t HDp, float* scratch) {
  pack_rows<V>(first_row, stride, rows, HD, 1.0f, scratch, HDp);
  return RowsRef{scratch, HDp};
}

// Per-lane data of one query tile: positions (also as floats, for the ALiBi bias), document ids,
// dropout counter bases.
struct QueryLanes {
  int32_t pos[kFlashBlockQ];
  float posf[kFlashBlockQ];
  int32_t doc[kFlashBlockQ];
  int32_t drop_lo[kFlashBlockQ];
  int32_t drop_hi[kFlashBlockQ];

  void init(const AttentionProblem& p, int64_t b, int64_t h, int64_t i0, int64_t mq) {
    for (int64_t c = 0; c < kFlashBlockQ; ++c) {
      const bool real = c < mq;
      pos[c] = real ? attn_qpos(p, i0 + c) : 0;
      posf[c] = static_cast<float>(pos[c]);
      doc[c] = real && p.q_doc_ids ? p.q_doc_ids[b * p.Sq + i0 + c] : 0;
      const uint64_t base = real && p.dropout_p > 0.0f ? attn_dropout_row_base(p, b, h, pos[c]) : 0;
      drop_lo[c] = static_cast<int32_t>(static_cast<uint32_t>(base));
      drop_hi[c] = static_cast<int32_t>(static_cast<uint32_t>(base >> 32));
    }
  }
};

// Key rows of a partial tile hidden from all of the real query lanes c .. c + W − 1 (of mq) by
// position alone: under a causal mask those past the lanes' largest position, under a sliding
// window those `window` or more positions behind their smallest. They need no exp or dropout mask.
template <class V>
class HiddenKeyRows {
 public:
  HiddenKeyRows(const AttentionProblem& p, const QueryLanes& q, int64_t c, int64_t mq, TileVisibility vis)
      : causal_(p.causal), window_(p.window), active_(vis == TileVisibility::kPartial && (p.causal || p.window > 0)) {
    if (!active_) return;
    const int64_t end = min_i64(c + V::W, mq);
    int32_t mx = q.pos[c], mn = q.pos[c];
    for (int64_t i = c + 1; i < end; ++i) {
      mx = q.pos[i] > mx ? q.pos[i] : mx;
      mn = q.pos[i] < mn ? q.pos[i] : mn;
    }
    qmax_ = mx;
    qmin_ = mn;
  }
  bool operator()(int32_t kpos) const {
    return active_ && ((causal_ && kpos > qmax_) || (window_ > 0 && qmin_ - int64_t{kpos} >= window_));
  }

 private:
  bool causal_;
  int64_t window_;
  bool active_;
  int32_t qmax_ = 0;
  int64_t qmin_ = 0;
};

// Which of the query lanes c .. c + W − 1 (of mq real ones) may see the key at position kpos in
// document kdoc.
template <class V>
typename V::M visible_lanes(const AttentionProblem& p, const QueryLanes& q, int64_t c, int64_t mq, int32_t kpos,
                            int32_t kdoc, TileVisibility vis) {
  typename V::M m = V::first(mq - c);
  if (vis == TileVisibility::kFull) return m;
  if (p.causal) m = V::mask_andnot(V::igt(V::iset1(static_cast<uint32_t>(kpos)), V::iload(q.pos + c)), m);
  if (p.window > 0) {  // hidden when qpos > kpos + window − 1 (no threshold above INT32_MAX hides anything)
    const int64_t last = kpos + p.window - 1;
    if (last < std::numeric_limits<int32_t>::max())
      m = V::mask_andnot(V::igt(V::iload(q.pos + c), V::iset1(static_cast<uint32_t>(static_cast<int32_t>(last)))), m);
  }
  if (p.q_doc_ids) m = V::mask_and(V::ieq(V::iload(q.doc + c), V::iset1(static_cast<uint32_t>(kdoc))), m);
  return m;
}

// ALiBi: S + m·(kpos − qpos) for the query lanes c .. c + W − 1 (qposf: their positions as floats;
// kpos − qpos is exact in floats, as the reference's m·float(kpos − qpos)).
template <class V>
typename V::F alibi_biased(typename V::F s, typename V::F slope, typename V::F qposf, int32_t kpos) {
  return V::add(s, V::mul(slope, V::sub(V::set1(static_cast<float>(kpos)), qposf)));
}

// Dropout masks of the query lanes c .. c + W − 1 for the rows of a key tile (row j at position
// kpos_j): index = lane base + kpos_j (kernels/cpu/attention.h); one Philox block per lane per 4 key
// rows when the tile's positions are consecutive. Forward and backward draw the same masks.
// Without dropout (drop false) it is never asked and prepares nothing.
template <class V>
simd::PhiloxDropoutLanes<V> key_dropout(const simd::PhiloxDropout<V>& d, const QueryLanes& q, int64_t c,
                                        const TileRange& k, bool drop) {
  return simd::PhiloxDropoutLanes<V>(d, V::iload(q.drop_lo + c), V::iload(q.drop_hi + c),
                                     static_cast<uint32_t>(k.pos_min), drop && k.consecutive);
}

template <class V>
class FlashForward {
 public:
  FlashForward(const AttentionProblem& p, const AttentionIo& io, float* out, float* lse)
      : p_(p),
        io_(io),
        out_(out),
        lse_(lse),
        tiles_(p, kFlashBlockQ, kFlashBlockK),
        hdp_(round_up(p.HD, V::W)),
        dropout_(p.dropout_seed, p.dropout_stream, p.dropout_p) {}

  void run() {
    const int64_t nq = tiles_.num_q(), heads = p_.B * p_.NH;
    if (heads * nq == 0) return;
    // With enough (batch, head) pairs for every thread, one task per pair: its K and V rows are
    // copied once (O(Sk·HD) per thread, at most kFlashForwardHeadKvBytes) instead of once per query
    // tile; otherwise one task per (batch, head, query tile), each copying its K/V tiles.
    const int64_t kv_floats = 2 * p_.Sk * hdp_;
    const bool per_head = nq > 1 && heads >= 4 * static_cast<int64_t>(num_threads()) &&
                          kv_floats * static_cast<int64_t>(sizeof(float)) <= kFlashForwardHeadKvBytes;
    const int64_t tasks = per_head ? heads : heads * nq;
    const int threads = static_cast<int>(min_i64(num_threads(), tasks));
#pragma omp parallel num_threads(threads)
    {
      // Per thread: Qᵀ [HD, BQ], Sᵀ [BK, BQ], K/V tile rows [BK, HDp], O [BQ, HDp], m, l, α [BQ],
      // and per head, K and V rows [Sk, HDp] each.
      const int64_t floats = p_.HD * kFlashBlockQ + kFlashBlockK * kFlashBlockQ + kFlashBlockK * hdp_ +
                             kFlashBlockQ * hdp_ + 3 * kFlashBlockQ;
      const size_t tile_bytes = sizeof(float) * static_cast<size_t>(floats) + sizeof(QueryLanes);
      ScratchBuffer scratch(tile_bytes + (per_head ? sizeof(float) * static_cast<size_t>(kv_floats) : 0));
      float* kv = reinterpret_cast<float*>(reinterpret_cast<char*>(scratch.floats()) + tile_bytes);
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        if (per_head) {
          const int64_t b = task / p_.NH, h = task % p_.NH, g = h / (p_.NH / p_.KV);
          float* krows = kv;
          float* vrows = kv + p_.Sk * hdp_;
          pack_rows<V>(io_.k + io_.kl.offset(b, g), p_.B * io_.kl.row_stride, p_.Sk, p_.HD, 1.0f, krows, hdp_);
          pack_rows<V>(io_.v + io_.vl.offset(b, g), p_.B * io_.vl.row_stride, p_.Sk, p_.HD, 1.0f, vrows, hdp_);
          for (int64_t qt = nq - 1; qt >= 0; --qt) query_tile(b, h, qt, scratch.floats(), krows, vrows);
        } else {
          // Query tiles in decreasing order: under a causal mask the last tiles are the longest.
          const int64_t qt = nq - 1 - task / heads, bh = task % heads;
          query_tile(bh / p_.NH, bh % p_.NH, qt, scratch.floats(), nullptr, nullptr);
        }
      }
    }
  }

 private:
  // krows_all/vrows_all: the head's K and V rows already copied ([Sk, HDp]), or null.
  void query_tile(int64_t b, int64_t h, int64_t qt, float* scratch, const float* krows_all, const float* vrows_all) {
    using F = typename V::F;
    constexpr int64_t BQ = kFlashBlockQ;
    const int64_t HD = p_.HD, g = h / (p_.NH / p_.KV);
    const int64_t i0 = qt * BQ, mq = min_i64(BQ, p_.Sq - i0);
    float* qt_packed = scratch;
    float* st = qt_packed + HD * BQ;
    float* vrows = st + kFlashBlockK * BQ;
    float* o = vrows + kFlashBlockK * hdp_;
    float* m = o + BQ * hdp_;
    float* l = m + BQ;
    float* alpha = l + BQ;
    QueryLanes& lanes = *reinterpret_cast<QueryLanes*>(alpha + BQ);
    lanes.init(p_, b, h, i0, mq);
    const int64_t q_stride = p_.B * io_.ql.row_stride, k_stride = p_.B * io_.kl.row_stride,
                  v_stride = p_.B * io_.vl.row_stride;
    pack_transposed<V>(io_.q + io_.ql.offset(b, h) + i0 * q_stride, q_stride, mq, BQ, HD, p_.scale, qt_packed, BQ);
    // --softmax-type: the sink logit σ_h starts every row's running max and sum (m = σ, l = e^0),
    // so it enters the normaliser exactly once and rows that see no key end with O = 0, lse = σ.
    const bool sink = p_.softmax_offset != nullptr;
    for (int64_t i = 0; i < BQ; ++i) {
      m[i] = sink ? p_.softmax_offset[h] : kFlashNegInf;
      l[i] = sink ? 1.0f : 0.0f;
    }
    std::memset(o, 0, sizeof(float) * static_cast<size_t>(mq * hdp_));
    const float* kg = io_.k + io_.kl.offset(b, g);
    const float* vg = io_.v + io_.vl.offset(b, g);
    const int32_t* kdocs = p_.k_doc_ids ? p_.k_doc_ids + b * p_.Sk : nullptr;
    const bool drop = p_.dropout_p > 0.0f;
    const F ninf = V::set1(kFlashNegInf), keep_scale = V::set1(drop ? dropout_.keep_scale() : 1.0f);
    const bool alibi = p_.alibi_slopes != nullptr;
    const F slope = V::set1(alibi ? p_.alibi_slopes[p_.head_offset + h] : 0.0f);
    for (int64_t kt = 0; kt < tiles_.num_k(); ++kt) {
      const TileVisibility vis = classify_tiles(p_, tiles_.q(b, qt), tiles_.k(b, kt));
      if (vis == TileVisibility::kNone) continue;
      const int64_t j0 = kt * kFlashBlockK, nk = min_i64(kFlashBlockK, p_.Sk - j0);
      // Sᵀ [nk, BQ] = K_j · (scale·Q)ᵀ, K read in place.
      const RowsRef kr = krows_all ? RowsRef{krows_all + j0 * hdp_, hdp_}
                                   : rows_operand<V>(kg + j0 * k_stride, k_stride, nk, HD, hdp_, vrows);  // free till P·V
      tile_gemm<V>(nk, BQ / V::W, HD, TileOperandA{kr.p, kr.stride, 1}, qt_packed, BQ, st, BQ, false);
      softcap_inplace(st, nk * BQ, p_.softcap);  // --attn-logit-softcapping (padding lanes stay 0)
      for (int64_t c = 0; c < BQ; c += V::W) {
        if (c >= mq) break;
        // Key rows hidden from the whole vector by position (causal / window partial tiles).
        const HiddenKeyRows<V> hidden(p_, lanes, c, mq, vis);
        const F qposf = V::load(lanes.posf + c);
        F mx = ninf;
        for (int64_t j = 0; j < nk; ++j) {
          float* sp = st + j * BQ + c;
          const int32_t kpos = attn_kpos(p_, j0 + j);
          if (hidden(kpos)) continue;
          const F score = alibi ? alibi_biased<V>(V::load(sp), slope, qposf, kpos) : V::load(sp);
          const F sv =
              V::select(visible_lanes<V>(p_, lanes, c, mq, kpos, kdocs ? kdocs[j0 + j] : 0, vis), score, ninf);
          V::store(sp, sv);
          mx = V::max(mx, sv);
        }
        const F m_old = V::load(m + c);
        const F m_new = V::max(m_old, mx);
        // Queries that see nothing yet keep m = −inf; exponentiate against 0 there (P = α = 0).
        const F m_safe = V::select(V::eq(m_new, ninf), V::zero(), m_new);
        const F a = simd::exp<V>(V::sub(m_old, m_safe));
        simd::PhiloxDropoutLanes<V> keep = key_dropout<V>(dropout_, lanes, c, tiles_.k(b, kt), drop);
        F sum = V::zero();
        for (int64_t j = 0; j < nk; ++j) {
          float* sp = st + j * BQ + c;
          const int32_t kpos = attn_kpos(p_, j0 + j);
          if (hidden(kpos)) {  // P = 0 in every lane
            V::store(sp, V::zero());
            continue;
          }
          F e = simd::exp<V>(V::sub(V::load(sp), m_safe));
          sum = V::add(sum, e);
          if (drop) e = V::select(keep.keep(j, static_cast<uint32_t>(kpos)), V::mul(e, keep_scale), V::zero());
          V::store(sp, e);
        }
        V::store(l + c, V::fmadd(V::load(l + c), a, sum));
        V::store(m + c, m_new);
        V::store(alpha + c, a);
      }
      for (int64_t i = 0; i < mq; ++i) {
        if (alpha[i] == 1.0f) continue;
        float* orow = o + i * hdp_;
        const F va = V::set1(alpha[i]);
        for (int64_t x = 0; x < hdp_; x += V::W) V::store(orow + x, V::mul(va, V::load(orow + x)));
      }
      // O += P'·V: P' is Sᵀ read transposed.
      const RowsRef vr = vrows_all ? RowsRef{vrows_all + j0 * hdp_, hdp_}
                                   : rows_operand<V>(vg + j0 * v_stride, v_stride, nk, HD, hdp_, vrows);
      tile_gemm<V>(mq, hdp_ / V::W, nk, TileOperandA{st, 1, BQ}, vr.p, vr.stride, o, hdp_, true);
    }
    // O /= l, lse = m + log l; rows that see no key get O = 0 and lse = −inf.
    const int64_t out_row = p_.NH * HD, out_stride = p_.B * out_row;
    float* out = out_ + b * out_row + h * HD + i0 * out_stride;
    float* lse = lse_ + (b * p_.NH + h) * p_.Sq + i0;
    for (int64_t i = 0; i < mq; ++i) {
      if (i + kFlashPrefetchRows < mq) prefetch_for_write(out + (i + kFlashPrefetchRows) * out_stride, HD);
      const float li = l[i];
      pack_rows<V>(o + i * hdp_, 0, 1, HD, li > 0.0f ? 1.0f / li : 0.0f, out + i * out_stride, HD);
      // NaN scores leave l = NaN: keep it (the reference's lse is NaN too), else −inf for no keys.
      lse[i] = li > 0.0f ? m[i] + static_cast<float>(log_f64(static_cast<double>(li))) : li == 0.0f ? kFlashNegInf : li;
    }
  }

  const AttentionProblem& p_;
  AttentionIo io_;
  float* out_;
  float* lse_;
  AttentionTiles tiles_;
  int64_t hdp_;
  simd::PhiloxDropout<V> dropout_;
};

template <class V>
class FlashBackward {
 public:
  FlashBackward(const AttentionProblem& p, const AttentionIo& io, const float* out, const float* lse, const float* dout,
                float* dq, float* dk, float* dv)
      : p_(p),
        io_(io),
        out_(out),
        lse_(lse),
        dout_(dout),
        dq_(dq),
        dk_(dk),
        dv_(dv),
        tiles_(p, kFlashBlockQ, kFlashBlockK),
        hdp_(round_up(p.HD, V::W)),
        sqp_(round_up(p.Sq, kFlashBlockQ)),
        dropout_(p.dropout_seed, p.dropout_stream, p.dropout_p) {}

  void run() {
    const int64_t tasks = p_.B * p_.NH;
    if (tasks == 0) return;
    const int64_t per_group = p_.NH / p_.KV;
    // GQA: per-head dK/dV contributions, summed per group afterwards.
    ScratchBuffer partial;
    if (per_group > 1) partial.reserve(sizeof(float) * static_cast<size_t>(2 * tasks * p_.Sk * p_.HD));
    partial_ = partial.floats();
    const int threads = static_cast<int>(min_i64(num_threads(), tasks));
#pragma omp parallel num_threads(threads)
    {
      const int64_t floats = 2 * p_.HD * sqp_ + sqp_ + p_.Sq * hdp_ + 2 * p_.Sq * hdp_ +
                             2 * kFlashBlockK * kFlashBlockQ + 4 * kFlashBlockK * hdp_;
      ScratchBuffer scratch(sizeof(float) * static_cast<size_t>(floats) + sizeof(QueryLanes));
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) head(task / p_.NH, task % p_.NH, scratch.floats());
    }
    if (per_group > 1) sum_group_partials();
  }

 private:
  void head(int64_t b, int64_t h, float* scratch) {
    using F = typename V::F;
    constexpr int64_t BQ = kFlashBlockQ, BK = kFlashBlockK;
    const int64_t HD = p_.HD, g = h / (p_.NH / p_.KV);
    float* qt_all = scratch;              // (scale·Q)ᵀ [HD, Sqp]
    float* dot_all = qt_all + HD * sqp_;  // dOᵀ [HD, Sqp]
    float* delta = dot_all + HD * sqp_;   // [Sqp]
    float* dq_acc = delta + sqp_;         // [Sq, HDp]
    float* rows_scratch = dq_acc + p_.Sq * hdp_;
    float* st = rows_scratch + 2 * p_.Sq * hdp_;  // Sᵀ, then P'ᵀ [BK, BQ]
    float* dpt = st + BK * BQ;                    // dP'ᵀ, then dSᵀ [BK, BQ]
    float* dk_acc = dpt + BK * BQ;                // [BK, HDp]
    float* dv_acc = dk_acc + BK * hdp_;
    float* krows = dv_acc + BK * hdp_;
    float* vrows = krows + BK * hdp_;
    QueryLanes& lanes = *reinterpret_cast<QueryLanes*>(vrows + BK * hdp_);

    const int64_t out_row = p_.NH * HD, out_stride = p_.B * out_row;
    const float* out_h = out_ + b * out_row + h * HD;
    const float* dout_h = dout_ + b * out_row + h * HD;
    const float* lse_h = lse_ + (b * p_.NH + h) * p_.Sq;
    const int64_t q_stride = p_.B * io_.ql.row_stride, k_stride = p_.B * io_.kl.row_stride,
                  v_stride = p_.B * io_.vl.row_stride;
    const float* qh = io_.q + io_.ql.offset(b, h);
    const float* kg = io_.k + io_.kl.offset(b, g);
    const float* vg = io_.v + io_.vl.offset(b, g);
    const int32_t* kdocs = p_.k_doc_ids ? p_.k_doc_ids + b * p_.Sk : nullptr;

    // Q and dO rows copied together first (rows_operand), then transposed from the copies.
    const RowsRef qrows = rows_operand<V>(qh, q_stride, p_.Sq, HD, hdp_, rows_scratch);
    const RowsRef dorows = rows_operand<V>(dout_h, out_stride, p_.Sq, HD, hdp_, rows_scratch + p_.Sq * hdp_);
    pack_transposed<V>(qrows.p, qrows.stride, p_.Sq, sqp_, HD, p_.scale, qt_all, sqp_);
    pack_transposed<V>(dorows.p, dorows.stride, p_.Sq, sqp_, HD, 1.0f, dot_all, sqp_);
    // δ_i = dO_i · O_i
    for (int64_t i = 0; i < sqp_; ++i) {
      if (i >= p_.Sq) {
        delta[i] = 0.0f;
        continue;
      }
      F acc = V::zero();
      const float* a = dout_h + i * out_stride;
      const float* c = out_h + i * out_stride;
      for_vectors<V>(
          HD, [&](int64_t x, int64_t n) GALE_ALWAYS_INLINE { acc = V::fmadd(ld<V>(a + x, n), ld<V>(c + x, n), acc); });
      delta[i] = V::reduce_add(acc);
    }
    std::memset(dq_acc, 0, sizeof(float) * static_cast<size_t>(p_.Sq * hdp_));

    const bool drop = p_.dropout_p > 0.0f;
    const F ninf = V::set1(kFlashNegInf), keep_scale = V::set1(drop ? dropout_.keep_scale() : 1.0f);
    const bool alibi = p_.alibi_slopes != nullptr;
    const F slope = V::set1(alibi ? p_.alibi_slopes[p_.head_offset + h] : 0.0f);
    const bool softcap = p_.softcap > 0.0f;
    const F inv_cap = V::set1(softcap ? 1.0f / p_.softcap : 0.0f);
    for (int64_t kt = 0; kt < tiles_.num_k(); ++kt) {
      const int64_t j0 = kt * BK, nk = min_i64(BK, p_.Sk - j0);
      std::memset(dk_acc, 0, sizeof(float) * static_cast<size_t>(nk * hdp_));
      std::memset(dv_acc, 0, sizeof(float) * static_cast<size_t>(nk * hdp_));
      const float* kj = kg + j0 * k_stride;
      const float* vj = vg + j0 * v_stride;
      RowsRef kr{nullptr, 0}, vr{nullptr, 0};
      for (int64_t qt = 0; qt < tiles_.num_q(); ++qt) {
        const TileVisibility vis = classify_tiles(p_, tiles_.q(b, qt), tiles_.k(b, kt));
        if (vis == TileVisibility::kNone) continue;
        if (kr.p == nullptr) {
          kr = rows_operand<V>(kj, k_stride, nk, HD, hdp_, krows);
          vr = rows_operand<V>(vj, v_stride, nk, HD, hdp_, vrows);
        }
        const int64_t i0 = qt * BQ, mq = min_i64(BQ, p_.Sq - i0);
        lanes.init(p_, b, h, i0, mq);
        // Sᵀ = K_j·(scale·Q_i)ᵀ and dP'ᵀ = V_j·dO_iᵀ, [nk, BQ].
        tile_gemm<V>(nk, BQ / V::W, HD, TileOperandA{kr.p, kr.stride, 1}, qt_all + i0, sqp_, st, BQ, false);
        softcap_inplace(st, nk * BQ, p_.softcap);  // --attn-logit-softcapping: as forward's scores
        tile_gemm<V>(nk, BQ / V::W, HD, TileOperandA{vr.p, vr.stride, 1}, dot_all + i0, sqp_, dpt, BQ, false);
        for (int64_t c = 0; c < BQ; c += V::W) {
          if (c >= mq) break;
          const F vlse = V::load_n(lse_h + i0 + c, mq - c, kFlashNegInf);
          const typename V::M has_keys = V::gt(vlse, ninf);
          const F vdelta = V::load(delta + i0 + c);
          simd::PhiloxDropoutLanes<V> keep = key_dropout<V>(dropout_, lanes, c, tiles_.k(b, kt), drop);
          const HiddenKeyRows<V> hidden(p_, lanes, c, mq, vis);
          const F qposf = V::load(lanes.posf + c);
          for (int64_t j = 0; j < nk; ++j) {
            float* sp = st + j * BQ + c;
            float* dp = dpt + j * BQ + c;
            const int32_t kpos = attn_kpos(p_, j0 + j);
            if (hidden(kpos)) {  // hidden from every lane: P' = dS = 0
              V::store(sp, V::zero());
              V::store(dp, V::zero());
              continue;
            }
            const typename V::M visible =
                V::mask_and(has_keys, visible_lanes<V>(p_, lanes, c, mq, kpos, kdocs ? kdocs[j0 + j] : 0, vis));
            // P = exp(S − lse) where visible, else 0.
            const F capped = V::load(sp);
            const F score = alibi ? alibi_biased<V>(capped, slope, qposf, kpos) : capped;
            const F prob = V::select(visible, simd::exp<V>(V::sub(score, vlse)), V::zero());
            F dprob = V::load(dp);
            F dropped = prob;
            if (drop) {
              const typename V::M kept = keep.keep(j, static_cast<uint32_t>(kpos));
              dropped = V::select(kept, V::mul(prob, keep_scale), V::zero());
              dprob = V::select(kept, V::mul(dprob, keep_scale), V::zero());
            }
            V::store(sp, dropped);                              // P'ᵀ (for dV)
            F ds = V::mul(prob, V::sub(dprob, vdelta));  // dSᵀ
            if (softcap) {  // of the uncapped scores: dS · (1 − (capped / C)²)
              const F t = V::mul(capped, inv_cap);
              ds = V::mul(ds, V::sub(V::set1(1.0f), V::mul(t, t)));
            }
            V::store(dp, ds);
          }
        }
        // dV_j += P'ᵀ·dO_i,  dK_j += dSᵀ·Q_i (scale later),  dQ_i += dS·K_j (scale later).
        tile_gemm<V>(nk, hdp_ / V::W, mq, TileOperandA{st, BQ, 1}, dorows.p + i0 * dorows.stride, dorows.stride, dv_acc,
                     hdp_, true);
        tile_gemm<V>(nk, hdp_ / V::W, mq, TileOperandA{dpt, BQ, 1}, qrows.p + i0 * qrows.stride, qrows.stride, dk_acc,
                     hdp_, true);
        tile_gemm<V>(mq, hdp_ / V::W, nk, TileOperandA{dpt, 1, BQ}, kr.p, kr.stride, dq_acc + i0 * hdp_, hdp_, true);
      }
      // Hand the key tile's dK, dV over (zeros when no query saw it).
      float* dk_dst;
      float* dv_dst;
      int64_t dk_stride, dv_stride;
      if (partial_) {
        dk_dst = partial_ + ((b * p_.NH + h) * 2) * p_.Sk * HD + j0 * HD;
        dv_dst = dk_dst + p_.Sk * HD;
        dk_stride = dv_stride = HD;
      } else {
        dk_dst = dk_ + io_.kl.offset(b, g) + j0 * k_stride;
        dv_dst = dv_ + io_.vl.offset(b, g) + j0 * v_stride;
        dk_stride = k_stride;
        dv_stride = v_stride;
      }
      for (int64_t j = 0; j < nk; ++j) {
        if (j + kFlashPrefetchRows < nk) {
          prefetch_for_write(dk_dst + (j + kFlashPrefetchRows) * dk_stride, HD);
          prefetch_for_write(dv_dst + (j + kFlashPrefetchRows) * dv_stride, HD);
        }
        pack_rows<V>(dk_acc + j * hdp_, 0, 1, HD, p_.scale, dk_dst + j * dk_stride, HD);
        pack_rows<V>(dv_acc + j * hdp_, 0, 1, HD, 1.0f, dv_dst + j * dv_stride, HD);
      }
    }
    float* dqh = dq_ + io_.ql.offset(b, h);
    for (int64_t i = 0; i < p_.Sq; ++i) {
      if (i + kFlashPrefetchRows < p_.Sq) prefetch_for_write(dqh + (i + kFlashPrefetchRows) * q_stride, HD);
      pack_rows<V>(dq_acc + i * hdp_, 0, 1, HD, p_.scale, dqh + i * q_stride, HD);
    }
  }

  // dK/dV of group g = Σ over its query heads, in head order.
  void sum_group_partials() {
    const int64_t HD = p_.HD, per_group = p_.NH / p_.KV;
    const int64_t k_stride = p_.B * io_.kl.row_stride, v_stride = p_.B * io_.vl.row_stride;
    parallel_for(p_.B * p_.KV * p_.Sk, 64, [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t b = u / (p_.KV * p_.Sk), g = (u / p_.Sk) % p_.KV, j = u % p_.Sk;
        float* dk_row = dk_ + io_.kl.offset(b, g) + j * k_stride;
        float* dv_row = dv_ + io_.vl.offset(b, g) + j * v_stride;
        for (int64_t x = 0; x < 2; ++x) {
          float* dst = x == 0 ? dk_row : dv_row;
          for (int64_t hh = 0; hh < per_group; ++hh) {
            const float* src = partial_ + ((b * p_.NH + g * per_group + hh) * 2 + x) * p_.Sk * HD + j * HD;
            if (hh == 0)
              std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(HD));
            else
              add_into<V>(dst, src, HD);
          }
        }
      }
    });
  }

  const AttentionProblem& p_;
  AttentionIo io_;
  const float* out_;
  const float* lse_;
  const float* dout_;
  float *dq_, *dk_, *dv_;
  AttentionTiles tiles_;
  int64_t hdp_, sqp_;
  simd::PhiloxDropout<V> dropout_;
  float* partial_ = nullptr;
};

template <class V>
void flash_attention_forward(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                             const HeadLayout& kl, const float* v, const HeadLayout& vl, float* out, float* lse) {
  FlashForward<V>(p, AttentionIo{q, ql, k, kl, v, vl}, out, lse).run();
}

template <class V>
void flash_attention_backward(const AttentionProblem& p, const float* q, const HeadLayout& ql, const float* k,
                              const HeadLayout& kl, const float* v, const HeadLayout& vl, const float* out,
                              const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  FlashBackward<V>(p, AttentionIo{q, ql, k, kl, v, vl}, out, lse, dout, dq, dk, dv).run();
}

}  // namespace gale::fused
