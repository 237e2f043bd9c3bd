// Fused dispatch and combine of the MoE all-to-all dispatcher (--moe-alltoall-mc2).
#include "model/moe_mc2.h"

#include <cstring>

#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/activation.h"

namespace gale {

namespace {

// Where every chunk of one exchange lies. Chunk c = r·El + j is this rank's rows for local expert
// j of rank r (global expert c): rows [sent[c], sent[c] + send_counts[c]) of the permuted order.
// Chunk (s, j) received from rank s for local expert j starts at expert_major[s·El + j].
struct Mc2Layout {
  int me = 0;
  int64_t ep = 1, el = 0;
  std::vector<int64_t> sent, expert_major;
  std::vector<int64_t> remote;  // [EP·El] start of chunk c among the remote chunks (−1: a local chunk)
  int64_t remote_rows = 0;
  int owner(int64_t c) const { return static_cast<int>(c / el); }
};

Mc2Layout layout(const Comm& ep, const MoeDispatchPlan& p) {
  Mc2Layout l;
  l.me = ep ? ep->rank() : 0;
  l.ep = p.ep_size;
  l.el = p.local_experts;
  GALE_CHECK(!ep || ep->size() == l.ep) << "the dispatch plan's EP size " << l.ep << " on a group of " << ep->size();
  GALE_CHECK(2 * l.el < 32767 - kMc2Tag) << l.el << " local experts: too many for the fused exchange's tags";
  const int64_t chunks = l.ep * l.el;
  l.sent.assign(static_cast<size_t>(chunks), 0);
  l.remote.assign(static_cast<size_t>(chunks), -1);
  int64_t at = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    l.sent[c] = at;
    at += p.send_counts[c];
    if (l.owner(c) != l.me) l.remote[c] = l.remote_rows, l.remote_rows += p.send_counts[c];
  }
  l.expert_major.assign(static_cast<size_t>(chunks), 0);
  at = 0;
  for (int64_t j = 0; j < l.el; ++j)
    for (int64_t s = 0; s < l.ep; ++s) l.expert_major[s * l.el + j] = at, at += p.recv_counts[s * l.el + j];
  return l;
}

void wait_all(std::vector<WorkPtr>& works) {
  for (WorkPtr& w : works) w->wait();
  works.clear();
}

int dispatch_tag(int64_t j) { return kMc2Tag + 2 * static_cast<int>(j); }
int combine_tag(int64_t j) { return kMc2Tag + 2 * static_cast<int>(j) + 1; }

}  // namespace

Tensor mc2_dispatch(const Comm& ep, const MoeDispatchPlan& p, int64_t H, DType dtype, const RowWriter& write_row,
                    const std::function<void()>& while_in_flight) {
  const Mc2Layout l = layout(ep, p);
  const int64_t R = p.num_sent();
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(dtype);
  Tensor out = Tensor::empty({p.num_received(), H}, dtype);
  Tensor send = Tensor::empty({l.remote_rows, H}, dtype);
  char* o = static_cast<char*>(out.raw());
  char* sb = static_cast<char*>(send.raw());
  std::vector<WorkPtr> works;
  // the receives first: each chunk straight to its expert-major place
  for (int64_t s = 0; s < l.ep; ++s)
    for (int64_t j = 0; j < l.el && s != l.me; ++j)
      if (const int64_t n = p.recv_counts[s * l.el + j]; n > 0)
        works.push_back(ep->recv_async(o + l.expert_major[s * l.el + j] * row_bytes, n * H, dtype, static_cast<int>(s),
                                       dispatch_tag(j)));
  // every row written once where it goes: this rank's experts' input, or the send buffer
  std::vector<char*> dst(static_cast<size_t>(R));
  for (int64_t c = 0; c < l.ep * l.el; ++c) {
    char* base = l.owner(c) == l.me ? o + l.expert_major[l.me * l.el + c % l.el] * row_bytes : sb + l.remote[c] * row_bytes;
    for (int64_t i = 0; i < p.send_counts[c]; ++i) dst[l.sent[c] + i] = base + i * row_bytes;
  }
  parallel_for(R, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) write_row(r, dst[r]);
  });
  for (int64_t c = 0; c < l.ep * l.el; ++c)
    if (l.owner(c) != l.me && p.send_counts[c] > 0)
      works.push_back(ep->send_async(sb + l.remote[c] * row_bytes, p.send_counts[c] * H, dtype, l.owner(c),
                                     dispatch_tag(c % l.el)));
  moe_dispatch_counters().rows_sent_to_other_ranks += l.remote_rows;
  if (while_in_flight) while_in_flight();
  wait_all(works);
  return out;
}

