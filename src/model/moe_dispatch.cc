// All-to-all token dispatch and combine over the expert-parallel group.
#include "model/moe_dispatch.h"

#include <cstring>
#include <numeric>

#include "core/check.h"

namespace gale {

namespace {

// Displacements (exclusive prefix sums) of per-rank element counts.
std::vector<int64_t> displacements(const std::vector<int64_t>& counts) {
  std::vector<int64_t> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

// Per-rank sums of [EP·El] chunk counts, times the row width.
std::vector<int64_t> per_rank_elements(const std::vector<int64_t>& chunk_counts, int64_t ep, int64_t el, int64_t width) {
  std::vector<int64_t> out(static_cast<size_t>(ep), 0);
  for (int64_t r = 0; r < ep; ++r)
    for (int64_t j = 0; j < el; ++j) out[r] += chunk_counts[r * el + j] * width;
  return out;
}

// Start row of chunk (s, j) in the source-major layout (what all_to_allv delivers) and in the
// expert-major layout (what the experts take).
void chunk_starts(const MoeDispatchPlan& p, std::vector<int64_t>* source_major, std::vector<int64_t>* expert_major) {
  const int64_t ep = p.ep_size, el = p.local_experts;
  source_major->assign(static_cast<size_t>(ep * el), 0);
  expert_major->assign(static_cast<size_t>(ep * el), 0);
  int64_t at = 0;
  for (int64_t s = 0; s < ep; ++s)
    for (int64_t j = 0; j < el; ++j) (*source_major)[s * el + j] = at, at += p.recv_counts[s * el + j];
  at = 0;
  for (int64_t j = 0; j < el; ++j)
    for (int64_t s = 0; s < ep; ++s) (*expert_major)[s * el + j] = at, at += p.recv_counts[s * el + j];
}

// Copies every chunk's rows from `from` starts to `to` starts.
void move_chunks(const MoeDispatchPlan& p, const char* src, const std::vector<int64_t>& from, char* dst,
                 const std::vector<int64_t>& to, size_t row_bytes) {
  for (size_t c = 0; c < p.recv_counts.size(); ++c)
    std::memcpy(dst + to[c] * row_bytes, src + from[c] * row_bytes, static_cast<size_t>(p.recv_counts[c]) * row_bytes);
}

}  // namespace

void MoeDispatchCounters::note_expert_rows(long long rows) {
  long long seen = max_expert_rows.load();
  while (rows > seen && !max_expert_rows.compare_exchange_weak(seen, rows)) {
  }
}

void MoeDispatchCounters::reset() {
  rows_sent_to_other_ranks = 0;
  hot_rows_computed_locally = 0;
  max_expert_rows = 0;
  replicas = 0;
}

MoeDispatchCounters& moe_dispatch_counters() {
  static MoeDispatchCounters counters;
  return counters;
}

int64_t MoeDispatchPlan::num_sent() const { return std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0}); }
int64_t MoeDispatchPlan::num_received() const {
  return std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
}

MoeDispatchPlan make_dispatch_plan(const Comm& ep, const std::vector<int64_t>& tokens_per_expert) {
  MoeDispatchPlan p;
  p.ep_size = ep ? ep->size() : 1;
  const int64_t E = static_cast<int64_t>(tokens_per_expert.size());
  GALE_CHECK(E % p.ep_size == 0) << E << " experts over " << p.ep_size << " expert-parallel ranks";
  p.local_experts = E / p.ep_size;
  p.send_counts = tokens_per_expert;
  p.recv_counts.assign(static_cast<size_t>(E), 0);
  if (p.ep_size == 1)
    p.recv_counts = p.send_counts;
  else
    ep->all_to_all(p.send_counts.data(), p.recv_counts.data(), p.local_experts, DType::kI64);
  p.expert_offsets.assign(static_cast<size_t>(p.local_experts + 1), 0);
  for (int64_t j = 0; j < p.local_experts; ++j) {
    int64_t n = 0;
    for (int64_t s = 0; s < p.ep_size; ++s) n += p.recv_counts[s * p.local_experts + j];
    p.expert_offsets[j + 1] = p.expert_offsets[j] + n;
  }
  return p;
}

