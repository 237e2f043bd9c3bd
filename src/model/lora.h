// LoRA adapters on the transformer's linear layers (MindSpeed-LLM's --lora-r / --lora-alpha /
// --lora-target-modules, peft's LoraLayer): explicit forward/backward of the low-rank branch.
//
// A targeted linear W [out, in] (frozen) gains lora_A [r, in] and lora_B [out, r] (trained):
//   y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ,  s = alpha / r.
// With u = x·Aᵀ [M, r] (the saved state) and dy [M, out]:
//   dB += s·dyᵀ·u,  du = s·dy·B,  dA += duᵀ·x,  dx += du·A.
// A starts kaiming-uniform with a = sqrt(5) (U(±1/sqrt(in)), peft's default), B at zero, so the
// adapted model starts equal to the base. Names follow peft: "<linear>.lora_A.default.weight".
// Tensor parallelism (as peft on Megatron's parallel linears): for a column-parallel linear (W
// split on out) A is replicated and B split on out like W; for a row-parallel one (W split on in) A
// is split on in like W and B replicated. No extra communication: the replicated factor's local
// gradient is a partial sum over the TP ranks (column: du = Σ dy_local·B_local; row: u = Σ
// x_local·A_localᵀ), so it is marked like the sequence-parallel norms and all-reduced over TP with
// them; the layer's own input-gradient reduction (column) and output reduction (row) already sum
// the adapters' partial dx and y.
#pragma once

#include <string>

#include "core/tensor.h"
#include "kernels/cpu/gemm.h"
#include "model/config.h"
#include "model/params.h"

namespace gale {

// The four linears MindSpeed-LLM's --lora-target-modules names, and a Gated DeltaNet mixer's in_proj
// and out_proj (Megatron-Core's module names).
enum class LoraTarget { kQkv, kProj, kFc1, kFc2, kInProj, kOutProj };
bool lora_targets(const LoraConfig& c, LoraTarget t);

// Ids of one linear's adapter in the ParamBuffer (-1: not adapted).
struct LoraIds {
  int a = -1, b = -1;
  bool defined() const { return a >= 0; }
};

// How the adapted linear is split across tensor-parallel ranks.
enum class LoraSplit { kColumn, kRow };

// Registers lora_A [r, in] and lora_B [out, r] (global shapes) for the linear whose weight is named
// `weight_name` (".weight" replaced by ".lora_A.default.weight" / ".lora_B.default.weight"), split
// over `part`'s TP ranks as above (`blocks`: the equal blocks of a column-parallel out dimension,
// 2 for SwiGLU's [gate; up]).
LoraIds register_lora_params(ParamBuffer& pb, const LoraConfig& c, const ModelPartition& part,
                             const std::string& weight_name, int64_t out, int64_t in, LoraSplit split, int blocks = 1);
// Its parameter names.
std::string lora_a_name(const std::string& weight_name);
std::string lora_b_name(const std::string& weight_name);

// One adapter's f32 views (this TP rank's shards): A [r, in], B [out, r], their gradients, the scaling s.
struct LoraWeights {
  const float* a = nullptr;
  const float* b = nullptr;
  float* grad_a = nullptr;
  float* grad_b = nullptr;
  int64_t r = 0, out = 0, in = 0;
  float scaling = 1.0f;
  SgemmFn gemm = sgemm;
};
LoraWeights lora_weights(const ParamBuffer& pb, const LoraIds& ids, float scaling, SgemmFn gemm);

// y[M, out] += s·(x·Aᵀ)·Bᵀ; returns u = x·Aᵀ [M, r] (f32) for backward. x is f32 or bf16
// (then widened: the low-rank branch runs in f32).
Tensor lora_forward(const Tensor& x, const LoraWeights& l, Tensor& y);
// Backward: accumulates dA, dB and dx[M, in] += s·(dy·B)·A.
void lora_backward(const Tensor& dy, const Tensor& x, const Tensor& u, const LoraWeights& l, Tensor& dx);

// W [out, in] += s·B·A (the adapter merged into the base weight, as MindSpeed-LLM's convert does).
void lora_merge(float* w, const LoraWeights& l);

}  // namespace gale
