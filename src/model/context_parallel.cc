// Context parallelism in the model: micro-batch slicing, attention's key/value all-gather / reduce-scatter, Ulysses all-to-alls.
#include "model/context_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace gale {

namespace {

// Copies the local positions of each sample: out[b·S_l + s] = in[b·S + pos[s]].
template <class T>
std::vector<T> slice_rows(const std::vector<T>& in, int64_t B, int64_t S, const std::vector<int32_t>& pos) {
  if (in.empty()) return {};
  GALE_CHECK_EQ(static_cast<int64_t>(in.size()), B * S);
  const int64_t Sl = static_cast<int64_t>(pos.size());
  std::vector<T> out(static_cast<size_t>(B * Sl));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < Sl; ++s) out[b * Sl + s] = in[b * S + pos[s]];
  return out;
}

// Moves whole chunks between the rank-major order of a collective's buffer ([N, S_local·B, W]:
// rank r's local rows) and global position order ([S_global·B, W]). `to_global` picks the direction.
void permute_chunks(const ContextSplit& split, int64_t B, int64_t W, const float* src, float* dst, bool to_global) {
  const int64_t Tl = split.local_length() * B;
  if (split.layout) {  // adaptive_cp_algo: any positions per rank, moved one position (B rows) at a time
    for (int64_t r = 0; r < split.cp_size; ++r)
      for (int64_t s = 0; s < split.local_length(); ++s) {
        const int64_t local = r * Tl + s * B, global = split.global_position(s, r) * B;
        std::memcpy(dst + (to_global ? global : local) * W, src + (to_global ? local : global) * W,
                    static_cast<size_t>(B * W) * sizeof(float));
      }
    return;
  }
  const int64_t C = split.chunk_length(), rows = C * B;
  for (int64_t r = 0; r < split.cp_size; ++r)
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t local = r * Tl + h * rows;                     // row in the rank-major buffer
      const int64_t global = split.global_position(h * C, r) * B;  // row in position order
      const float* from = src + (to_global ? local : global) * W;
      float* to = dst + (to_global ? global : local) * W;
      std::memcpy(to, from, static_cast<size_t>(rows * W) * sizeof(float));
    }
}

}  // namespace

MicroBatch slice_micro_batch(const MicroBatch& full, const ContextSplit& split) {
  if (split.cp_size == 1) return full;
  GALE_CHECK_EQ(full.S, split.seq_length) << "a context-parallel slice needs whole sequences";
  const std::vector<int32_t> pos = split.local_positions();
  MicroBatch mb;
  mb.B = full.B;
  mb.S = split.local_length();
  mb.S_global = full.S;
  mb.tokens = slice_rows(full.tokens, full.B, full.S, pos);
  mb.labels = slice_rows(full.labels, full.B, full.S, pos);
  mb.loss_mask = slice_rows(full.loss_mask, full.B, full.S, pos);
  mb.position_ids = slice_rows(full.position_ids, full.B, full.S, pos);
  mb.document_ids = slice_rows(full.document_ids, full.B, full.S, pos);
  mb.key_document_ids = full.document_ids;
  mb.packed_sequences = full.packed_sequences;
  mb.sample_ids = full.sample_ids;
  mb.seq_positions = pos;
  mb.cp_layout = split.layout;
  return mb;
}

Tensor pack_context_kv(int64_t T, const float* qkv, const HeadLayout& kl, const HeadLayout& vl, int64_t KV, int64_t HD) {
  const int64_t W = 2 * KV * HD;
  Tensor kv = Tensor::empty({T, W});
  float* l = kv.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < KV; ++g) {
      std::copy_n(qkv + kl.offset(t, g), HD, l + t * W + g * HD);
      std::copy_n(qkv + vl.offset(t, g), HD, l + t * W + (KV + g) * HD);
    }
  return kv;
}

void unpack_context_kv_grad(int64_t T, const float* dkv, float* dqkv, const HeadLayout& kl, const HeadLayout& vl,
                            int64_t KV, int64_t HD) {
  const int64_t W = 2 * KV * HD;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < KV; ++g) {
      std::copy_n(dkv + t * W + g * HD, HD, dqkv + kl.offset(t, g));
      std::copy_n(dkv + t * W + (KV + g) * HD, HD, dqkv + vl.offset(t, g));
    }
}

