// The MoE router (Megatron-Core TopKRouter): logits -> top-k experts, routing weights, token dropping, aux losses.
//
// Shapes (T tokens of one micro-batch on this rank, H hidden, E experts, k = --moe-router-topk):
//   logits l = x·W_routerᵀ [T, E] (f32). Scores and the top-k choice:
//     softmax (default):        the top-k of l (ties: the lower expert) and q = softmax over the k
//                               selected logits; --moe-router-pre-softmax: top-k of s = softmax(l)
//                               over all E, q = s at the selected experts;
//     sigmoid:                  σ = sigmoid(l); the top-k of σ + b (b: the expert bias, when
//                               enabled; it only steers the choice), q = σ at the selected experts,
//                               divided by (their sum + 1e-20) when k > 1 (pre-softmax ignored, as
//                               Megatron);
//     group-limited routing (--moe-router-num-groups G, --moe-router-group-topk g): the experts in
//       G consecutive groups of E/G; a group's score is the sum of its k/g largest routing values
//       (the values the top-k is taken on: l, s or σ + b); only the g best groups are eligible;
//   routing weights: q · --moe-router-topk-scaling-factor [T, k].
//   sinkhorn (--moe-router-load-balancing-type sinkhorn, S-BASE; Megatron's
//     sinkhorn_load_balancing): the scores are σ = sigmoid(l) when k = 1, else s = softmax(l) over
//     all E, and q = the score at each chosen expert (no renormalisation, bias, groups or scaling).
//     A training forward (MoeRouterKey::training) chooses the top-k of moe_sinkhorn(l) over this
//     rank's T tokens (the balanced logits: only the choice, no gradient flows through them); an
//     evaluation forward the top-k of the scores. The choice thus depends on the other local
//     tokens: under sequence parallelism or CP each rank balances its own share, as in Megatron.
//   quantile_balancing (--moe-router-load-balancing-type quantile_balancing, Megatron main's QB):
//     the experts are the top-k of l − qb_beta (MoeRouterIds::qb_beta, a per-layer buffer [E]) by
//     moe_qb_dual_update, the weights the score function's at them (as the rows above: softmax over
//     the k selected logits, softmax(l) at them under pre-softmax, or σ normalised; scaled). A
//     training forward that keeps state and reports losses (the one counted once per micro-batch)
//     all-gathers the f32 logits over `seq` (TP×CP, rows in rank order; this rank keeps its rows'
//     choice) and adds the column quantile of the gathered tokens to MoeRouterIds::qb; other
//     forwards (evaluation, generation, a --recompute-modules moe rerun) choose per token. The step
//     end moves qb_beta (update_qb_beta, train/grad_sync.cc).
// --fix-router (MindSpeed's, for benchmarking): after the weights above, pair j of row t is sent to
// expert (t·k + j) mod E instead (every expert gets T·k/E pairs); the weights and their gradient are
// still those of the real choice, which MoeRouterSaved::experts keeps.
// Token dropping (--moe-expert-capacity-factor F, Megatron's apply_router_token_dropping): each
// expert keeps at most C = ceil(T·k/E·F) of this rank's T tokens (no dropping when C > T): those
// with the largest weights (ties: the earlier token) or with --moe-token-drop-policy position the
// earliest; a dropped (token, expert) pair gets no row and weight 0 (the weights of the token's
// other experts are not renormalised). --moe-pad-expert-input-to-capacity: every expert gets exactly
// min(C, T) rows (Megatron: all T when C > T), the missing ones padding rows of the earliest tokens
// that did not choose it, with weight 0 (no effect on outputs or gradients; they count as kept pairs
// for the expert bias, as in Megatron's routing map).
// Auxiliary losses (training forwards only; Megatron computes them on a separate plain top-k; any
// of the three load-balancing losses may be on at once, each with its coefficient, and their
// gradients add up: Megatron's list form of --moe-router-load-balancing-type):
//   p = softmax(l) (softmax) or σ / (Σ_E σ + 1e-20) (sigmoid); n_e = tokens whose top-k of p (no
//   bias, no groups, no dropping) holds e, summed over the sequence partition group `seq` (TP×CP);
//   aux_loss:     aux = E/(N²·k) · Σ_e (Σ_t p_t,e) · n_e,  N = T·|seq|;
//   seq_aux_loss: the same per sequence b of the micro-batch (tokens t = s·B + b; n and Σ_t p per
//                 sequence, N = T/B·|seq|), averaged over the B sequences;
//   global_aux_loss (Megatron-Core's): the same with n_e summed over the whole stage's group TP×DP×CP
//                 (MoeGlobalAux::group; N = T·|group|) and averaged over this step's micro-batches so
//                 far: the m-th training forward of the step uses n̄ = (n⁽¹⁾ + ... + n⁽ᵐ⁾) / m, so the
//                 layer balances the global batch. The loss logged is summed over the group (each
//                 DP replica's share of it: Megatron's global_load_balancing_loss, no DP average).
//                 Counted once per micro-batch: by the forward that keeps state for backward and
//                 reports losses (a full-layer recompute's rerun, not its first pass); a
//                 --recompute-modules moe rerun takes the n̄ its forward used
//                 (MoeRouterKey::global_aux_counts) and counts nothing;
//   z-loss:       z = Σ_t logsumexp(l_t)² / N.
// --calculate-per-token-loss (MoeRouterKey::per_token_loss): backward's scale of every one of these
// losses is multiplied by T·|seq| (Megatron: num_local_tokens · tp_cp_group.size()); the losses
// reported are unchanged.
// The expert-bias counts are the kept (token, expert) pairs per expert (after dropping).
// --moe-router-force-load-balancing (Megatron's apply_random_logits, for benchmarking a balanced
// load): right after the router GEMM the logits l [T, E] are replaced by random ones,
// l_t,e = moe_random_logit(layer, id_t, e) ~ N(0, 1) for the token's global id id_t, and everything
// after (scores, top-k, weights, aux and z-losses) uses them; backward is straight-through: the
// gradient of the random logits is applied to the router weight and input as the real logits'.
// Megatron draws them from the expert-parallel CUDA RNG stream (per rank, per call); Gale's depend on
// (seed, layer, token, expert) only: the same under any parallel layout, in a recompute's rerun and
// at each run, and different for every token of every step (the values differ from Megatron's).
// Input jitter (--moe-input-jitter-eps eps, Megatron's apply_input_jitter, training and evaluation
// alike): the logits are l = (x ⊙ n)·W_routerᵀ with n [T, H] ~ U(1 − eps, 1 + eps) elementwise; only
// the router sees x ⊙ n (the experts get x). Megatron draws n from torch's stream in the input's
// dtype; Gale draws it in f32 from Philox, n = 1 − eps + 2·eps·uniform_at(seed, stream(layer),
// id·H + h) for token id `id` (the global token id sample·S + position: the noise of a token does
// not depend on the parallel layout, and backward redraws it instead of keeping it), so the values
// differ from Megatron's. Backward: dW += dlᵀ·(x ⊙ n), dx = n ⊙ (dl·W).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/op_table.h"
#include "model/config.h"
#include "model/params.h"

