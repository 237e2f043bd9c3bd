// Expert-parallel token exchange of a MoE layer (Megatron-Core's MoEAlltoAllTokenDispatcher):
// rows grouped by global expert on the sending rank <-> rows grouped by local expert on the rank
// that owns the expert.
//
// With EP ranks and E experts each rank owns El = E/EP experts: EP rank r holds the global
// experts r·El ... r·El + El − 1 (Megatron's local_expert_indices). A rank's permuted rows (its
// T·k routed token copies, grouped by global expert, token order inside each expert) are
// therefore already grouped by destination rank. The exchange, per MoE layer and micro-batch:
//   1. counts:  all_to_all of the El per-expert row counts destined to each rank; recv[s·El + j]
//               is the number of rows source rank s sends to local expert j;
//   2. rows:    all_to_allv of the permuted rows (the received block of rank s holds its rows for
//               local experts 0..El−1 in turn);
//   3. sort:    the received chunks reordered expert-major (expert j: the rows of rank 0, then of
//               rank 1, ...; Megatron's sort_chunks_by_idxs), so each local expert's rows are
//               contiguous, ordered by (source rank, token).
// combine is the exact inverse (unsort, all_to_allv back). The backward pass uses the same two
// functions in the mirrored roles: the output gradients are dispatched like the inputs, the
// input gradients combined like the outputs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace gale {

// Process-wide counters of the MoE all-to-all dispatcher (tests, the docs' figures): rows that
// left this process through the dispatches (forward inputs and backward output gradients; the rows
// a rank keeps for its own experts are not counted), rows computed with a hot-expert replica
// (--balanced-moe-experts, model/moe_hot_experts.h), the most rows one forward of this process ran
// through its experts (local experts plus replicas), and the replicas made.
struct MoeDispatchCounters {
  std::atomic<long long> rows_sent_to_other_ranks{0};
  std::atomic<long long> hot_rows_computed_locally{0};
  std::atomic<long long> max_expert_rows{0};
  std::atomic<long long> replicas{0};
  void note_expert_rows(long long rows);
  void reset();
};
MoeDispatchCounters& moe_dispatch_counters();

// The row counts of one exchange over the EP group.
struct MoeDispatchPlan {
  int64_t ep_size = 1;
  int64_t local_experts = 0;          // El
  std::vector<int64_t> send_counts;   // [EP·El] rows this rank sends to rank r for its local expert j (r·El + j)
  std::vector<int64_t> recv_counts;   // [EP·El] rows rank s sends here for local expert j (s·El + j)
  std::vector<int64_t> expert_offsets;  // [El + 1] local expert j's rows after the sort: [offsets[j], offsets[j+1])

  int64_t num_sent() const;      // Σ send_counts (= T·k)
  int64_t num_received() const;  // Σ recv_counts (= expert_offsets[El])
};

// Step 1: exchanges `tokens_per_expert` [E] (this rank's rows per global expert) over `ep`;
// E must be a multiple of ep->size(). Collective over `ep`.
MoeDispatchPlan make_dispatch_plan(const Comm& ep, const std::vector<int64_t>& tokens_per_expert);

// A row exchange in flight (dispatch_rows_async / combine_rows_async): the all_to_allv has been
// issued; wait() completes it and returns the rows in the receiver's order (a dispatch: sorted
// expert-major). Keeps its buffers alive until then; wait() must be called exactly once, and
// exchanges on one EP group are waited for in any order (they complete in issue order).
class PendingRows {
 public:
  PendingRows() = default;
  Tensor wait();

 private:
  friend PendingRows dispatch_rows_async(const Comm&, const MoeDispatchPlan&, const Tensor&);
  friend PendingRows combine_rows_async(const Comm&, const MoeDispatchPlan&, const Tensor&);
  WorkPtr work_;                            // null: nothing in flight (one EP rank)
  Tensor send_, received_;                  // the exchange's buffers (received_: the result without a sort)
  const MoeDispatchPlan* sort_ = nullptr;   // a dispatch: the plan its received chunks are sorted by
};

// Steps 2-3 without waiting: issues the row exchange of dispatch_rows (collective over `ep`, in
// issue order with the group's other operations); `plan` must outlive the wait.
PendingRows dispatch_rows_async(const Comm& ep, const MoeDispatchPlan& plan, const Tensor& rows);
// combine_rows without waiting (the unsort runs before the exchange is issued).
PendingRows combine_rows_async(const Comm& ep, const MoeDispatchPlan& plan, const Tensor& rows);

// Steps 2-3: `rows` [num_sent, H] (f32 or bf16) grouped by global expert -> [num_received, H]
// grouped by local expert. Collective over `ep`. `while_in_flight`, when set, runs once on the
// calling thread after the row exchange has started and before it is waited for (right away with
// one EP rank): --moe-shared-expert-overlap runs the shared expert there.
Tensor dispatch_rows(const Comm& ep, const MoeDispatchPlan& plan, const Tensor& rows,
                     const std::function<void()>& while_in_flight = {});

// The inverse: `rows` [num_received, H] grouped by local expert -> [num_sent, H] on the ranks that
// sent them, in their original order. Collective over `ep`.
Tensor combine_rows(const Comm& ep, const MoeDispatchPlan& plan, const Tensor& rows);

}  // namespace gale