Tensor all_gather_context_kv(Communicator& cp, const ContextSplit& split, int64_t B, const float* qkv,
                             const HeadLayout& kl, const HeadLayout& vl, int64_t KV, int64_t HD) {
  GALE_CHECK_EQ(static_cast<int64_t>(cp.size()), split.cp_size);
  const int64_t Tl = split.local_length() * B, W = 2 * KV * HD;
  const Tensor local = pack_context_kv(Tl, qkv, kl, vl, KV, HD);
  const float* l = local.data<float>();
  Tensor gathered = Tensor::empty({split.cp_size * Tl, W});
  cp.all_gather(l, gathered.raw(), Tl * W, DType::kF32);
  Tensor kv = Tensor::empty({split.cp_size * Tl, W});
  permute_chunks(split, B, W, gathered.data<float>(), kv.data<float>(), /*to_global=*/true);
  return kv;
}

void reduce_scatter_context_kv_grad(Communicator& cp, const ContextSplit& split, int64_t B, const Tensor& dkv,
                                    float* dqkv, const HeadLayout& kl, const HeadLayout& vl, int64_t KV, int64_t HD) {
  GALE_CHECK_EQ(static_cast<int64_t>(cp.size()), split.cp_size);
  const int64_t Tl = split.local_length() * B, W = 2 * KV * HD;
  GALE_CHECK_EQ(dkv.numel(), split.cp_size * Tl * W);
  Tensor by_rank = Tensor::empty({split.cp_size * Tl, W});
  permute_chunks(split, B, W, dkv.data<float>(), by_rank.data<float>(), /*to_global=*/false);
  Tensor local = Tensor::empty({Tl, W});
  cp.reduce_scatter(by_rank.raw(), local.raw(), Tl * W, DType::kF32, ReduceOp::kSum);
  unpack_context_kv_grad(Tl, local.data<float>(), dqkv, kl, vl, KV, HD);
}

Tensor ulysses_seq_to_heads(Communicator& cp, const ContextSplit& split, int64_t B, const Tensor& x) {
  GALE_CHECK_EQ(static_cast<int64_t>(cp.size()), split.cp_size);
  const int64_t N = split.cp_size, Tl = split.local_length() * B, W = x.size(1), Wl = W / N;
  GALE_CHECK(x.size(0) == Tl && W % N == 0) << "ulysses_seq_to_heads: [" << x.size(0) << ", " << W << "]";
  Tensor send = Tensor::empty({N * Tl, Wl});  // block j: this rank's rows, columns of block j
  const float* xd = x.data<float>();
  float* sd = send.data<float>();
  for (int64_t j = 0; j < N; ++j)
    for (int64_t t = 0; t < Tl; ++t) std::copy_n(xd + t * W + j * Wl, Wl, sd + (j * Tl + t) * Wl);
  Tensor recv = Tensor::empty({N * Tl, Wl});  // block r: rank r's rows, columns of this rank's block
  cp.all_to_all(send.raw(), recv.raw(), Tl * Wl, DType::kF32);
  Tensor out = Tensor::empty({N * Tl, Wl});
  permute_chunks(split, B, Wl, recv.data<float>(), out.data<float>(), /*to_global=*/true);
  return out;
}

Tensor ulysses_heads_to_seq(Communicator& cp, const ContextSplit& split, int64_t B, const Tensor& x) {
  GALE_CHECK_EQ(static_cast<int64_t>(cp.size()), split.cp_size);
  const int64_t N = split.cp_size, Tl = split.local_length() * B, Wl = x.size(1), W = Wl * N;
  GALE_CHECK_EQ(x.size(0), N * Tl) << "ulysses_heads_to_seq: rows of the whole sequence";
  Tensor send = Tensor::empty({N * Tl, Wl});  // block r: rank r's rows
  permute_chunks(split, B, Wl, x.data<float>(), send.data<float>(), /*to_global=*/false);
  Tensor recv = Tensor::empty({N * Tl, Wl});  // block j: this rank's rows, columns of block j
  cp.all_to_all(send.raw(), recv.raw(), Tl * Wl, DType::kF32);
  Tensor out = Tensor::empty({Tl, W});
  const float* rd = recv.data<float>();
  float* od = out.data<float>();
  for (int64_t j = 0; j < N; ++j)
    for (int64_t t = 0; t < Tl; ++t) std::copy_n(rd + (j * Tl + t) * Wl, Wl, od + t * W + j * Wl);
  return out;
}

