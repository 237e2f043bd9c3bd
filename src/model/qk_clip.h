// --qk-clip (MuonClip, Kimi K2; Megatron-Core's clip_qk) and --log-max-attention-logit: the step's max attention logits and the q/k rescale.
//
// Every core attention forward of a model built with ModelConfig::track_max_attention_logit merges
// its heads' largest pre-softmax logit (scale·q·k over the visible pairs, kernels/cpu/attention.h
// attention_max_logit_ref) into GPTModel's per-layer maxima [NHl]: training and evaluation forwards
// alike, as Transformer Engine's return_max_logit does in Megatron. After the optimizer step
// (Megatron's train_step, whether or not the step was applied) qk_clip_step:
//   1. takes the chunk's maxima of its decoder layers (not the MTP layers', which Megatron never
//      reads) and MAX-reduces them over the data-parallel × context-parallel group (each TP rank
//      keeps its own heads; pipeline stages their own layers);
//   2. returns max(0, the largest of them) — the value Megatron logs as max_attention_logit (its
//      last rank's: its own TP rank's heads and pipeline stage's layers);
//   3. with `clip`, rescales each layer where some head (standard attention: some query group, its
//      heads' maximum) is above the threshold τ, with η = min(τ / max_logit, 1) per head or group:
//        standard attention (linear_qkv rows [KVl, (NH/KV + 2)·HD, H], Megatron's packed order):
//          the group's query rows ·= η^α, its key rows ·= η^(1−α), value rows and biases unchanged;
//        MLA: linear_q_proj / linear_q_up_proj rows of head h [Dn + R]: the Dn "nope" rows ·= η_h^α,
//          the R rotary rows ·= η_h (the rotary key k_pe is shared by all heads, so the query side
//          takes the whole factor); linear_kv_up_proj rows of head h [Dn + Dv]: the Dn key rows
//          ·= η_h^(1−α), the value rows unchanged.
//      η and its powers are computed in f32 as Megatron does on its f32 main parameters. The f32
//      master values are rescaled; the caller refreshes the bf16/f16 GEMM copy afterwards (Megatron
//      rescales its bf16 copy in bf16: the copy can differ from Gale's by one rounding).
//   The maxima are reset either way.
#pragma once

#include <map>
#include <vector>

#include "comm/communicator.h"
#include "model/gpt_model.h"

namespace gale {

struct QkClipOptions {
  bool clip = false;         // --qk-clip (else only the statistic: --log-max-attention-logit)
  double alpha = 0.5;        // --qk-clip-alpha: the query side's share of the rescale
  double threshold = 100.0;  // --qk-clip-threshold τ
};

// Steps 1-3 above for one model chunk; `dp_cp` the data-parallel × context-parallel group (null or
// size 1: nothing to reduce). Every rank of the group calls it with the same layers.
double qk_clip_step(GPTModel& chunk, const QkClipOptions& o, Communicator* dp_cp);

// Step 3 on standard attention's linear_qkv weight `w` [KVl·(per_group + 2)·HD, cols] (Megatron's
// packed rows) given its heads' maxima [KVl·per_group]: each query group's maximum decides. Returns
// whether some group was above the threshold (else nothing changes).
bool qk_clip_qkv_rows(float* w, int64_t cols, int64_t KVl, int64_t per_group, int64_t HD,
                      const std::vector<float>& max_logits, const QkClipOptions& o);
// Step 3 on MLA's query weight `q` [NHl·(Dn + R), q_cols] (linear_q_proj or linear_q_up_proj) and
// linear_kv_up_proj's `kv` [NHl·(Dn + Dv), kv_cols] given the heads' maxima [NHl]. Returns whether
// some head was above the threshold (else nothing changes).
bool qk_clip_mla_rows(float* q, int64_t q_cols, float* kv, int64_t kv_cols, int64_t Dn, int64_t R, int64_t Dv,
                      const std::vector<float>& max_logits, const QkClipOptions& o);

// The rescale of step 3 on one layer's parameters, given the reduced maxima of its NHl heads
// [NHl] (the model's ParamBuffer, the layer's ids and this rank's shares of its heads). Returns
// whether anything was rescaled (some head or group above the threshold).
bool qk_clip_layer(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part, const LayerParamIds& w,
                   const std::vector<float>& max_logits, const QkClipOptions& o);

}  // namespace gale
