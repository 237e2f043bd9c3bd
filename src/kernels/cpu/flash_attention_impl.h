// Flash attention on the CPU (templates over a simd type V): tiled, online softmax, never an
// [Sq, Sk] matrix. Semantics are exactly attention_forward_ref / attention_backward_ref's
// (kernels/cpu/attention.h): causal and document masks, explicit positions, GQA, dropout on the
// probabilities with the reference's Philox mask, lse written by forward and used by backward.
//
// Forward: one task per (batch, head, query tile of kBlockQ rows), largest causal tiles first
// (dynamic schedule). For each key tile of kBlockK keys that the masks do not hide entirely:
// S = (scale·Q)·Kᵀ, mask, online softmax update of (row max m, row sum l), O = O·α + P'·V where
// P' is P with dropout applied. Finally O /= l and lse = m + log l.
// Backward (FlashAttention-2): one task per (batch, head); key tiles outer, query tiles inner.
// P = exp(S − lse) is recomputed tile by tile, dP' = dO·Vᵀ, dS = P∘(dP − δ) with δ = rowsum(dO∘O),
// dV_j += P'ᵀ·dO, dK_j += dSᵀ·(scale·Q), dQ += dS·K (dQ accumulated in a per-task [Sq, HD] buffer,
// so nothing races). With GQA (NH/KV > 1) each query head writes its dK/dV contribution to its own
// [Sk, HD] buffer and the group's heads are summed in head order afterwards: results never depend
// on the thread count.
// Memory: per thread O(tile²) scratch (+ O(Sq·HD) for dQ in backward); O(B·NH·Sk·HD) for GQA
// partials. Products use the register-blocked tile GEMM (tile_gemm_impl.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "core/threads.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/fused_common_impl.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/tile_gemm_impl.h"