Tensor PendingRows::wait() {
  if (work_) work_->wait();
  work_ = nullptr;
  send_ = Tensor();
  if (sort_ == nullptr) return std::move(received_);
  const MoeDispatchPlan& p = *sort_;
  const int64_t H = received_.size(1);
  std::vector<int64_t> source_major, expert_major;
  chunk_starts(p, &source_major, &expert_major);
  Tensor out = Tensor::empty({p.num_received(), H}, received_.dtype());
  move_chunks(p, static_cast<const char*>(received_.raw()), source_major, static_cast<char*>(out.raw()), expert_major,
              static_cast<size_t>(H) * dtype_size(received_.dtype()));
  received_ = Tensor();
  return out;
}

PendingRows dispatch_rows_async(const Comm& ep, const MoeDispatchPlan& p, const Tensor& rows) {
  GALE_CHECK_EQ(rows.size(0), p.num_sent());
  PendingRows pending;
  if (p.ep_size == 1) {  // one rank: global = local experts, nothing to move
    pending.received_ = rows;
    return pending;
  }
  const int64_t H = rows.size(1);
  const std::vector<int64_t> send = per_rank_elements(p.send_counts, p.ep_size, p.local_experts, H);
  const std::vector<int64_t> recv = per_rank_elements(p.recv_counts, p.ep_size, p.local_experts, H);
  long long sent_away = 0;
  for (int64_t r = 0; r < p.ep_size; ++r)
    if (r != ep->rank()) sent_away += send[static_cast<size_t>(r)] / H;
  moe_dispatch_counters().rows_sent_to_other_ranks += sent_away;
  pending.send_ = rows;
  pending.received_ = Tensor::empty({p.num_received(), H}, rows.dtype());
  pending.sort_ = &p;
  pending.work_ = ep->all_to_allv_async(rows.raw(), send, displacements(send), pending.received_.raw(), recv,
                                        displacements(recv), rows.dtype());
  return pending;
}

PendingRows combine_rows_async(const Comm& ep, const MoeDispatchPlan& p, const Tensor& rows) {
  GALE_CHECK_EQ(rows.size(0), p.num_received());
  PendingRows pending;
  if (p.ep_size == 1) {
    pending.received_ = rows;
    return pending;
  }
  const int64_t H = rows.size(1);
  std::vector<int64_t> source_major, expert_major;
  chunk_starts(p, &source_major, &expert_major);
  pending.send_ = Tensor::empty({p.num_received(), H}, rows.dtype());
  move_chunks(p, static_cast<const char*>(rows.raw()), expert_major, static_cast<char*>(pending.send_.raw()),
              source_major, static_cast<size_t>(H) * dtype_size(rows.dtype()));
  const std::vector<int64_t> send = per_rank_elements(p.recv_counts, p.ep_size, p.local_experts, H);
  const std::vector<int64_t> recv = per_rank_elements(p.send_counts, p.ep_size, p.local_experts, H);
  pending.received_ = Tensor::empty({p.num_sent(), H}, rows.dtype());
  pending.work_ = ep->all_to_allv_async(pending.send_.raw(), send, displacements(send), pending.received_.raw(), recv,
                                        displacements(recv), rows.dtype());
  return pending;
}

Tensor dispatch_rows(const Comm& ep, const MoeDispatchPlan& p, const Tensor& rows,
                     const std::function<void()>& while_in_flight) {
  PendingRows pending = dispatch_rows_async(ep, p, rows);
  if (while_in_flight) while_in_flight();
  return pending.wait();
}

Tensor combine_rows(const Comm& ep, const MoeDispatchPlan& p, const Tensor& rows) {
  return combine_rows_async(ep, p, rows).wait();
}

}  // namespace gale
