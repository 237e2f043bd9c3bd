// The mixture-of-experts MLP (Megatron-Core MoELayer, one process): router, top-k routing, token
// permutation to the experts, expert MLPs, weighted un-permutation; explicit forward and backward.
//
// Shapes (T tokens of one micro-batch, H hidden, E experts, k = --moe-router-topk, Fe expert FFN):
//   x [T, H] -> the router (model/moe_router.h: score function, top-k, expert bias, token dropping,
//   auxiliary losses) gives each token k experts with routing weights q [T, k], some (token,
//   expert) pairs dropped under --moe-expert-capacity-factor
//   -> permutation: expert e gets the n_e rows of the kept pairs that chose it, in token order
//      (--moe-pad-expert-input-to-capacity: also weight-0 padding rows, up to its capacity)
//   -> expert e: fc1 [Fe or 2Fe, H] -> GeLU / SwiGLU -> fc2 [H, Fe] (+ biases when the model has them)
//   -> y_t = Σ_kept slots q_t,slot · expert_{e_slot}(x_t)   [T, H]
// Backward adds the routing weights' gradient and the auxiliary losses' (coeff·scale·∂aux/∂l and
// z_coeff·scale·∂z/∂l, scale being the schedule's: Megatron's MoEAuxLossAutoScaler, 1 /
// num_microbatches) to the router logits' gradient; the losses never enter the lm loss. Expert
// GEMMs run through OpTable::gemm (bf16 GEMMs under --bf16) on each expert's gathered rows; the
// router runs in f32.
//
// Tensor, sequence and context parallelism (Megatron-Core's MoE under TP with --sequence-parallel,
// and CP): the layer's input is this rank's own tokens (the sequence-parallel slice; under CP its
// sequence chunks), routed locally by the replicated router (its gradient is partial per rank and
// all-reduced over TP like the SP norms, over DP×CP like any dense weight). The experts are split
// over the expert-TP group `etp` (--expert-tensor-parallel-size, default TP): fc1 column-parallel
// (SwiGLU: gate and up halves each split), fc2 row-parallel. After the EP dispatch each local
// expert's rows are all-gathered over ETP (expert j: ETP rank 0's rows, then rank 1's, ...), every
// rank applies its shards, and the partial fc2 outputs are reduce-scattered back to the rows'
// ranks (backward: all-gather of the output gradients, reduce-scatter of fc1's input gradients;
// Megatron's dispatcher does the same with gather_from/reduce_scatter_to_sequence_parallel_region).
// The auxiliary losses cover the whole sequence (Megatron's sequence_partition_group = TP×CP,
// `seq`): n_e summed over the group, Σ_t s_t,e kept local, N = T·|seq| tokens, so every rank's
// logit gradient is its share of the whole sequence's aux = E/(N²·k)·Σ_e (Σ_t s_t,e)·n_e, and
// z = Σ_t lse_t² / N; the values `losses` receives are summed over `seq` (the whole sequence's).
//
// Expert parallelism (`ep`, an EP group of size > 1): this rank holds El = E/EP experts (EP rank
// r: global experts r·El ...) and the replicated router; each local expert sees the rows of every
// EP rank's tokens that chose it, in (source rank, token) order. The router, top-k and the aux
// losses (over this rank's tokens, Megatron's default with TP = CP = 1) stay local. Two token
// dispatchers (Megatron-Core's), equal up to the summation order of a token's k outputs:
//   alltoall:  the permuted rows go to the experts' owners and come back (model/moe_dispatch.h);
//              the weighted un-permutation is local;
//   allgather: every rank all-gathers the EP group's tokens, routing and weights [EP·T, ...],
//              runs its experts on their rows, weights and sums them into [EP·T, H] and
//              reduce-scatters that back to the tokens' ranks (backward: all-gather of the output
//              gradients, reduce-scatter of the token and routing-weight gradients). All EP ranks
//              must hold the same T.
// With a placement (MoeParamIds::placement, --enable-expert-placement, alltoall only) the chosen
// global experts are relabelled to the physical experts that hold them before the permutation; a
// token's k outputs and input gradients are still summed in global expert order.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <memory>