namespace gale::fused {

constexpr int64_t kFlashBlockQ = 64;
constexpr int64_t kFlashBlockK = 64;

namespace {

constexpr float kFlashNegInf = -std::numeric_limits<float>::infinity();

// Range of positions and document ids of the rows of one tile.
struct TileRange {
  int32_t pos_min, pos_max, doc_min, doc_max;
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
      : nq_((p.Sq + block_q - 1) / block_q), nk_((p.Sk + block_k - 1) / block_k),
        buf_(sizeof(TileRange) * static_cast<size_t>(p.B * (nq_ + nk_))) {
    TileRange* r = buf_.as<TileRange>();
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t t = 0; t < nq_; ++t)
        r[b * nq_ + t] = range(p.q_doc_ids ? p.q_doc_ids + b * p.Sq : nullptr, t * block_q,
                               min_i64(p.Sq, (t + 1) * block_q), [&](int64_t i) { return attn_qpos(p, i); });
      for (int64_t t = 0; t < nk_; ++t)
        r[p.B * nq_ + b * nk_ + t] = range(p.k_doc_ids ? p.k_doc_ids + b * p.Sk : nullptr, t * block_k,
                                           min_i64(p.Sk, (t + 1) * block_k), [&](int64_t j) { return attn_kpos(p, j); });
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
    TileRange r{pos(begin), pos(begin), docs ? docs[begin] : 0, docs ? docs[begin] : 0};
    for (int64_t i = begin; i < end; ++i) {
      const int32_t q = pos(i);
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
  if (p.causal && k.pos_min > q.pos_max) return TileVisibility::kNone;
  if (docs && (k.doc_min > q.doc_max || k.doc_max < q.doc_min)) return TileVisibility::kNone;
  const bool causal_full = !p.causal || k.pos_max <= q.pos_min;
  const bool docs_full =
      !docs || (q.doc_min == q.doc_max && k.doc_min == k.doc_max && q.doc_min == k.doc_min);
  return causal_full && docs_full ? TileVisibility::kFull : TileVisibility::kPartial;
}

// Dropout counter of element (b, h, qpos, kpos = 0) (kernels/cpu/attention.h).
inline uint64_t attn_dropout_row_base(const AttentionProblem& p, int64_t b, int64_t h, int32_t qpos) {
  const uint64_t sample = static_cast<uint64_t>(p.sample_ids ? p.sample_ids[b] : b);
  const uint64_t mp = static_cast<uint64_t>(p.max_positions);
  return ((sample * static_cast<uint64_t>(p.heads_total) + static_cast<uint64_t>(p.head_offset + h)) * mp +
          static_cast<uint64_t>(qpos)) * mp;
}

inline float scalar_exp(float x) { return static_cast<float>(exp_f64(static_cast<double>(x))); }

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

// dst[c·ldd + r] = src[r·stride + c] for r < rows; 0 for rows ≤ r < ldd.
template <class V>
void pack_transposed(const float* src, int64_t stride, int64_t rows, int64_t HD, float* dst, int64_t ldd) {
  for (int64_t c = 0; c < HD; ++c) {
    float* o = dst + c * ldd;
    for (int64_t r = 0; r < rows; ++r) o[r] = src[r * stride + c];
    for (int64_t r = rows; r < ldd; ++r) o[r] = 0.0f;
  }
}

// Sets the hidden scores of query row i (batch b) against keys j0 .. j0 + nk − 1 to −inf, and the
// padding columns nk .. width − 1 too.
template <class V>
void mask_score_row(const AttentionProblem& p, int64_t b, int64_t i, int64_t j0, int64_t nk, int64_t width, float* s,
                    TileVisibility vis) {
  using F = typename V::F;
  using I = typename V::I;
  using M = typename V::M;
  const F ninf = V::set1(kFlashNegInf);
  if (vis == TileVisibility::kFull) {
    for (int64_t jj = nk / V::W * V::W; jj < width; jj += V::W)
      V::store(s + jj, V::select(V::first(nk - jj), V::load(s + jj), ninf));
    return;
  }
  const I qpos = V::iset1(static_cast<uint32_t>(attn_qpos(p, i)));
  const I qdoc = V::iset1(p.q_doc_ids ? static_cast<uint32_t>(p.q_doc_ids[b * p.Sq + i]) : 0u);
  for (int64_t jj = 0; jj < width; jj += V::W) {
    const int64_t n = nk - jj;
    M visible = V::first(n);
    if (p.causal) {
      const I kpos = p.k_positions ? V::iload_n(p.k_positions + j0 + jj, n)
                                   : V::iadd(V::iota(), V::iset1(static_cast<uint32_t>(j0 + jj)));
      visible = V::mask_andnot(V::igt(kpos, qpos), visible);
    }
    if (p.q_doc_ids) visible = V::mask_and(V::ieq(V::iload_n(p.k_doc_ids + b * p.Sk + j0 + jj, n), qdoc), visible);
    V::store(s + jj, V::select(visible, V::load(s + jj), ninf));
  }
}

// Key positions of lanes jj .. jj + W − 1 of a key tile starting at j0 (for dropout counters).
template <class V>
typename V::I key_positions(const AttentionProblem& p, int64_t j0, int64_t jj, int64_t nk) {
  return p.k_positions ? V::iload_n(p.k_positions + j0 + jj, nk - jj)
                       : V::iadd(V::iota(), V::iset1(static_cast<uint32_t>(j0 + jj)));
}

template <class V>
class FlashForward {
 public:
  FlashForward(const AttentionProblem& p, const AttentionIo& io, float* out, float* lse)
      : p_(p), io_(io), out_(out), lse_(lse), tiles_(p, kFlashBlockQ, kFlashBlockK), hdp_(round_up(p.HD, V::W)),
        bk_(round_up(kFlashBlockK, V::W)), dropout_(p.dropout_seed, p.dropout_stream, p.dropout_p) {}

  void run() {
    const int64_t nq = tiles_.num_q(), tasks = p_.B * p_.NH * nq;
    if (tasks == 0) return;
    const int threads = static_cast<int>(min_i64(num_threads(), tasks));
#pragma omp parallel num_threads(threads)
    {
      // Per thread: Qs [BQ, HD], Kᵀ [HD, BK], S [BQ, BK], V [BK, HDp], O [BQ, HDp], m, l [BQ].
      const int64_t floats = kFlashBlockQ * p_.HD + p_.HD * bk_ + kFlashBlockQ * bk_ + bk_ * hdp_ +
                             kFlashBlockQ * hdp_ + 2 * kFlashBlockQ;
      ScratchBuffer scratch(sizeof(float) * static_cast<size_t>(floats));
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        // Query tiles in decreasing order: under a causal mask the last tiles are the longest.
        const int64_t qt = nq - 1 - task / (p_.B * p_.NH), bh = task % (p_.B * p_.NH);
        query_tile(bh / p_.NH, bh % p_.NH, qt, scratch.floats());
      }
    }
  }

