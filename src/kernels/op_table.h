// The engine's compute extension points: one table of function pointers the model calls.
//
// Level 0 (`reference_ops()`) is the plain, readable reference implementation of every entry.
// Features (src/features/) replace entries with fused or vectorised versions when the
// optimisation level and their flags allow it, and record the implementation's name in `impl`
// so start-up can report what runs. A replacement must match the reference within the tolerance
// its test states (tests/kernels/).
//
// Gradient-accumulation contract (the one place it is written down): every kernel that produces
// a PARAMETER gradient ACCUMULATES into it (dw += ...), because a parameter's gradient sums over
// micro-batches (and over tied uses, e.g. the embedding and the output layer). Every kernel that
// produces an ACTIVATION gradient WRITES it (dx = ...); the model adds residual branches
// explicitly. Parameter gradients are zeroed once per iteration, before the first micro-batch.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dsa.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/rope.h"

namespace gale {

// Normalisation of rows, as one entry point for LayerNorm (bias may be null) and RMSNorm.
struct NormSpec {
  bool rms = false;
  float eps = 1e-5f;
};
// stats: [2, rows] (mean then rstd) for LayerNorm, [rows] (rstd) for RMSNorm.
using NormForwardFn = void (*)(const NormSpec&, const float* x, const float* w, const float* b, float* y,
                               float* stats, int64_t rows, int64_t H);
// dx written; dw, db accumulated (db may be null).
using NormBackwardFn = void (*)(const NormSpec&, const float* dy, const float* x, const float* w, const float* stats,
                                float* dx, float* dw, float* db, int64_t rows, int64_t H);

// Residual branch end: out = residual + dropout(x + bias) (bias may be null, dropout may be off:
// spec.p == 0). out may alias residual; x may be overwritten.
using BiasDropoutAddFn = void (*)(const float* x, const float* bias, const float* residual, float* out, int64_t rows,
                                  int64_t cols, const DropoutSpec& spec);
// Its backward: dx = dropout'(dout) (written), dbias += Σ_rows dx (when dbias != null).
// The residual's gradient is dout itself (the caller keeps it).
using BiasDropoutAddBackwardFn = void (*)(const float* dout, float* dx, float* dbias, int64_t rows, int64_t cols,
                                          const DropoutSpec& spec);

// MLP activation on the fc1 output u [rows, Fin] (Fin = F, or 2F for SwiGLU): adds the bias to u
// IN PLACE (u keeps the pre-activation for backward) and writes act [rows, F].
using ActivationForwardFn = void (*)(float* u, const float* bias, float* act, int64_t rows, int64_t F);
// du [rows, Fin] written from dact; dbias accumulated (when non-null).
using ActivationBackwardFn = void (*)(const float* dact, const float* u, float* du, float* dbias, int64_t rows,
                                      int64_t F);

// The gated MLP activation with GluSpec's options (quick-GEGLU, --glu-linear-offset,
// --activation-func-clamp-value; kernels/cpu/activation.h) on u [rows, 2F], as ActivationForwardFn:
// the bias is added to u IN PLACE before clamping (u keeps the unclamped pre-activation).
using GluForwardFn = void (*)(const GluSpec& spec, float* u, const float* bias, float* act, int64_t rows, int64_t F);
// du [rows, 2F] written from dact; dbias accumulated (when non-null).
using GluBackwardFn = void (*)(const GluSpec& spec, const float* dact, const float* u, float* du, float* dbias,
                               int64_t rows, int64_t F);

// Residual branch end fused with the next normalisation (the layer's x_mid -> norm2):
//   out = residual + dropout(x + bias);  y = Norm(out)   (stats as NormForwardFn).
// Backward stays the two separate backward entries.
using BiasDropoutAddNormFn = void (*)(const float* x, const float* bias, const float* residual, float* out,
                                      const NormSpec& norm, const float* w, const float* b, float* y, float* stats,
                                      int64_t rows, int64_t cols, const DropoutSpec& spec);

// Output layer + cross-entropy over this rank's vocabulary slice W [Vl, H] (columns
// [vocab_start, vocab_start + Vl) of the vocabulary), for x [T, H]:
//   forward writes, per token, the slice's max logit, Σ exp(logit − max) over the slice, and the
//   target's logit (0 when the target is outside the slice). The caller merges slices across TP
//   ranks into lse[t] = log Σ_v exp(logit) over the whole vocabulary.
//   backward, given lse and dloss[t], WRITES dx [T, H] and ACCUMULATES dW [Vl, H] (none when dW is null:
//   a frozen output layer under LoRA) with
//   d logits = (softmax − onehot)·dloss.
// `saved` carries whatever the implementation keeps between the two calls: the reference keeps
// the [T, Vl] logits (and turns them into their gradient in place); a fused version may keep
// nothing and work in chunks. When `single_slice` (no vocabulary split) and `dloss` is given at
// forward time, an implementation may finish the whole backward inside forward (dW accumulated,
// dx stored in `saved`); backward then only hands dx over. Evaluation passes dloss = nullptr.
struct LmHeadProblem {
  int64_t T = 0, H = 0, Vl = 0, vocab_start = 0;
  const float* x = nullptr;
  const float* W = nullptr;
  const int32_t* targets = nullptr;
  bool single_slice = true;
  const float* dloss = nullptr;  // [T] or null
  float* dW = nullptr;           // gradient of W (for an eager backward)
  SgemmFn gemm = sgemm;          // the products (the model passes OpTable::gemm)
  // --output-logit-dtype bf16: the logits x·Wᵀ rounded to bf16 (nearest even) before the loss reads
  // them (upcast, as Megatron's cross entropy), and d logits rounded to bf16 before the two backward
  // products (the gradient of a bf16 tensor, cast to the GEMM's input dtype).
  bool bf16_logits = false;
  // --output-logit-softcapping C (0: none): the logits z (after the bf16 rounding) become
  // C·tanh(z / C) before the loss reads them; backward multiplies their gradient by 1 − tanh²(z / C)
  // (kernels/cpu/logit_softcap.h).
  float logit_softcap = 0.0f;
};
using LmHeadLossForwardFn = void (*)(const LmHeadProblem& p, float* slice_max, float* slice_sumexp,
                                     float* target_logit, Tensor* saved);
using LmHeadLossBackwardFn = void (*)(const LmHeadProblem& p, const float* lse, const float* dloss, float* dx,
                                      float* dW, Tensor* saved);

// Plain dropout, y = dropout(x) (y may alias x). The backward is the same function applied to the
// gradient: same mask, same 1/(1 − p) scale (kernels/cpu/dropout.h). Used on the embeddings' output.
using DropoutFn = decltype(&dropout_forward_ref);
using AttentionForwardFn = decltype(&attention_forward_ref);
using AttentionBackwardFn = decltype(&attention_backward_ref);
using DsaSparseAttentionForwardFn = decltype(&dsa_sparse_attention_forward_ref);
using DsaSparseAttentionBackwardFn = decltype(&dsa_sparse_attention_backward_ref);
using RopeFn = decltype(&rope_forward_ref);
using EmbeddingForwardFn = decltype(&embedding_forward_ref);
using EmbeddingBackwardFn = decltype(&embedding_backward_ref);
using AdamWFn = decltype(&adamw_step_ref);
using EmaAdamWFn = decltype(&ema_adamw_step_ref);
using SumOfSquaresFn = decltype(&sum_of_squares);

struct OpTable {
  // Every f32 GEMM of the linear layers and the LM head (kernels/cpu/gemm.h): sgemm on the
  // library's own threads, or sgemm_partitioned (level 1).
  SgemmFn gemm;
  // Every bf16 GEMM of the linear layers under --bf16: gemm_bf16 (kernels/cpu/gemm.h) at every level.
  Bf16GemmFn bf16_gemm;
  NormForwardFn norm_forward;
  NormBackwardFn norm_backward;
  BiasDropoutAddFn bias_dropout_add;
  BiasDropoutAddBackwardFn bias_dropout_add_backward;
  BiasDropoutAddNormFn bias_dropout_add_norm;
  DropoutFn dropout;  // installed with bias_dropout_add (its op group)
  ActivationForwardFn gelu_forward;
  ActivationBackwardFn gelu_backward;
  // --openai-gelu: the reference kernels at every level (no fused version, so not an op group of
  // `impl`; the bias-gelu-fusion feature reports itself inactive for such a model).
  ActivationForwardFn gelu_tanh_forward;
  ActivationBackwardFn gelu_tanh_backward;
  // --squared-relu: likewise the reference kernels at every level.
  ActivationForwardFn squared_relu_forward;
  ActivationBackwardFn squared_relu_backward;
  ActivationForwardFn swiglu_forward;
  ActivationBackwardFn swiglu_backward;
  // --quick-geglu, and SwiGLU with --glu-linear-offset / --activation-func-clamp-value
  // (model/mlp_activation.h). Not an op group of its own: the fused version is installed with the
  // "gelu" group (bias-gelu-fusion, level 1: Megatron's bias_activation_fusion of quick_geglu is
  // bias_gelu_fusion) and with the "swiglu" group (--use-fused-swiglu).
  GluForwardFn glu_forward;
  GluBackwardFn glu_backward;
  RopeFn rope_forward;
  RopeFn rope_backward;
  AttentionForwardFn attention_forward;
  AttentionBackwardFn attention_backward;
  // --experimental-attention-variant dsa: attention over the indexer's top-k keys (kernels/cpu/dsa.h);
  // the reference, or the fused kernels with --use-fused-sparse-flash-attention.
  DsaSparseAttentionForwardFn dsa_sparse_attention_forward;
  DsaSparseAttentionBackwardFn dsa_sparse_attention_backward;
  EmbeddingForwardFn embedding_forward;
  EmbeddingBackwardFn embedding_backward;
  LmHeadLossForwardFn lm_head_loss_forward;
  LmHeadLossBackwardFn lm_head_loss_backward;
  AdamWFn adamw_step;
  // --optimizer-selection fused_ema_adamw: AdamW and the parameters' EMA in one pass; installed with adamw.
  EmaAdamWFn ema_adamw_step;
  // Σ g² of a gradient segment for the global gradient norm (clipping); installed with adamw.
  SumOfSquaresFn sum_of_squares;