namespace gale {

// The auxiliary losses of one layer and micro-batch without their coefficients (the values
// Megatron's tracker logs as load_balancing_loss, seq_load_balancing_loss,
// global_load_balancing_loss and z_loss); each 0 when its coefficient is 0.
struct MoeAuxLosses {
  double load_balancing = 0.0;         // aux_loss
  double seq_load_balancing = 0.0;     // seq_aux_loss
  double global_load_balancing = 0.0;  // global_aux_loss
  double z = 0.0;
  // The load-balancing loss of kind `kind` (MoeAuxKind).
  double& balancing(int kind) {
    return kind == kMoeAux ? load_balancing : kind == kMoeSeqAux ? seq_load_balancing : global_load_balancing;
  }
  double balancing(int kind) const { return const_cast<MoeAuxLosses*>(this)->balancing(kind); }
};

// global_aux_loss's state of one layer over a step: the token counts n of the step's training
// forwards so far (each summed over `group`) and how many; reset() before each step's passes.
struct MoeGlobalAux {
  std::vector<double> counts;  // [E] Σ over the step's micro-batches of n_e
  int64_t micro_batches = 0;
  Comm group;  // TP×DP×CP of this pipeline stage (null: one rank)
  MoeGlobalAux(int64_t num_experts, Comm g) : counts(static_cast<size_t>(num_experts), 0.0), group(std::move(g)) {}
  void reset() {
    std::fill(counts.begin(), counts.end(), 0.0);
    micro_batches = 0;
  }
};

// quantile_balancing's state of one layer over a step (Megatron's qb_beta_accum / qb_beta_count):
// the sum of the column quantiles of the step's counting training forwards and how many; reset()
// before each step's passes.
struct MoeQuantileBalancing {
  std::vector<double> sum;  // [E]
  int64_t count = 0;
  explicit MoeQuantileBalancing(int64_t num_experts) : sum(static_cast<size_t>(num_experts), 0.0) {}
  void reset() {
    std::fill(sum.begin(), sum.end(), 0.0);
    count = 0;
  }
};

// Ids of the router's tensors in the ParamBuffer, and the layer's global_aux_loss state.
struct MoeRouterIds {
  int weight = -1;       // decoder.layers.{i}.mlp.router.weight [E, H]
  int bias = -1;         // decoder.layers.{i}.mlp.router.bias [E] (--add-bias-linear, Megatron's; gpt-oss's router bias)
  int expert_bias = -1;  // decoder.layers.{i}.mlp.router.expert_bias [E], a buffer (-1: disabled)
  MoeGlobalAux* global_aux = nullptr;  // with config.moe.global_aux_loss_coeff > 0 (else null)
  int qb_beta = -1;      // decoder.layers.{i}.mlp.router.qb_beta [E], a buffer (quantile_balancing; else -1)
  MoeQuantileBalancing* qb = nullptr;  // with quantile_balancing (else null)
};

// What a micro-batch's routing depends on besides x: the input jitter's noise is keyed by the
// global layer and each local token row's global id (null: the row index t, for a layer run on its
// own); `training` is Megatron's self.training (false in evaluate and generate), which picks
// sinkhorn's choice (also true in a recompute's rerun, so the rerun routes as its forward did).
struct MoeRouterKey {
  int64_t layer = 0;
  const int64_t* row_ids = nullptr;
  bool training = true;
  // --calculate-per-token-loss (Megatron's attach_and_log_load_balancing_loss and apply_z_loss in
  // that mode): backward multiplies every auxiliary loss (load-balancing kinds and z-loss) by the
  // router's tokens T·|seq| before the scale, so that finalize_model_grads' division by the global
  // batch's loss tokens leaves them weighted 1 / (micro-batches · DP) as in the default mode.
  bool per_token_loss = false;
  // A --recompute-modules moe rerun under global_aux_loss: the averaged counts n̄ [E] its forward
  // used (MoeRouterSaved::AuxTerm::counts of that term); the rerun takes them instead of counting
  // and leaves MoeGlobalAux as it is (null: an ordinary forward).
  const std::vector<double>* global_aux_counts = nullptr;
};

// --moe-router-force-load-balancing's logit of token id `id` (the global token id, as the jitter's)
// for expert e in layer `layer`: a standard normal (Box-Muller on Philox uniforms) under the
// config's seed, on a stream of its own per layer.
float moe_random_logit(const ModelConfig& c, int64_t layer, int64_t id, int64_t e);

// The jitter noise n of token id `id`, column h of the router's [·, H] input under config.moe's eps
// (1 without jitter): in [1 − eps, 1 + eps].
float moe_input_jitter(const ModelConfig& c, int64_t layer, int64_t id, int64_t h);

// The routing of one micro-batch.
struct MoeRouting {
  Tensor probs;                          // [T, k] routing weights (a dropped pair's value is not used)
  std::vector<int32_t> experts;          // [T, k] chosen experts, best first; -1: the pair was dropped
  std::vector<int64_t> tokens_per_expert;  // [E] kept pairs (+ padding rows) per expert (the expert-bias counts)
  std::vector<std::vector<int64_t>> padding;  // --moe-pad-expert-input-to-capacity: per expert its
                                              // padding rows' tokens, ascending (else empty)
};

// What forward keeps for backward.
struct MoeRouterSaved {
  Tensor scores;                     // [T, E] softmax(l) (softmax) or σ (sigmoid)
  Tensor logsumexp;                  // [T] of the logits (z-loss)
  Tensor logits;                     // [T, E] under sigmoid with the z-loss (its softmax)
  Tensor probs;                      // [T, k] routing weights
  std::vector<int32_t> experts;      // [T, k] chosen experts (before dropping; the real choice under fix_router)
  // One entry per load-balancing loss that is on (aux_loss, seq_aux_loss, global_aux_loss, in
  // that order): what its gradient needs.
  struct AuxTerm {
    int kind = 0;                // MoeAuxKind
    double coeff = 0.0;          // its --moe-aux-loss-coeff
    std::vector<double> counts;  // [G·E] tokens per expert of the aux top-k over its group (G = B
                                 // sequences under seq_aux_loss, else 1; global_aux_loss: n̄)
    int64_t groups = 1;          // G
    int64_t tokens = 0;          // N: tokens of one aux group over its group
  };
  std::vector<AuxTerm> aux;
  int64_t z_tokens = 0;              // the z-loss's T·|seq|
  MoeRouterKey key;                  // backward redraws the input's noise (row_ids must outlive backward)
};

// Routes x [T, H] (f32 or bf16; T = S·B rows t = s·B + b, `batch` = B). With `saved` (training) the
// state for backward is kept and `losses`, when not null, receives the auxiliary losses summed over
// `seq` (the group the sequence is split over, TP×CP; null: none, every rank of it must call).
// `jitter` keys the input jitter's noise (unused without --moe-input-jitter-eps).
MoeRouting moe_router_forward(const ModelConfig& c, const OpTable& ops, const ParamBuffer& pb, const MoeRouterIds& w,
                              const Tensor& x, int64_t batch, MoeRouterSaved* saved, MoeAuxLosses* losses,
                              const Comm& seq = nullptr, const MoeRouterKey& key = {});

// Backward from the routing weights' gradient dprobs [T, k] (0 at dropped pairs) and the auxiliary
// losses (their coefficients times `aux_scale`): accumulates the router weight's (and bias's) gradient and
// returns the input's [T, H] (f32). `x` is forward's input. Releases `s`.
Tensor moe_router_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const MoeRouterIds& w,
                           MoeRouterSaved& s, const Tensor& x, const Tensor& dprobs, double aux_scale);

