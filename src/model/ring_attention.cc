// Ring attention (--cp-comm-type p2p): key/value blocks and their gradients passed around the cp group.
#include "model/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "core/check.h"
#include "model/context_parallel.h"

namespace gale {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kKvTag = 71;       // key/value blocks along the (inner) ring
constexpr int kGradTag = 72;     // their gradients
constexpr int kOuterKvTag = 73;  // a round's first block to the next window (double ring)

// Who holds which block when: the single ring (W = N) or the double ring of N/W windows of W
// ranks (ring_attention.h). Rank r is inner rank k = r mod W of window w = r / W.
class RingTopology {
 public:
  RingTopology(int64_t N, int64_t window, int64_t rank) : N_(N), W_(window <= 1 ? N : window), r_(rank) {
    GALE_CHECK(N_ % W_ == 0 && W_ <= N_) << "ring attention: window " << window << " does not divide the ring of " << N;
  }
  int64_t size() const { return N_; }
  int64_t window() const { return W_; }
  // The rank of inner rank k of window w (both taken modulo their counts).
  int rank_of(int64_t w, int64_t k) const {
    const int64_t n = N_ / W_;
    return static_cast<int>((((w % n) + n) % n) * W_ + ((k % W_) + W_) % W_);
  }
  int64_t w() const { return r_ / W_; }
  int64_t k() const { return r_ % W_; }
  // The owner of the block this rank holds at step s (round s / W, inner step s mod W).
  int64_t block_at(int64_t s) const { return rank_of(w() - s / W_, k() - s % W_); }
  // Where the gradient of step s's block goes next, and where the next step's comes from.
  bool last_inner(int64_t s) const { return s % W_ == W_ - 1; }
  int grad_next(int64_t s) const { return last_inner(s) ? rank_of(w() + 1, k() + 1) : rank_of(w(), k() + 1); }
  int grad_prev(int64_t s) const { return last_inner(s) ? rank_of(w() - 1, k() - 1) : rank_of(w(), k() - 1); }

 private:
  int64_t N_, W_, r_;
};

// Moves blocks of `count` floats along the schedule of a RingTopology, so that at step s
// current() is the block of rank block_at(s) (its copy of `local` at step 0). Step s's transfers
// start with begin(s), overlap the caller's work on current(), and end with end(s).
class BlockTransport {
 public:
  BlockTransport(Communicator& cp, const RingTopology& t, const float* local, int64_t count)
      : cp_(cp), t_(t), count_(count), cur_(local) {
    for (Tensor& b : inner_) b = Tensor::empty({count});
    if (t.window() < t.size())
      for (Tensor& b : round_) b = Tensor::empty({count});
  }
  const float* current() const { return cur_; }

  void begin(int64_t s) {
    const int64_t W = t_.window(), j = s / W, i = s % W, rounds = t_.size() / W;
    if (i == 0 && j + 1 < rounds) {  // this round's first block (current) to the next window
      outer_recv_ = cp_.recv_async(round_[(j + 1) % 2].data<float>(), count_, DType::kF32,
                                   t_.rank_of(t_.w() - 1, t_.k()), kOuterKvTag);
      outer_send_ = cp_.send_async(cur_, count_, DType::kF32, t_.rank_of(t_.w() + 1, t_.k()), kOuterKvTag);
    }
    if (i + 1 < W) {  // along the window
      inner_recv_ = cp_.recv_async(inner_[s % 2].data<float>(), count_, DType::kF32, t_.rank_of(t_.w(), t_.k() - 1),
                                   kKvTag);
      inner_send_ = cp_.send_async(cur_, count_, DType::kF32, t_.rank_of(t_.w(), t_.k() + 1), kKvTag);
    }
  }

  void end(int64_t s) {
    const int64_t W = t_.window(), j = s / W;
    if (inner_recv_) {
      inner_recv_->wait();
      inner_send_->wait();
      inner_recv_ = inner_send_ = nullptr;
      cur_ = inner_[s % 2].data<float>();
    }
    if (t_.last_inner(s) && outer_recv_) {  // the next round starts with the block from the previous window
      outer_recv_->wait();
      outer_send_->wait();
      outer_recv_ = outer_send_ = nullptr;
      cur_ = round_[(j + 1) % 2].data<float>();
    }
  }