#include "core/tensor.h"
#include "kernels/op_table.h"
#include "model/config.h"
#include "model/expert_placement.h"
#include "model/moe_dispatch.h"
#include "model/moe_router.h"
#include "model/params.h"

namespace gale {

class WeightGradStore;  // model/weight_grad_store.h
class MoeHotExperts;    // model/moe_hot_experts.h
struct MoeHotPass;      // below

// Ids of one MoE layer's parameters in the ParamBuffer (-1 when absent).
struct MoeParamIds {
  int router_w = -1;                      // decoder.layers.{i}.mlp.router.weight [E, H]
  int router_b = -1;                      // decoder.layers.{i}.mlp.router.bias [E] (--add-bias-linear; -1: none)
  int expert_bias = -1;                   // decoder.layers.{i}.mlp.router.expert_bias [E] (a buffer; -1: none)
  std::vector<int> fc1_w, fc1_b, fc2_w, fc2_b;  // per local expert j: ...mlp.experts.local_experts.{j}.linear_fc1.weight ...
  // --enable-expert-placement (model/expert_placement.h): which physical expert (rank, slot) holds
  // each global expert, and the load counters; null: the identity layout (local slot j of EP rank r
  // is global expert r·El + j). Shared by the copies of these ids; changed only between steps.
  std::shared_ptr<MoePlacement> placement;
  // --moe-router-load-balancing-type global_aux_loss: the step's token counts (model/moe_router.h);
  // null otherwise. Shared by the copies of these ids; reset before each step's passes.
  std::shared_ptr<MoeGlobalAux> global_aux;
  // --moe-router-load-balancing-type quantile_balancing: decoder.layers.{i}.mlp.router.qb_beta [E]
  // (a buffer) and the step's quantile sums (model/moe_router.h); -1 / null otherwise.
  int qb_beta = -1;
  std::shared_ptr<MoeQuantileBalancing> qb;
  bool defined() const { return router_w >= 0; }
  std::vector<int> all() const;  // every parameter id, router first (not the buffers expert_bias, qb_beta)
  MoeRouterIds router() const { return MoeRouterIds{router_w, router_b, expert_bias, global_aux.get(), qb_beta, qb.get()}; }
};

// Registers global layer `layer`'s router and this EP rank's experts with Megatron-Core names and
// Megatron's init (router and fc1: normal(0, std); fc2: normal(0, std/sqrt(2L)); the router's bias
// (--add-bias-linear, Megatron's TopKRouter.bias) normal(0, std) as its weight; other biases 0). Not
// TP-split but split over the expert-TP group (etp_size, etp_rank): fc1 weight and bias dim 0 (two
// blocks under SwiGLU), fc2 weight dim 1, fc2 bias whole. `router_partial_grad`: the router's
// gradient is partial per TP rank (sequence_parallel: all-reduced over TP); `experts_partial_grad`
// the same for the experts (whole on every TP rank under --expert-tensor-parallel-size 1, each
// rank's experts seeing only its own tokens). With ep_size > 1 the experts are E/ep_size local ones named by their local index j
// (as Megatron's module), marked expert_parallel, with global_name the global expert
// ep_rank·E/ep_size + j (their initial values and checkpoint tensors).
MoeParamIds register_moe_params(ParamBuffer& pb, const ModelConfig& c, int64_t layer, int64_t ep_size = 1,
                                int64_t ep_rank = 0, int64_t etp_size = 1, int64_t etp_rank = 0,
                                bool router_partial_grad = false, bool experts_partial_grad = false);

// The rows of one exchange over the expert-TP group: every ETP rank's rows per local expert.
struct MoeEtpLayout {
  int64_t padded_rows = 0;           // the most rows any ETP rank holds (the all-gather's block)
  std::vector<int64_t> offsets;      // [El + 1] local expert j's gathered rows [offsets[j], offsets[j+1])
  std::vector<int64_t> source_row;   // gathered row -> row of the padded all-gather [ETP·padded_rows]
};

// What forward keeps for backward (one layer, one micro-batch).
struct MoeSaved {
  Tensor x;                            // [T, H] the input as the GEMMs take it (bf16 under --bf16)
  MoeRouterSaved router;               // the router's state
  std::vector<int64_t> tokens_per_expert;  // [E] kept pairs per expert (the expert-bias counts)
  Tensor probs;                        // [T, k] routing weights
  std::vector<int32_t> experts;        // [T, k] the chosen experts, best first; -1: dropped
  std::vector<int64_t> offsets;        // [E + 1] expert e's rows are [offsets[e], offsets[e+1]) of the permuted order
  std::vector<int64_t> permuted_slot;  // [R] permuted row -> t·k + slot (R kept pairs); -(t + 1): a
                                       // padding row of token t (--moe-pad-expert-input-to-capacity)
  std::vector<int64_t> row_order;      // with a placement: the permuted rows (physical expert order)
                                       // in global expert order, the order a token's rows are summed
                                       // in (so the sums are the unplaced run's); empty: identity
  MoeDispatchPlan plan;                // the exchange with the EP group (identity without EP); with
                                       // the all-gather dispatcher only local_experts and expert_offsets
  bool gathered = false;               // the all-gather dispatcher ran
  std::vector<int64_t> gathered_slot;  // all-gather: local row -> t'·k + slot over the EP group's P·T tokens
  Tensor gathered_probs;               // all-gather: [P·T·k] the EP group's routing weights
  MoeEtpLayout etp;                    // the expert-TP exchange (none without ETP)
  Tensor expert_in;                    // [rows of the local experts, H] their input rows, local expert-major
                                       // (under ETP: the whole ETP group's rows); undefined under
                                       // --moe-zero-memory: re-dispatched from x in backward
  std::vector<Tensor> fc1_out;         // per local expert [n_j, Fe or 2Fe], bias included (the activation's
                                       // input); undefined under level1: recomputed from the re-dispatched rows
  std::vector<Tensor> act;             // per local expert [n_j, Fe], as the fc2 GEMM takes it (undefined
                                       // with config.recompute.moe_act or --moe-zero-memory: recomputed)
  Tensor expert_out;                   // [R, H] permuted rows' expert outputs (for the routing-weight
                                       // gradient); all-gather: the local experts' outputs [N, H]
  MoeZeroMemory zero_memory = MoeZeroMemory::kOff;  // what this forward dropped (config.h)
  // --balanced-moe-experts: this forward's hot experts and the rows computed with their replicas
  // (null without); `plan` then covers only the rows sent through the all-to-all.
  std::shared_ptr<MoeHotPass> hot;