 private:
  void query_tile(int64_t b, int64_t h, int64_t qt, float* scratch) {
    using F = typename V::F;
    const int64_t HD = p_.HD, g = h / (p_.NH / p_.KV);
    const int64_t i0 = qt * kFlashBlockQ, mq = min_i64(kFlashBlockQ, p_.Sq - i0);
    float* qs = scratch;
    float* kt = qs + kFlashBlockQ * HD;
    float* s = kt + HD * bk_;
    float* vp = s + kFlashBlockQ * bk_;
    float* o = vp + bk_ * hdp_;
    float* row_max = o + kFlashBlockQ * hdp_;
    float* row_sum = row_max + kFlashBlockQ;
    const int64_t q_stride = p_.B * io_.ql.row_stride, k_stride = p_.B * io_.kl.row_stride,
                  v_stride = p_.B * io_.vl.row_stride;
    pack_rows<V>(io_.q + io_.ql.offset(b, h) + i0 * q_stride, q_stride, mq, HD, p_.scale, qs, HD);
    for (int64_t i = 0; i < mq; ++i) {
      row_max[i] = kFlashNegInf;
      row_sum[i] = 0.0f;
    }
    std::memset(o, 0, sizeof(float) * static_cast<size_t>(mq * hdp_));
    const float* kg = io_.k + io_.kl.offset(b, g);
    const float* vg = io_.v + io_.vl.offset(b, g);
    const bool drop = p_.dropout_p > 0.0f;
    const F keep_scale = V::set1(drop ? dropout_.keep_scale() : 1.0f);
    for (int64_t kt_index = 0; kt_index < tiles_.num_k(); ++kt_index) {
      const TileVisibility vis = classify_tiles(p_, tiles_.q(b, qt), tiles_.k(b, kt_index));
      if (vis == TileVisibility::kNone) continue;
      const int64_t j0 = kt_index * kFlashBlockK, nk = min_i64(kFlashBlockK, p_.Sk - j0);
      const int64_t width = round_up(nk, V::W);
      pack_transposed<V>(kg + j0 * k_stride, k_stride, nk, HD, kt, bk_);
      pack_rows<V>(vg + j0 * v_stride, v_stride, nk, HD, 1.0f, vp, hdp_);
      tile_gemm<V>(mq, width / V::W, HD, TileOperandA{qs, HD, 1}, kt, bk_, s, bk_, false);
      for (int64_t i = 0; i < mq; ++i) {
        float* sr = s + i * bk_;
        mask_score_row<V>(p_, b, i0 + i, j0, nk, width, sr, vis);
        F mv = V::set1(kFlashNegInf);
        for (int64_t jj = 0; jj < width; jj += V::W) mv = V::max(mv, V::load(sr + jj));
        const float m_old = row_max[i];
        const float tile_max = V::reduce_max(mv);
        const float m_new = tile_max > m_old ? tile_max : m_old;
        if (m_new == kFlashNegInf) {  // nothing visible yet: P = 0
          for (int64_t jj = 0; jj < width; jj += V::W) V::store(sr + jj, V::zero());
          continue;
        }
        const F vm = V::set1(m_new);
        F sum = V::zero();
        const uint64_t drop_base = drop ? attn_dropout_row_base(p_, b, h, attn_qpos(p_, i0 + i)) : 0;
        for (int64_t jj = 0; jj < width; jj += V::W) {
          F e = simd::exp<V>(V::sub(V::load(sr + jj), vm));
          sum = V::add(sum, e);
          if (drop)
            e = V::select(dropout_.keep(drop_base, key_positions<V>(p_, j0, jj, nk)), V::mul(e, keep_scale), V::zero());
          V::store(sr + jj, e);
        }
        const float alpha = m_old == kFlashNegInf ? 0.0f : scalar_exp(m_old - m_new);
        row_sum[i] = row_sum[i] * alpha + V::reduce_add(sum);
        row_max[i] = m_new;
        if (alpha != 1.0f) {
          float* orow = o + i * hdp_;
          const F va = V::set1(alpha);
          for (int64_t c = 0; c < hdp_; c += V::W) V::store(orow + c, V::mul(va, V::load(orow + c)));
        }
      }
      tile_gemm<V>(mq, hdp_ / V::W, nk, TileOperandA{s, bk_, 1}, vp, hdp_, o, hdp_, true);
    }
    // O /= l, lse = m + log l; rows that see no key get O = 0 and lse = −inf.
    const int64_t out_row = p_.NH * HD, out_stride = p_.B * out_row;
    float* out = out_ + b * out_row + h * HD + i0 * out_stride;
    float* lse = lse_ + (b * p_.NH + h) * p_.Sq + i0;
    for (int64_t i = 0; i < mq; ++i) {
      const float l = row_sum[i];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      pack_rows<V>(o + i * hdp_, 0, 1, HD, inv, out + i * out_stride, HD);
      lse[i] = l > 0.0f ? row_max[i] + static_cast<float>(log_f64(static_cast<double>(l))) : kFlashNegInf;
    }
  }