 private:
  Communicator& cp_;
  const RingTopology& t_;
  int64_t count_;
  const float* cur_;
  // Blocks arriving along the window alternate between two buffers; so do the rounds' first
  // blocks, each read (and sent on) for a whole round while the next one arrives.
  Tensor inner_[2], round_[2];
  WorkPtr inner_recv_, inner_send_, outer_recv_, outer_send_;
};

// Positions and key document ids of every rank's block, and the attention problem of one block.
class RingBlocks {
 public:
  RingBlocks(const ContextSplit& split, const AttentionProblem& ap) : ap_(ap) {
    const int64_t N = split.cp_size, Sl = split.local_length(), S = split.seq_length, B = ap.B;
    GALE_CHECK(ap.Sq == Sl && ap.Sk == S) << "ring attention: expected the all-gather problem (Sq " << Sl
                                          << ", Sk " << S << "), found Sq " << ap.Sq << ", Sk " << ap.Sk;
    positions_.resize(static_cast<size_t>(N));
    docs_.resize(static_cast<size_t>(N));
    for (int64_t j = 0; j < N; ++j) {
      ContextSplit rank_j = split;  // with its adaptive layout, if any
      rank_j.cp_rank = j;
      positions_[j] = rank_j.local_positions();
      if (!ap.k_doc_ids) continue;
      docs_[j].resize(static_cast<size_t>(B * Sl));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < Sl; ++s) docs_[j][b * Sl + s] = ap.k_doc_ids[b * S + positions_[j][s]];
    }
  }
  // The problem of the local queries against rank j's block.
  AttentionProblem problem(int64_t j) const {
    AttentionProblem p = ap_;
    p.Sk = p.Sq;
    p.k_positions = positions_[j].data();
    p.k_doc_ids = ap_.k_doc_ids ? docs_[j].data() : nullptr;
    p.softmax_offset = nullptr;  // sink logits enter once per row, after the blocks' merge
    return p;
  }

 private:
  AttentionProblem ap_;
  std::vector<std::vector<int32_t>> positions_, docs_;
};

}  // namespace

void merge_attention_partial(int64_t B, int64_t NH, int64_t Sq, int64_t HD, float* out, float* lse,
                             const float* out_b, const float* lse_b) {
  const int64_t row = NH * HD;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t s = 0; s < Sq; ++s) {
        const int64_t li = (b * NH + h) * Sq + s;
        const float la = lse[li], lb = lse_b[li];
        if (lb == kNegInf) continue;  // no key of this block is visible to the query
        float* o = out + (s * B + b) * row + h * HD;
        const float* ob = out_b + (s * B + b) * row + h * HD;
        if (la == kNegInf) {  // the first block the query sees
          std::copy_n(ob, HD, o);
          lse[li] = lb;
          continue;
        }
        const double m = std::max(la, lb);
        const double l = m + std::log(std::exp(la - m) + std::exp(lb - m));
        const float wa = static_cast<float>(std::exp(la - l)), wb = static_cast<float>(std::exp(lb - l));
        for (int64_t c = 0; c < HD; ++c) o[c] = wa * o[c] + wb * ob[c];
        lse[li] = static_cast<float>(l);
      }
}

namespace {

// The key columns of a [T, 2·KV·HD] block, as [T, KV·HD] rows (the half cache), or the value columns.
void copy_half_block(int64_t T, int64_t KVHD, const float* block, bool values, float* dst) {
  for (int64_t t = 0; t < T; ++t) std::copy_n(block + t * 2 * KVHD + (values ? KVHD : 0), KVHD, dst + t * KVHD);
}

// Its reverse for a whole block: [T, KV·HD] keys and [T, KV·HD] values into [T, 2·KV·HD] rows.
void join_half_blocks(int64_t T, int64_t KVHD, const float* keys, const float* values, float* block) {
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(keys + t * KVHD, KVHD, block + t * 2 * KVHD);
    std::copy_n(values + t * KVHD, KVHD, block + t * 2 * KVHD + KVHD);
  }
}