  // Bytes of the tensors kept (x, the router's, probs, expert rows, fc1 outputs, activations,
  // expert outputs, and a hot-expert pass's replica input rows, fc1 outputs and activations; the
  // index vectors and the replicas' parameters are not counted): what --moe-zero-memory shrinks.
  int64_t tensor_bytes() const;
};

// One forward's hot-expert replication (--balanced-moe-experts, ops.moe_hot_experts > 0 with the
// all-to-all dispatcher and EP > 1): the replicas, which permuted rows (indices into the permuted
// order) went through the all-to-all and which stayed here for a replica (replica-major, each
// replica's rows in token order), and what the replicas' forward kept for backward.
struct MoeHotPass {
  std::unique_ptr<MoeHotExperts> experts;
  std::vector<int64_t> sent_rows, hot_rows;
  std::vector<int64_t> hot_offsets;  // [replicas + 1] replica i's rows [hot_offsets[i], hot_offsets[i+1]) of hot_rows
  MoeSaved state;                    // expert_in, fc1_out, act of the replicas
  MoeHotPass();
  ~MoeHotPass();
  int64_t num_rows() const { return static_cast<int64_t>(hot_rows.size()); }
  // The slots (permuted[r]) of the hot rows and of the sent rows.
  std::vector<int64_t> slots(const std::vector<int64_t>& permuted) const;
  std::vector<int64_t> sent_slots(const std::vector<int64_t>& permuted) const;
};

// Returns y [T, H] (f32). With `saved` (training) the state for backward is kept and `losses`, when
// not null, receives the auxiliary losses. `ep`: the expert-parallel group (null: none); every
// rank of it must call with the same layer. `allgather`: the all-gather dispatcher (else all-to-all).
// `etp`: the expert-TP group (null or size 1: whole experts); `seq`: the group the sequence is
// split over (TP×CP; null: none). Every rank of each group must call with the same layer. `batch`:
// the micro-batch's sequences B (rows t = s·B + b; seq_aux_loss). `overlap`, when set, runs once
// while the all-to-all dispatch of the routed rows is in flight (the all-gather dispatcher: before
// its all-gathers, or with ops.moe_allgather_overlap while they are in flight: the routing's and
// then the hidden states', the local rows' layout computed before the hidden states are waited
// for; --moe-shared-expert-overlap, model/moe_shared_expert.h). `router_key` keys the router's input
// jitter (--moe-input-jitter-eps) and says whether this is a training forward (model/moe_router.h). With config.recompute.moe_act the experts'
// activation outputs are not kept (backward recomputes them from the kept fc1 outputs).
// `zero_memory` (--moe-zero-memory, this layer's level; the all-to-all dispatcher only): level0
// keeps neither the experts' input rows nor their activation outputs, level1 not their fc1 outputs
// either; backward re-dispatches the rows from the kept input x and recomputes the rest with the
// same kernels, so the results are bit-identical.
// With ops.moe_alltoall_mc2 (--moe-alltoall-mc2; EP > 1 or not, expert-TP 1, no placement, hot
// experts or zero memory) the all-to-all path's dispatch and combine, forward and backward, are
// the fused ones of model/moe_mc2.h: the same bits, fewer buffers.
// With ops.moe_hot_experts = N > 0 (--balanced-moe-experts, all-to-all dispatcher, EP > 1) the N
// hot experts of this micro-batch are replicated on every EP rank (model/moe_hot_experts.h): their
// parameters broadcast over `hot_groups` (M duplicates of `ep`; empty: `ep`), each rank's rows of a
// hot expert it does not own computed here with the replica while the other rows are dispatched;
// moe_backward runs the replicas' backward while the output gradients are dispatched and sends
// their weight gradients to the owners while the input gradients are combined. Each row's output
// and input gradient are the same products of the same weights; an expert's weight gradient sums
// its rows in another grouping (not bitwise).
Tensor moe_forward(const ModelConfig& c, const OpTable& ops, const ParamBuffer& pb, const MoeParamIds& w,
                   const Tensor& x, MoeSaved* saved, MoeAuxLosses* losses, const Comm& ep = nullptr,
                   bool allgather = false, const Comm& etp = nullptr, const Comm& seq = nullptr, int64_t batch = 1,
                   const std::function<void()>& overlap = {}, const MoeRouterKey& router_key = {},
                   MoeZeroMemory zero_memory = MoeZeroMemory::kOff, const std::vector<Comm>& hot_groups = {});

// Returns dx [T, H] (f32, written); accumulates the router's and experts' gradients. `aux_scale`
// multiplies the auxiliary losses' gradients (with their coefficients). Releases `s`. `overlap`,
// when set, runs once while the all-to-all dispatch of the output gradients is in flight (the
// all-gather dispatcher: before it). All-to-all backward, in this order: the output gradients'
// dispatch (under level1 after the input rows' re-dispatch, under level0 before it), `overlap`,
// level1's fc1 recomputation, each expert's fc2 and activation backward and fc1 input gradient,
// then the input gradients' combine and the fc1 weight gradients; with ops.moe_alltoall_overlap
// (--moe-alltoall-overlap-comm) the combine is issued before the fc1 weight gradients so they
// overlap it (without it: after). All-gather backward: `overlap` before the output gradients'
// all-gather, or with ops.moe_allgather_overlap (--moe-allgather-overlap-comm) while it is in
// flight; then the routing-weight gradients' reduce-scatter is issued before the experts' backward
// and the token gradients' before the fc1 weight gradients. Only independent work moves, so every
// order gives the same bits. With `defer_weight_grads` (--dualpipev-dw-detach) the experts' fc1
// and fc2 weight gradients are queued there as expert batches (model/weight_grad_store.h); the
// router's and the biases' gradients are computed at once.
Tensor moe_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const MoeParamIds& w, MoeSaved& s,
                    const Tensor& dy, double aux_scale, const Comm& ep = nullptr, const Comm& etp = nullptr,
                    const std::function<void()>& overlap = {}, WeightGradStore* defer_weight_grads = nullptr);

}  // namespace gale