  const AttentionProblem& p_;
  AttentionIo io_;
  float* out_;
  float* lse_;
  AttentionTiles tiles_;
  int64_t hdp_, bk_;
  simd::PhiloxDropout<V> dropout_;
};

template <class V>
class FlashBackward {
 public:
  FlashBackward(const AttentionProblem& p, const AttentionIo& io, const float* out, const float* lse, const float* dout,
                float* dq, float* dk, float* dv)
      : p_(p), io_(io), out_(out), lse_(lse), dout_(dout), dq_(dq), dk_(dk), dv_(dv),
        tiles_(p, kFlashBlockQ, kFlashBlockK), hdp_(round_up(p.HD, V::W)), bk_(round_up(kFlashBlockK, V::W)),
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
      const int64_t floats = p_.Sq * hdp_ + p_.Sq + 2 * p_.HD * bk_ + bk_ * hdp_ + 2 * kFlashBlockQ * hdp_ +
                             2 * kFlashBlockQ * bk_ + 2 * bk_ * hdp_;
      ScratchBuffer scratch(sizeof(float) * static_cast<size_t>(floats));
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) head(task / p_.NH, task % p_.NH, scratch.floats());
    }
    if (per_group > 1) sum_group_partials();
  }

 private:
  void head(int64_t b, int64_t h, float* scratch) {
    using F = typename V::F;
    const int64_t HD = p_.HD, g = h / (p_.NH / p_.KV);
    float* dq_acc = scratch;
    float* delta = dq_acc + p_.Sq * hdp_;
    float* kt = delta + p_.Sq;
    float* vt = kt + HD * bk_;
    float* kp = vt + HD * bk_;
    float* qs = kp + bk_ * hdp_;
    float* dop = qs + kFlashBlockQ * hdp_;
    float* pr = dop + kFlashBlockQ * hdp_;
    float* dpr = pr + kFlashBlockQ * bk_;
    float* dk_acc = dpr + kFlashBlockQ * bk_;
    float* dv_acc = dk_acc + bk_ * hdp_;

    const int64_t out_row = p_.NH * HD, out_stride = p_.B * out_row;
    const float* out_h = out_ + b * out_row + h * HD;
    const float* dout_h = dout_ + b * out_row + h * HD;
    const float* lse_h = lse_ + (b * p_.NH + h) * p_.Sq;
    const int64_t q_stride = p_.B * io_.ql.row_stride, k_stride = p_.B * io_.kl.row_stride,
                  v_stride = p_.B * io_.vl.row_stride;
    const float* qh = io_.q + io_.ql.offset(b, h);
    const float* kg = io_.k + io_.kl.offset(b, g);
    const float* vg = io_.v + io_.vl.offset(b, g);

    // δ_i = dO_i · O_i
    for (int64_t i = 0; i < p_.Sq; ++i) {
      F acc = V::zero();
      const float* a = dout_h + i * out_stride;
      const float* c = out_h + i * out_stride;
      for_vectors<V>(HD, [&](int64_t x, int64_t n) GALE_ALWAYS_INLINE {
        acc = V::fmadd(ld<V>(a + x, n), ld<V>(c + x, n), acc);
      });
      delta[i] = V::reduce_add(acc);
    }
    std::memset(dq_acc, 0, sizeof(float) * static_cast<size_t>(p_.Sq * hdp_));

    const bool drop = p_.dropout_p > 0.0f;
    const F keep_scale = V::set1(drop ? dropout_.keep_scale() : 1.0f);
    for (int64_t kt_index = 0; kt_index < tiles_.num_k(); ++kt_index) {
      const int64_t j0 = kt_index * kFlashBlockK, nk = min_i64(kFlashBlockK, p_.Sk - j0);
      const int64_t width = round_up(nk, V::W);
      std::memset(dk_acc, 0, sizeof(float) * static_cast<size_t>(nk * hdp_));
      std::memset(dv_acc, 0, sizeof(float) * static_cast<size_t>(nk * hdp_));
      bool packed = false;
      for (int64_t qt = 0; qt < tiles_.num_q(); ++qt) {
        const TileVisibility vis = classify_tiles(p_, tiles_.q(b, qt), tiles_.k(b, kt_index));
        if (vis == TileVisibility::kNone) continue;
        if (!packed) {
          pack_transposed<V>(kg + j0 * k_stride, k_stride, nk, HD, kt, bk_);
          pack_transposed<V>(vg + j0 * v_stride, v_stride, nk, HD, vt, bk_);
          pack_rows<V>(kg + j0 * k_stride, k_stride, nk, HD, 1.0f, kp, hdp_);
          packed = true;
        }
        const int64_t i0 = qt * kFlashBlockQ, mq = min_i64(kFlashBlockQ, p_.Sq - i0);
        pack_rows<V>(qh + i0 * q_stride, q_stride, mq, HD, p_.scale, qs, hdp_);
        pack_rows<V>(dout_h + i0 * out_stride, out_stride, mq, HD, 1.0f, dop, hdp_);
        tile_gemm<V>(mq, width / V::W, HD, TileOperandA{qs, hdp_, 1}, kt, bk_, pr, bk_, false);    // S
        tile_gemm<V>(mq, width / V::W, HD, TileOperandA{dop, hdp_, 1}, vt, bk_, dpr, bk_, false);  // dP'
        for (int64_t i = 0; i < mq; ++i) {
          float* prow = pr + i * bk_;
          float* dprow = dpr + i * bk_;
          mask_score_row<V>(p_, b, i0 + i, j0, nk, width, prow, vis);
          const float l = lse_h[i0 + i];
          const F vl = V::set1(l), vdelta = V::set1(delta[i0 + i]);
          const uint64_t drop_base = drop ? attn_dropout_row_base(p_, b, h, attn_qpos(p_, i0 + i)) : 0;
          for (int64_t jj = 0; jj < width; jj += V::W) {
            // P = exp(S − lse) (0 where masked, and for rows that see nothing).
            const F prob = l == kFlashNegInf ? V::zero() : simd::exp<V>(V::sub(V::load(prow + jj), vl));
            F dp = V::load(dprow + jj);
            F dropped = prob;
            if (drop) {
              const typename V::M keep = dropout_.keep(drop_base, key_positions<V>(p_, j0, jj, nk));
              dropped = V::select(keep, V::mul(prob, keep_scale), V::zero());
              dp = V::select(keep, V::mul(dp, keep_scale), V::zero());
            }
            V::store(prow + jj, dropped);                                 // P' (for dV)
            V::store(dprow + jj, V::mul(prob, V::sub(dp, vdelta)));       // dS
          }
        }
        tile_gemm<V>(nk, hdp_ / V::W, mq, TileOperandA{pr, 1, bk_}, dop, hdp_, dv_acc, hdp_, true);   // dV += P'ᵀ dO
        tile_gemm<V>(nk, hdp_ / V::W, mq, TileOperandA{dpr, 1, bk_}, qs, hdp_, dk_acc, hdp_, true);   // dK += dSᵀ Qs
        tile_gemm<V>(mq, hdp_ / V::W, nk, TileOperandA{dpr, bk_, 1}, kp, hdp_, dq_acc + i0 * hdp_, hdp_, true);
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
        pack_rows<V>(dk_acc + j * hdp_, 0, 1, HD, 1.0f, dk_dst + j * dk_stride, HD);
        pack_rows<V>(dv_acc + j * hdp_, 0, 1, HD, 1.0f, dv_dst + j * dv_stride, HD);
      }
    }
    float* dqh = dq_ + io_.ql.offset(b, h);
    for (int64_t i = 0; i < p_.Sq; ++i) pack_rows<V>(dq_acc + i * hdp_, 0, 1, HD, p_.scale, dqh + i * q_stride, HD);
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
  int64_t hdp_, bk_;
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