// adaptive_cp_algo: whether this rank's queries see no key of rank `owner`'s block (its attention is skipped).
bool skipped(const ContextSplit& split, int64_t owner) {
  return split.layout && !split.layout->nonempty(split.cp_rank, owner);
}

// Step s's entry of a RingSaved::cache (the block received at step s ≥ 1).
float* cached_block(const Tensor& cache, int64_t s) {
  return cache.data<float>() + (s - 1) * cache.size(1) * cache.size(2);
}

}  // namespace

RingSaved ring_attention_forward(Communicator& cp, const ContextSplit& split, const RingOptions& opts,
                                 AttentionForwardFn forward, const AttentionProblem& ap, const float* qkv,
                                 const HeadLayout& ql, const HeadLayout& kl, const HeadLayout& vl, float* out,
                                 float* lse) {
  GALE_CHECK_EQ(static_cast<int64_t>(cp.size()), split.cp_size);
  const int64_t N = split.cp_size, B = ap.B, Sl = split.local_length(), Tl = Sl * B;
  const int64_t KV = ap.KV, HD = ap.HD, W = 2 * KV * HD, count = Tl * W;
  const RingTopology topo(N, opts.window, split.cp_rank);
  const RingBlocks blocks(split, ap);
  const HeadLayout bkl = context_key_layout(KV, HD), bvl = context_value_layout(KV, HD);
  RingSaved saved;
  saved.local_kv = pack_context_kv(Tl, qkv, kl, vl, KV, HD);
  const bool full = opts.cache == RingKvCache::kFull, half = opts.cache == RingKvCache::kHalf;
  if (full || half) saved.cache = Tensor::empty({N - 1, Tl, full ? W : W / 2});
  BlockTransport transport(cp, topo, saved.local_kv.data<float>(), count);
  Tensor part_out = Tensor::empty({Tl, ap.NH * HD}), part_lse = Tensor::empty({B, ap.NH, Sl});
  for (int64_t s = 0; s < N; ++s) {
    transport.begin(s);  // the next block's transfer overlaps this block's attention
    const float* cur = transport.current();
    const AttentionProblem bp = blocks.problem(topo.block_at(s));
    if (s == 0) {  // this rank's own block: never empty (every query sees itself)
      forward(bp, qkv, ql, cur, bkl, cur, bvl, out, lse);
    } else {
      if (skipped(split, topo.block_at(s))) {
        ++saved.skipped_blocks;
      } else {
        forward(bp, qkv, ql, cur, bkl, cur, bvl, part_out.data<float>(), part_lse.data<float>());
        merge_attention_partial(B, ap.NH, Sl, HD, out, lse, part_out.data<float>(), part_lse.data<float>());
      }
      if (full) std::copy_n(cur, count, cached_block(saved.cache, s));
      if (half) copy_half_block(Tl, KV * HD, cur, /*values=*/false, cached_block(saved.cache, s));
    }
    transport.end(s);
  }
  attention_softmax_offset_merge(ap, out, lse);  // --softmax-type: the sink, once per row
  return saved;
}