Mc2Rows mc2_combine(const Comm& ep, const MoeDispatchPlan& p, const Tensor& rows, bool materialize) {
  const Mc2Layout l = layout(ep, p);
  GALE_CHECK_EQ(rows.size(0), p.num_received());
  GALE_CHECK(rows.dtype() == DType::kF32) << "the fused combine takes f32 rows";
  const int64_t H = rows.size(1), R = p.num_sent();
  Mc2Rows out;
  out.rows = Tensor::empty({materialize ? R : l.remote_rows, H});
  float* dst = out.rows.data<float>();
  const float* src = rows.data<float>();
  // where chunk c of this rank's permuted rows lands
  const auto place = [&](int64_t c) { return dst + (materialize ? l.sent[c] : l.remote[c]) * H; };
  std::vector<WorkPtr> works;
  for (int64_t c = 0; c < l.ep * l.el; ++c)
    if (l.owner(c) != l.me && p.send_counts[c] > 0)
      works.push_back(ep->recv_async(place(c), p.send_counts[c] * H, DType::kF32, l.owner(c), combine_tag(c % l.el)));
  // the experts' rows of other ranks straight from the expert-major layout
  for (int64_t s = 0; s < l.ep; ++s)
    for (int64_t j = 0; j < l.el && s != l.me; ++j)
      if (const int64_t n = p.recv_counts[s * l.el + j]; n > 0)
        works.push_back(ep->send_async(src + l.expert_major[s * l.el + j] * H, n * H, DType::kF32, static_cast<int>(s),
                                       combine_tag(j)));
  out.row.resize(static_cast<size_t>(R));
  for (int64_t c = 0; c < l.ep * l.el; ++c) {
    const int64_t n = p.send_counts[c];
    const float* base;
    if (l.owner(c) == l.me) {
      const float* local = src + l.expert_major[l.me * l.el + c % l.el] * H;
      if (materialize) {
        if (n > 0) std::memcpy(place(c), local, static_cast<size_t>(n * H) * sizeof(float));
        base = place(c);
      } else {
        base = local;
      }
    } else {
      base = place(c);
    }
    for (int64_t i = 0; i < n; ++i) out.row[l.sent[c] + i] = base + i * H;
  }
  if (!materialize) out.local = rows;
  wait_all(works);
  return out;
}

TokenRows token_rows(const std::vector<int64_t>& permuted_slot, int64_t T, int64_t k) {
  TokenRows t;
  t.offsets.assign(static_cast<size_t>(T + 1), 0);
  for (int64_t slot : permuted_slot)
    if (slot >= 0) ++t.offsets[slot / k + 1];
  for (int64_t i = 0; i < T; ++i) t.offsets[i + 1] += t.offsets[i];
  t.rows.resize(static_cast<size_t>(t.offsets[T]));
  std::vector<int64_t> next(t.offsets.begin(), t.offsets.end() - 1);
  for (size_t r = 0; r < permuted_slot.size(); ++r)
    if (permuted_slot[r] >= 0) t.rows[next[permuted_slot[r] / k]++] = static_cast<int64_t>(r);
  return t;
}

void weighted_row_accumulate(float* dst, const float* src, float q, int64_t H) {
  for (int64_t h = 0; h < H; ++h) dst[h] += q * src[h];
}

void mc2_weighted_unpermute(const Mc2Rows& in, const TokenRows& tokens, const std::vector<int64_t>& permuted_slot,
                            const Tensor& probs, int64_t H, Tensor* y) {
  const int64_t T = static_cast<int64_t>(tokens.offsets.size()) - 1;
  GALE_CHECK_EQ(y->size(0), T);
  const float* q = probs.data<float>();
  float* out = y->data<float>();
  parallel_for(T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* d = out + t * H;
      std::fill(d, d + H, 0.0f);
      for (int64_t i = tokens.offsets[t]; i < tokens.offsets[t + 1]; ++i) {
        const int64_t r = tokens.rows[i];
        weighted_row_accumulate(d, in.row[r], q[permuted_slot[r]], H);
      }
    }
  });
}

void mc2_sum_token_rows(const Mc2Rows& in, const TokenRows& tokens, int64_t H, Tensor* dx) {
  const int64_t T = static_cast<int64_t>(tokens.offsets.size()) - 1;
  GALE_CHECK_EQ(dx->size(0), T);
  float* out = dx->data<float>();
  parallel_for(T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* d = out + t * H;
      std::fill(d, d + H, 0.0f);
      for (int64_t i = tokens.offsets[t]; i < tokens.offsets[t + 1]; ++i) add_inplace(d, in.row[tokens.rows[i]], H);
    }
  });
}

}  // namespace gale
