// The all-to-all token dispatcher's fused dispatch and combine (MindSpeed's --moe-alltoall-mc2).
//
// The plain exchange (model/moe_dispatch.h) moves whole tensors: the permuted rows [R, H] are
// gathered, sent with one all_to_allv into a source-major receive buffer [N, H], and copied again
// into the experts' expert-major layout [N, H]; the combine copies the experts' outputs [N, H]
// back into a source-major send buffer [N, H] before its all_to_allv into [R, H], and the
// weighted un-permutation then walks those rows. The fused forms here do each step once:
//   dispatch: every permuted row is written by the caller's `RowWriter` (the routing's
//             permutation: a row of x; backward: q·dy and the routing-weight gradient) straight
//             to where it goes: a row for a local expert of this rank straight into the experts'
//             expert-major input, a row for another rank into a send buffer holding only those;
//             each (rank, local expert) chunk then travels as its own message and lands straight
//             at its expert-major place (no source-major buffer, no sort copy);
//   combine:  each chunk of the experts' expert-major rows is sent straight from them (no unsort
//             copy) and received straight at its place in the sender's permuted order; a local
//             chunk is read where it is (or copied, when the caller keeps the rows in permuted
//             order); Mc2Rows then gives each permuted row's address, and the weighted
//             un-permutation (forward) or the input gradients' sum (backward) reduces every token's
//             rows from there, token by token (threads over tokens).
// A token's rows are summed in ascending permuted-row order (the plain path's order: global
// expert order), each starting from zero, with the same per-row kernels (weighted_row_accumulate,
// add_inplace), so losses and gradients are bit-identical to the plain dispatcher.
//
// The exchange runs as point-to-point messages on the EP group (tag kMc2Tag + 2·j for dispatches,
// + 1 for combines: local expert j's chunk); one exchange's messages are all waited for before
// the next is issued, so MPI's in-order matching pairs them. Restrictions (the feature refuses the
// rest): expert-TP size 1, no expert placement, no hot-expert replicas, no --moe-zero-memory, one
// exchange in flight per group (no --moe-fb-overlap).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/moe_dispatch.h"

namespace gale {

// The first tag of the fused exchanges' messages on the EP group.
constexpr int kMc2Tag = 20000;

// Writes permuted row r (0 <= r < plan.num_sent(), this rank's rows grouped by global expert) to
// `dst` (H elements of the exchange's dtype). Called once per row, possibly from several threads
// (rows are independent).
using RowWriter = std::function<void(int64_t r, void* dst)>;

// Dispatch: the rows of `plan` written by `write_row` -> [plan.num_received(), H] of `dtype`,
// local expert-major (expert j: rank 0's rows, then rank 1's, ...; the plain dispatch_rows'
// layout). `while_in_flight` (when set) runs once after the messages are posted, before they are
// waited for. Collective over `ep` (null: one rank).
Tensor mc2_dispatch(const Comm& ep, const MoeDispatchPlan& plan, int64_t H, DType dtype, const RowWriter& write_row,
                    const std::function<void()>& while_in_flight = {});

// The combined rows: the address of every permuted row's H floats.
struct Mc2Rows {
  Tensor rows;                     // [R, H] in permuted order (materialized), or [remote rows, H]
  Tensor local;                    // the experts' rows the local chunks are read from (not materialized)
  std::vector<const float*> row;   // [R] permuted row r's values
};

// Combine: `rows` [plan.num_received(), H] f32, local expert-major -> every permuted row of this
// rank. `materialize`: the result's `rows` is [R, H] in permuted order (remote chunks received in
// place, local chunks copied), else it holds only the remote chunks and the local ones are read
// from `rows` (kept in `local`). Collective over `ep` (null: one rank).
Mc2Rows mc2_combine(const Comm& ep, const MoeDispatchPlan& plan, const Tensor& rows, bool materialize);

// The tokens' rows of a permutation: token t's permuted rows (ascending) are
// rows[offsets[t] .. offsets[t+1]); padding rows (slot < 0) are left out.
struct TokenRows {
  std::vector<int64_t> offsets;  // [T + 1]
  std::vector<int64_t> rows;
};
TokenRows token_rows(const std::vector<int64_t>& permuted_slot, int64_t T, int64_t k);

// dst[h] += q·src[h] for h < H: the weighted un-permutation's step (both dispatchers' paths use
// this one function, so their sums have the same bits).
void weighted_row_accumulate(float* dst, const float* src, float q, int64_t H);

// y [T, H] = Σ_{r of token t, ascending} q[slot_r]·row_r, from zero (the weighted un-permutation).
void mc2_weighted_unpermute(const Mc2Rows& in, const TokenRows& tokens, const std::vector<int64_t>& permuted_slot,
                            const Tensor& probs, int64_t H, Tensor* y);

// dx [T, H] = Σ_{r of token t, ascending} row_r, from zero (the input gradients' sum).
void mc2_sum_token_rows(const Mc2Rows& in, const TokenRows& tokens, int64_t H, Tensor* dx);

}  // namespace gale