void ring_attention_backward(Communicator& cp, const ContextSplit& split, const RingOptions& opts,
                             AttentionBackwardFn backward, const AttentionProblem& ap, const float* qkv,
                             const HeadLayout& ql, const RingSaved& saved, const float* out, const float* lse,
                             const float* dout, float* dqkv, const HeadLayout& kl, const HeadLayout& vl) {
  GALE_CHECK_EQ(static_cast<int64_t>(cp.size()), split.cp_size);
  const int64_t N = split.cp_size, B = ap.B, Sl = split.local_length(), Tl = Sl * B;
  const int64_t NH = ap.NH, KV = ap.KV, HD = ap.HD, W = 2 * KV * HD, count = Tl * W;
  GALE_CHECK_EQ(saved.local_kv.numel(), count) << "ring attention backward: this rank's key/value block";
  const bool cached = saved.cache.defined();
  const bool half = cached && saved.cache.size(2) == W / 2;
  GALE_CHECK(!cached || (saved.cache.size(0) == N - 1 && saved.cache.size(1) == Tl))
      << "ring attention backward: a cache of " << saved.cache.size(0) << " blocks for a ring of " << N;
  const RingTopology topo(N, opts.window, split.cp_rank);
  const RingBlocks blocks(split, ap);
  const HeadLayout bkl = context_key_layout(KV, HD), bvl = context_value_layout(KV, HD);
  // What travels again: the whole blocks (no cache), their values (half cache; joined with the
  // cached keys in `joined`) or nothing (full).
  Tensor local_values, joined;
  if (half) {
    joined = Tensor::empty({Tl, W});
    local_values = Tensor::empty({Tl, W / 2});
    copy_half_block(Tl, KV * HD, saved.local_kv.data<float>(), /*values=*/true, local_values.data<float>());
  }
  std::unique_ptr<BlockTransport> transport;
  if (!cached) transport = std::make_unique<BlockTransport>(cp, topo, saved.local_kv.data<float>(), count);
  if (half) transport = std::make_unique<BlockTransport>(cp, topo, local_values.data<float>(), count / 2);
  // Gradients of the visiting block: the one arriving (and then sent on) and the one being sent.
  Tensor travelling[2] = {Tensor::empty({Tl, W}), Tensor::empty({Tl, W})};
  // A block's share of dQ, written by the kernel through ql (its rows are laid out like qkv's).
  Tensor block_grad = Tensor::empty({Tl, W}), dq_part = Tensor::empty({Tl, ql.row_stride});
  WorkPtr grad_recv, grad_send;
  float* grad = nullptr;  // the accumulated gradient of the current block
  for (int64_t s = 0; s < N; ++s) {
    if (transport) transport->begin(s);
    // This step's keys and values: the local block, or a visiting one (travelled, cached, or
    // its cached keys with its travelled values).
    const float* cur = saved.local_kv.data<float>();
    if (s > 0) {
      cur = cached ? cached_block(saved.cache, s) : transport->current();
      if (half) {
        join_half_blocks(Tl, KV * HD, cached_block(saved.cache, s), transport->current(), joined.data<float>());
        cur = joined.data<float>();
      }
    }
    const AttentionProblem bp = blocks.problem(topo.block_at(s));
    if (s == 0) {  // this rank's own block: dQ written in place, the block's gradient starts here
      grad = travelling[0].data<float>();
      backward(bp, qkv, ql, cur, bkl, cur, bvl, out, lse, dout, dqkv, grad, grad);
    } else {
      // An empty block (adaptive_cp_algo) adds nothing: its gradient passes through unchanged.
      const bool skip = skipped(split, topo.block_at(s));
      float* dg = block_grad.data<float>();
      float* dqp = dq_part.data<float>();
      if (!skip) {
        backward(bp, qkv, ql, cur, bkl, cur, bvl, out, lse, dout, dqp, dg, dg);
        for (int64_t t = 0; t < Tl; ++t)
          for (int64_t h = 0; h < NH; ++h) {
            float* d = dqkv + ql.offset(t, h);
            const float* p = dqp + ql.offset(t, h);
            for (int64_t c = 0; c < HD; ++c) d[c] += p[c];
          }
      }
      grad_recv->wait();  // the block's gradient from the ranks it visited before
      grad_send->wait();
      grad = travelling[s % 2].data<float>();
      if (!skip)
        for (int64_t e = 0; e < count; ++e) grad[e] += dg[e];
    }
    // The gradient follows its block one hop behind; the previous buffer's send has completed.
    float* other = travelling[(s + 1) % 2].data<float>();
    grad_recv = cp.recv_async(other, count, DType::kF32, topo.grad_prev(s), kGradTag);
    grad_send = cp.send_async(grad, count, DType::kF32, topo.grad_next(s), kGradTag);
    if (transport) transport->end(s);
  }
  grad_recv->wait();  // N hops: this rank's own block, with every rank's share
  grad_send->wait();
  unpack_context_kv_grad(Tl, travelling[N % 2].data<float>(), dqkv, kl, vl, KV, HD);
}

}  // namespace gale