  // Row chunks of each tensor-parallel linear's GEMM + collective (model/tp_linear.h): 1 runs the
  // plain mappings; the use-ascend-coc feature (--use-ascend-coc, --tp-comm-overlap) sets more.
  int tp_comm_chunks = 1;
  // --use-ascend-mc2 (MindSpeed's MC2 linears): a column-parallel linear under sequence parallelism
  // keeps only this rank's rows of its input for backward and all-gathers them again there,
  // overlapped with the input-gradient GEMM (model/tp_linear.h).
  bool tp_regather_input = false;
  // MindSpeed's --moe-alltoall-overlap-comm (features/feature_moe_alltoall_overlap_comm.cc): the MoE
  // all-to-all dispatcher overlaps its exchanges with independent compute (the shared expert in
  // forward and backward, the experts' fc1 weight gradients with the input gradients' combine).
  bool moe_alltoall_overlap = false;
  // MindSpeed's --moe-allgather-overlap-comm (features/feature_moe_allgather_overlap_comm.cc): the
  // MoE all-gather dispatcher issues its all-gathers and reduce-scatters without waiting and
  // overlaps them with the shared expert (forward and backward), the local rows' layout, the
  // experts' backward and their fc1 weight gradients.
  bool moe_allgather_overlap = false;
  // MindSpeed's --moe-alltoall-mc2 (features/feature_moe_alltoall_mc2.cc): the MoE all-to-all
  // dispatcher's fused dispatch and combine (model/moe_mc2.h): rows written straight into the
  // exchange's buffers and received straight into the experts' layout; bit-identical results.
  bool moe_alltoall_mc2 = false;
  // Megatron's --mla-down-proj-fusion (features/feature_mla_down_proj_fusion.cc): MLA's input norm
  // and q/kv down projections run as one norm pass + one GEMM (model/mla_down_proj.h); false (the
  // reference, and below --optimization-level 2): the norm, then the two linears.
  bool mla_down_proj_fusion = false;
  // MindSpeed's --enable-expert-placement (features/feature_enable_expert_placement.cc, applied by
  // train/expert_placer.h after the optimizer steps): 0 off, else --expert-placement-freq; with
  // --enable-fine-grained-expert-placement the least drop of the per-rank loads' coefficient of
  // variation (--fine-grained-expert-placement-thre) a layer needs to migrate, else negative;
  // --print-expert-load.
  int64_t expert_placement_freq = 0;
  double expert_placement_fine_grained_thre = -1.0;
  bool print_expert_load = false;
  // MindSpeed's --moe-fb-overlap (features/feature_moe_fb_overlap.cc): DualPipeV runs the forward
  // and the backward of each overlapped pair interleaved at the MoE all-to-alls (core/interleave.h).
  bool moe_fb_overlap = false;
  // MindSpeed's --balanced-moe-experts (features/feature_balanced_moe_experts.cc): the number of hot
  // experts (--balanced-moe-hot-expert-num) replicated on every EP rank per MoE layer and
  // micro-batch by the all-to-all dispatcher (model/moe_hot_experts.h); 0: off.
  int64_t moe_hot_experts = 0;
  // --trans-hot-expert-group-num: duplicates of the EP group the replicas' transfers run on.
  int64_t moe_hot_expert_groups = 1;

  // Which implementation fills each entry ("reference", "fused-avx512", ...), for start-up reports.
  std::map<std::string, std::string> impl;
};

// The level-0 table: every entry is the reference kernel.
OpTable reference_ops();

}  // namespace gale