Tensor repeat_kv_groups(const Tensor& packed_qkv, int64_t NH, int64_t KV, int64_t HD, int64_t D) {
  GALE_CHECK(KV > 0 && D % KV == 0 && NH % D == 0) << "repeat_kv_groups: NH " << NH << ", KV " << KV << ", D " << D;
  const int64_t T = packed_qkv.size(0), W = (NH + 2 * KV) * HD, NHa = NH / D, Wb = (NHa + 2) * HD;
  GALE_CHECK_EQ(packed_qkv.size(1), W);
  const HeadLayout ql = qkv_query_layout(NH, KV, HD), kl = qkv_key_layout(NH, KV, HD), vl = qkv_value_layout(NH, KV, HD);
  Tensor out = Tensor::empty({T, D * Wb});
  const float* in = packed_qkv.data<float>();
  float* o = out.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < D; ++j) {
      float* block = o + t * D * Wb + j * Wb;
      const int64_t g = j / (D / KV);
      std::copy_n(in + ql.offset(t, j * NHa), NHa * HD, block);  // the block's heads are adjacent in group g
      std::copy_n(in + kl.offset(t, g), HD, block + NHa * HD);
      std::copy_n(in + vl.offset(t, g), HD, block + (NHa + 1) * HD);
    }
  return out;
}

Tensor sum_repeated_kv_groups(const Tensor& d_blocks, int64_t NH, int64_t KV, int64_t HD, int64_t D) {
  GALE_CHECK(KV > 0 && D % KV == 0 && NH % D == 0) << "sum_repeated_kv_groups: NH " << NH << ", KV " << KV << ", D " << D;
  const int64_t T = d_blocks.size(0), NHa = NH / D, Wb = (NHa + 2) * HD;
  GALE_CHECK_EQ(d_blocks.size(1), D * Wb);
  const HeadLayout ql = qkv_query_layout(NH, KV, HD), kl = qkv_key_layout(NH, KV, HD), vl = qkv_value_layout(NH, KV, HD);
  Tensor out = Tensor::zeros({T, (NH + 2 * KV) * HD});
  const float* in = d_blocks.data<float>();
  float* o = out.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < D; ++j) {
      const float* block = in + t * D * Wb + j * Wb;
      const int64_t g = j / (D / KV);
      std::copy_n(block, NHa * HD, o + ql.offset(t, j * NHa));
      float* dk = o + kl.offset(t, g);
      float* dv = o + vl.offset(t, g);
      for (int64_t d = 0; d < HD; ++d) {
        dk[d] += block[NHa * HD + d];
        dv[d] += block[(NHa + 1) * HD + d];
      }
    }
  return out;
}

Tensor pack_query_heads(const Tensor& packed_qkv, int64_t NH, int64_t KV, int64_t HD) {
  const int64_t T = packed_qkv.size(0), G = NH / KV;
  GALE_CHECK_EQ(packed_qkv.size(1), (NH + 2 * KV) * HD);
  const HeadLayout ql = qkv_query_layout(NH, KV, HD);
  Tensor out = Tensor::empty({T, NH * HD});
  const float* in = packed_qkv.data<float>();
  float* o = out.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < KV; ++g) std::copy_n(in + ql.offset(t, g * G), G * HD, o + (t * NH + g * G) * HD);
  return out;
}

void unpack_query_heads_grad(const Tensor& d_query, float* dqkv, int64_t NH, int64_t KV, int64_t HD) {
  const int64_t T = d_query.size(0), G = NH / KV;
  GALE_CHECK_EQ(d_query.size(1), NH * HD);
  const HeadLayout ql = qkv_query_layout(NH, KV, HD);
  const float* in = d_query.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < KV; ++g) std::copy_n(in + (t * NH + g * G) * HD, G * HD, dqkv + ql.offset(t, g * G));
}

}  // namespace gale
