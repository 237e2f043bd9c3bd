// Ring attention (--cp-comm-type p2p): key/value blocks and their gradients passed around the cp group.
#include "model/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "model/context_parallel.h"

namespace gale {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kKvTag = 71;    // key/value blocks
constexpr int kGradTag = 72;  // their gradients

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
      positions_[j] = ContextSplit{S, N, j}.local_positions();
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

Tensor ring_attention_forward(Communicator& cp, const ContextSplit& split, AttentionForwardFn forward,
                              const AttentionProblem& ap, const float* qkv, const HeadLayout& ql,
                              const HeadLayout& kl, const HeadLayout& vl, float* out, float* lse) {
  GALE_CHECK_EQ(static_cast<int64_t>(cp.size()), split.cp_size);
  const int64_t N = split.cp_size, r = split.cp_rank, B = ap.B, Sl = split.local_length(), Tl = Sl * B;
  const int64_t KV = ap.KV, HD = ap.HD, W = 2 * KV * HD, count = Tl * W;
  const int next = static_cast<int>((r + 1) % N), prev = static_cast<int>((r + N - 1) % N);
  const RingBlocks blocks(split, ap);
  const HeadLayout bkl = context_key_layout(KV, HD), bvl = context_value_layout(KV, HD);
  Tensor local = pack_context_kv(Tl, qkv, kl, vl, KV, HD);
  // The visiting blocks alternate between two buffers; the local block is only read (and sent).
  Tensor visiting[2] = {Tensor::empty({Tl, W}), Tensor::empty({Tl, W})};
  Tensor part_out = Tensor::empty({Tl, ap.NH * HD}), part_lse = Tensor::empty({B, ap.NH, Sl});
  const float* cur = local.data<float>();
  for (int64_t i = 0; i < N; ++i) {
    float* incoming = visiting[i % 2].data<float>();
    WorkPtr recv, send;
    if (i + 1 < N) {  // the next block's transfer overlaps this block's attention
      recv = cp.recv_async(incoming, count, DType::kF32, prev, kKvTag);
      send = cp.send_async(cur, count, DType::kF32, next, kKvTag);
    }
    const AttentionProblem bp = blocks.problem((r + N - i) % N);
    if (i == 0) {
      forward(bp, qkv, ql, cur, bkl, cur, bvl, out, lse);
    } else {
      forward(bp, qkv, ql, cur, bkl, cur, bvl, part_out.data<float>(), part_lse.data<float>());
      merge_attention_partial(B, ap.NH, Sl, HD, out, lse, part_out.data<float>(), part_lse.data<float>());
    }
    if (recv) {
      recv->wait();
      send->wait();
      cur = incoming;
    }
  }
  return local;
}

void ring_attention_backward(Communicator& cp, const ContextSplit& split, AttentionBackwardFn backward,
                             const AttentionProblem& ap, const float* qkv, const HeadLayout& ql,
                             const Tensor& local_kv, const float* out, const float* lse, const float* dout,
                             float* dqkv, const HeadLayout& kl, const HeadLayout& vl) {
  GALE_CHECK_EQ(static_cast<int64_t>(cp.size()), split.cp_size);
  const int64_t N = split.cp_size, r = split.cp_rank, B = ap.B, Sl = split.local_length(), Tl = Sl * B;
  const int64_t NH = ap.NH, KV = ap.KV, HD = ap.HD, W = 2 * KV * HD, count = Tl * W;
  GALE_CHECK_EQ(local_kv.numel(), count) << "ring attention backward: this rank's key/value block";
  const int next = static_cast<int>((r + 1) % N), prev = static_cast<int>((r + N - 1) % N);
  const RingBlocks blocks(split, ap);
  const HeadLayout bkl = context_key_layout(KV, HD), bvl = context_value_layout(KV, HD);
  Tensor visiting[2] = {Tensor::empty({Tl, W}), Tensor::empty({Tl, W})};
  // Gradients of the visiting block: the one arriving (and then sent on) and the one being sent.
  Tensor travelling[2] = {Tensor::empty({Tl, W}), Tensor::empty({Tl, W})};
  // A block's share of dQ, written by the kernel through ql (its rows are laid out like qkv's).
  Tensor block_grad = Tensor::empty({Tl, W}), dq_part = Tensor::empty({Tl, ql.row_stride});
  const float* cur = local_kv.data<float>();
  WorkPtr grad_recv, grad_send;
  float* grad = nullptr;  // the accumulated gradient of the current block
  for (int64_t i = 0; i < N; ++i) {
    float* incoming = visiting[i % 2].data<float>();
    WorkPtr recv, send;
    if (i + 1 < N) {
      recv = cp.recv_async(incoming, count, DType::kF32, prev, kKvTag);
      send = cp.send_async(cur, count, DType::kF32, next, kKvTag);
    }
    const AttentionProblem bp = blocks.problem((r + N - i) % N);
    if (i == 0) {  // this rank's own block: dQ written in place, the block's gradient starts here
      grad = travelling[0].data<float>();
      backward(bp, qkv, ql, cur, bkl, cur, bvl, out, lse, dout, dqkv, grad, grad);
    } else {
      float* dg = block_grad.data<float>();
      float* dqp = dq_part.data<float>();
      backward(bp, qkv, ql, cur, bkl, cur, bvl, out, lse, dout, dqp, dg, dg);
      for (int64_t t = 0; t < Tl; ++t)
        for (int64_t h = 0; h < NH; ++h) {
          float* d = dqkv + ql.offset(t, h);
          const float* p = dqp + ql.offset(t, h);
          for (int64_t c = 0; c < HD; ++c) d[c] += p[c];
        }
      grad_recv->wait();  // the block's gradient from the ranks it visited before
      grad_send->wait();
      grad = travelling[i % 2].data<float>();
      for (int64_t e = 0; e < count; ++e) grad[e] += dg[e];
    }
    // The gradient follows its block one hop behind; the previous buffer's send has completed.
    float* other = travelling[(i + 1) % 2].data<float>();
    grad_recv = cp.recv_async(other, count, DType::kF32, prev, kGradTag);
    grad_send = cp.send_async(grad, count, DType::kF32, next, kGradTag);
    if (recv) {
      recv->wait();
      send->wait();
      cur = incoming;
    }
  }
  grad_recv->wait();  // N hops: this rank's own block, with every rank's share
  grad_send->wait();
  unpack_context_kv_grad(Tl, travelling[N % 2].data<float>(), dqkv, kl, vl, KV, HD);
}

}  // namespace gale
