// Hot-expert replication of the all-to-all MoE dispatcher (MindSpeed's --balanced-moe-experts).
//
// Per MoE layer and micro-batch (moe_forward): every EP rank's per-expert row counts are
// all-gathered, the N hottest experts are chosen from them (select_hot_experts, the same on every
// rank), their parameters are broadcast from their owners to every EP rank (MoeHotExperts), and
// each rank computes its own rows of a hot expert it does not own with that replica instead of
// sending them through the all-to-all. In backward the replicas' weight gradients are sent back to
// the owners and added to the owners' gradients (reduce_grads_to_owners) before the micro-batch's
// backward returns, so the optimizer and the gradient reductions over expert-DP see the usual
// gradients. With M = --trans-hot-expert-group-num the broadcasts and gradient transfers of a hot
// expert owned by EP rank o run on duplicate o mod M of the EP group (MindSpeed's hot-expert group
// list), so transfers from different owners progress on different communication threads.
// With LoRA on the experts (model/lora_expert.h) the replicas carry the adapters too: broadcast with
// the (frozen) expert, their gradients sent back and added to the owner's adapters; the frozen
// parts' gradients are neither computed nor sent back.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/linear.h"
#include "model/lora.h"
#include "model/params.h"

namespace gale {

struct MoeParamIds;

// The hot experts (sorted global ids) chosen from `counts` [ep·E]: counts[s·E + e] rows of EP
// rank s for global expert e (owned by EP rank e / (E/ep)). MindSpeed's greedy choice, `n` times:
// take the EP rank with the most rows to compute, and on it the expert with the most rows not yet
// chosen; that expert's rows leave its owner's load and each rank's own rows of it are added to that
// rank's load (they are computed there now). 0 <= n <= E.
std::vector<int64_t> select_hot_experts(const std::vector<int64_t>& counts, int64_t ep, int64_t num_experts, int64_t n);

// Rows each EP rank computes with the hot experts `hot` replicated: its local experts' rows (every
// rank's rows of a cold expert, the owner's own rows of a hot one) plus its own rows of the hot
// experts it does not own. counts as select_hot_experts; returns [ep].
std::vector<int64_t> expert_rows_per_rank(const std::vector<int64_t>& counts, int64_t ep, int64_t num_experts,
                                          const std::vector<int64_t>& hot);

// One layer's hot experts for one micro-batch: the replicas of the hot experts this rank does not
// own (their parameters, under --bf16 / --fp16 also the GEMM copies of the weights, and their
// gradients), and what the gradient transfer needs. Made by moe_forward, kept for backward.
class MoeHotExperts {
 public:
  // Chooses the hot experts from this rank's `counts` [E] (collective over `ep`: all-gather of the
  // counts) and broadcasts the remote ones' parameters from their owners (collective over `groups`,
  // M duplicates of `ep`; empty: `ep` itself). `w` are this rank's local experts.
  MoeHotExperts(const Comm& ep, const std::vector<Comm>& groups, const ParamBuffer& pb, const MoeParamIds& w,
                const std::vector<int64_t>& counts, int64_t n);

  const std::vector<int64_t>& hot() const { return hot_; }
  // Whether global expert e is hot and owned by another rank (this rank computes its rows itself).
  bool remote(int64_t e) const { return remote_slot_[static_cast<size_t>(e)] >= 0; }
  int64_t num_replicas() const { return static_cast<int64_t>(replicas_.size()); }
  int64_t replica_expert(int64_t slot) const { return replicas_[static_cast<size_t>(slot)].expert; }
  // Replica `slot`'s weights as linear layers (their gradients: the replica's), and its biases
  // (null when the model has none) and their gradients.
  LinearWeight fc1(int64_t slot, SgemmFn gemm, Bf16GemmFn bf16_gemm) const;
  LinearWeight fc2(int64_t slot, SgemmFn gemm, Bf16GemmFn bf16_gemm) const;
  const float* fc1_bias(int64_t slot) const;
  const float* fc2_bias(int64_t slot) const;
  float* fc1_bias_grad(int64_t slot);
  float* fc2_bias_grad(int64_t slot);
  // Replica `slot`'s LoRA adapters of fc1 / fc2 (a null when the experts have none).
  LoraWeights fc1_lora(int64_t slot, float scaling, SgemmFn gemm) const;
  LoraWeights fc2_lora(int64_t slot, float scaling, SgemmFn gemm) const;

  // Sends each replica's gradients to the expert's owner, which adds them to its own expert's
  // gradients (`pb`, `w`) in source-rank order; a rank without rows of the expert sends nothing
  // (its gradient is zero). Point-to-point over the groups; every EP rank calls it for the layer.
  void reduce_grads_to_owners(ParamBuffer& pb, const MoeParamIds& w);

 private:
  struct Part {
    int id_local = -1;  // the owner's parameter id (set on the owner only)
    int64_t offset = 0, numel = 0;
    int64_t rows = 0, cols = 0;  // a weight's [out, in]
    bool trainable = true;       // false: frozen (LoRA's base): no gradient computed or sent back
  };
  struct Replica {
    int64_t expert = -1, owner = -1;
    Tensor values, grads;  // packed f32 [fc1_w | fc1_b | fc2_w | fc2_b | fc1 A | fc1 B | fc2 A | fc2 B]
    Tensor gemm_copy;      // packed bf16 or f16 copy (undefined without one)
  };
  const Comm& group_of(int64_t owner) const;
  LinearWeight weight(int64_t slot, int part, SgemmFn gemm, Bf16GemmFn bf16_gemm) const;
  LoraWeights lora(int64_t slot, int a_part, float scaling, SgemmFn gemm) const;

  Comm ep_;
  std::vector<Comm> groups_;
  int64_t num_experts_ = 0, local_experts_ = 0;
  std::vector<int64_t> counts_;       // [ep·E] every rank's rows per expert
  std::vector<int64_t> hot_;
  std::vector<int64_t> remote_slot_;  // [E] replica slot of a remote hot expert, else -1
  std::vector<Part> layout_;          // the 8 parts (fc1_w, fc1_b, fc2_w, fc2_b, the adapters; numel 0: absent)
  int64_t packed_numel_ = 0;
  DType copy_dtype_ = DType::kF32;
  std::vector<Replica> replicas_;
};

}  // namespace gale
