// --op-cal-tflops: counts the FLOPs of the GEMMs and attention the kernels actually run, as
// MindSpeed's FlopsCounter counts the matmul and flash-attention operators of a training step.
//
// install_flop_counting() wraps four op-table entries (the f32 GEMM, the bf16 GEMM, attention
// forward and backward) in functions that add the call's FLOPs to process-wide counters and then
// call the entry they replaced. Every GEMM of the model runs through those entries: the linear
// layers (dense, MoE experts and router, LoRA, MTP's eh_proj; f16 GEMMs run on OpTable::gemm too)
// and the LM head (LmHeadProblem::gemm); the attention kernels' inner products are counted once,
// as attention, not as GEMMs. What one call counts (MindSpeed's rules):
//   GEMM   C[M,N] (+)= op(A)[M,K]·op(B)[K,N]:  2·M·N·K  (alpha, beta, the accumulation into C and
//          bias additions are not counted, as MindSpeed's mm count);
//   attention forward:   4·B·NH·Sq·Sk·HD  (QKᵀ and PV, over the query heads: GQA counts NH, not KV);
//   attention backward:  8·B·NH·Sq·Sk·HD  (dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q).
// Masked blocks count: a causal, document or sliding-window mask does not lower the count, which is that of the
// whole Sq×Sk score matrix of the call, although the flash kernel skips the tiles a mask hides
// completely (MindSpeed counts npu_fusion_attention from its shapes, whatever its sparse mode).
// Work that is not run at all is not counted: ring attention (context parallelism) skips the
// key/value blocks of later chunks under the causal mask, so its count is lower than CP
// unsplit calls would be, by (CP − 1)/(2·CP) of the attention FLOPs (MindSpeed's note).
//
// Two counts, MindSpeed's pair (its "recorded" and "traversed" counts): `model` leaves out the
// forward work that backward reruns (--recompute-granularity full, --recompute-modules, and the
// fused LM head's logits when its backward recomputes them; inside a FlopCountRecompute scope),
// `with_recompute` counts everything. So `model` is the same whichever kernels run. The trainer counts one
// training step at a time (flop_counter_start/stop around train_step, as MindSpeed wraps Megatron's
// train_step); evaluation and everything outside a step only forward to the wrapped entries.
//
// The wrapped entries live in one process-wide slot per entry: one counting op table per process
// at a time (installing again replaces the inner entries; a table that already counts is left as
// it is). When --op-cal-tflops is off nothing is wrapped and nothing is counted.
#pragma once

#include <cstdint>

#include "kernels/op_table.h"

namespace gale {

struct FlopCounts {
  int64_t model = 0;           // recomputation left out (MindSpeed's recorded count: MFU)
  int64_t with_recompute = 0;  // everything the kernels ran (its traversed count: HFU)
};

// Wraps ops->gemm, ops->bf16_gemm, ops->attention_forward and ops->attention_backward; records
// "counted" in ops->impl["flop_count"].
void install_flop_counting(OpTable* ops);
// Whether the entries of `ops` are the counting wrappers.
bool counts_flops(const OpTable& ops);

// Zeroes the counts and starts counting; stop() stops (the counts stay readable).
void flop_counter_start();
void flop_counter_stop();
FlopCounts flop_counter_counts();

// The FLOPs of one call, as counted (exposed for tests and for the docs' arithmetic).
int64_t gemm_flops(int64_t M, int64_t N, int64_t K);
int64_t attention_forward_flops(const AttentionProblem& p);
int64_t attention_backward_flops(const AttentionProblem& p);

// While one is alive, counted work is recomputation: it adds to with_recompute only. Scopes nest;
// the model opens one around every forward rerun in backward. Costs one atomic add when counting
// is off.
class FlopCountRecompute {
 public:
  FlopCountRecompute();
  ~FlopCountRecompute();
  FlopCountRecompute(const FlopCountRecompute&) = delete;
  FlopCountRecompute& operator=(const FlopCountRecompute&) = delete;
};

}  // namespace gale