// The experts chosen from routing values v [E] (best first, ties: the lower expert), limited to the
// best `group_topk` of `num_groups` groups when num_groups > 0 (group score: the sum of its
// k / group_topk largest values).
void moe_top_k(const float* v, int64_t E, int64_t k, int64_t num_groups, int64_t group_topk, int32_t* out);

// Megatron's sinkhorn(l) (moe_utils.py) of the logits l [T, E] into out [T, E]: with cost = exp(l),
// d0 [T] = 1 and d1 [E] = 1, repeat d0_t = 1/T / (Σ_e d1_e·cost_te + 1e-8), then
// d1_e = 1/E / (Σ_t d0_t·cost_te + 1e-8), until the mean |change of d1| is at most 1e-4 (at most
// 10000 rounds; computed in f64, Megatron's in f32); out_te = d0_t·cost_te·d1_e, whose rows sum to
// about 1/T and columns to 1/E.
void moe_sinkhorn(const float* logits, int64_t T, int64_t E, float* out);

// Megatron main's qb_dual_update (moe_utils.py) on scores [m, E] (f32, the micro-batch's logits
// gathered over TP×CP) with the bias beta [E], in f32 arithmetic as Megatron's: for each token the
// k experts with the largest v = scores − beta (best first, ties: the lower expert) into indices
// [m, k], and alpha_t = the (k+1)-th largest v of the token. With beta_local (training) also the
// column quantile: for each expert e the (m·k/E + 1)-th largest of scores_te − alpha_t over the m
// tokens (needs k < E and m·k divisible by E: checked by the arguments, an invariant here).
void moe_qb_dual_update(const float* scores, int64_t m, int64_t E, int64_t k, const float* beta, int32_t* indices,
                        float* beta_local);

// Megatron main's _update_router_qb_beta for one layer: avg [E] (the mean of the step's column
// quantiles over micro-batches and DP×CP) -> beta = ema·beta + (1 − ema)·avg, minus its mean over E
// (computed in f64, stored in f32).
void update_qb_beta(float* beta, const double* avg, int64_t E, double ema);

// Megatron's expert capacity ceil(tokens·k / E · factor).
int64_t moe_expert_capacity(int64_t tokens, int64_t k, int64_t E, double factor);

// Megatron's aux-loss-free bias update after a step: counts [E] (the step's kept pairs per expert,
// summed over every rank that routes different tokens) -> bias += rate · sign(mean(counts) − count).
void update_expert_bias(float* bias, const double* counts, int64_t E, double rate);

}  // namespace gale
