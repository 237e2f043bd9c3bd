// Parameters and their gradients in two flat f32 buffers, with a named view per parameter.
//
// Every parameter of a model chunk lives in one contiguous buffer (and its gradient at the same
// offset in a second one), so the optimizer, gradient clipping, data-parallel reduction and
// checkpointing work on flat memory. A ParamSpec records what the optimizer and the parallel
// code need to know about each tensor: its Megatron name, its local and global shapes and how the
// local shard maps into the global tensor (tensor-parallel split), its initialisation, and
// whether it gets weight decay.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace gale {

// kUniform: U(-init_std, init_std) (LoRA's A: kaiming-uniform with a = sqrt(5), bound 1/sqrt(fan_in);
// --init-method-xavier-uniform: bound xavier_uniform_bound of the global shape).
enum class InitKind { kNormal, kZeros, kOnes, kUniform };

struct ParamSpec {
  std::string name;         // Megatron-Core name, e.g. "decoder.layers.0.mlp.linear_fc1.weight"
  Shape global_shape;       // the full, unsharded tensor
  int split_dim = -1;       // -1: replicated over TP; else the dimension split across TP ranks
  int split_blocks = 1;     // the split dimension holds this many equal blocks, each split (SwiGLU fc1: 2)
  int64_t split_parts = 1;  // TP size
  int64_t split_rank = 0;   // TP rank
  InitKind init = InitKind::kNormal;
  float init_std = 0.02f;
  bool weight_decay = true;         // false for biases and 1-D tensors (Megatron's rule)
  // gradient is partial per TP rank and all-reduced over TP: under SP the norms and row-parallel
  // biases; with TP the replicated factor of a LoRA adapter (model/lora.h)
  bool sequence_parallel = false;
  // false: frozen (the base model under LoRA, model/lora.h): no gradient storage, no optimizer
  // state; its gradient pointer is null (a 1-D one's: a shared scratch that nothing reads).
  bool trainable = true;
  // A buffer, not a parameter (Megatron's register_buffer: the MoE router's expert_bias): not
  // trainable (no gradient, no optimizer state) and updated by its own rule, but, unlike a frozen
  // parameter, saved in checkpoints.
  bool buffer = false;
  // An expert of a MoE layer under expert parallelism (Megatron's `allreduce = False`): its
  // gradient is reduced over the expert-data-parallel group, not the data-parallel one, and it
  // counts in the gradient norm over the expert model-parallel group. ParamBuffer places these
  // after every other parameter (Megatron's separate expert buffers).
  bool expert_parallel = false;
  // The name in a whole-model layout (expert parallelism renames local_experts.{j} of EP rank r
  // to local_experts.{r·E/EP + j} here); empty: the same as `name`. Initial values and checkpoint
  // tensors use it, so both are layout-independent.
  std::string global_name;
  int64_t offset = 0;               // in the flat buffers, set by ParamBuffer

  const std::string& whole_model_name() const { return global_name.empty() ? name : global_name; }

  Shape local_shape() const;
  int64_t local_numel() const;
  // Row-major index in the global tensor of local element `i`.
  int64_t global_index(int64_t local_index) const;
};

// Xavier (Glorot) uniform bound of a [fan_out, fan_in] weight: √(6/(fan_in + fan_out)), gain 1
// (torch.nn.init.xavier_uniform_).
float xavier_uniform_bound(int64_t fan_out, int64_t fan_in);

class ParamBuffer {
 public:
  // Register a parameter; returns its id. Only before finalize().
  int add(ParamSpec spec);
  // Allocate the flat parameter and gradient buffers (gradients zeroed). Layout: the trainable
  // parameters first — the dense ones, then the expert_parallel ones (Megatron's separate expert
  // buffers) — each in registration order, then the frozen ones; the gradient buffer holds only
  // the trainable ones.
  void finalize();
  // Mark parameter `id` frozen (trainable = false). Only before finalize().
  void freeze(int id);
  // Rename parameter `id`: the prefix `from` of its name (and of its global name, when set) becomes
  // `to` (the MTP layers' transformer layers, model/gpt_model.h). Only before finalize().
  void rename_prefix(int id, const std::string& from, const std::string& to);
  // Change parameter `id`'s initialisation. Only before finalize().
  void set_init(int id, InitKind init, float init_std);
  bool finalized() const { return params_.defined(); }

  int size() const { return static_cast<int>(specs_.size()); }
  int64_t numel() const { return numel_; }
  // Elements before the first expert_parallel parameter (numel() when there is none).
  int64_t dense_numel() const { return dense_numel_; }
  // Elements of the trainable parameters: [0, trainable_numel()) of the flat buffer, the extent of
  // the gradient buffer and of the optimizer's state (= numel() without frozen parameters).
  int64_t trainable_numel() const { return trainable_numel_; }
  bool has_frozen() const { return trainable_numel_ < numel_; }
  const ParamSpec& spec(int id) const { return specs_.at(static_cast<size_t>(id)); }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int find(const std::string& name) const;  // -1 when absent

  // Named views (shape = local shape).
  Tensor param(int id) const;
  Tensor grad(int id) const;
  float* param_data(int id) const { return params_.data<float>() + spec(id).offset; }
  // A frozen parameter has no gradient: null, so that the model skips its gradient work (the dW
  // GEMMs, the embedding and output-layer gradients). A frozen 1-D parameter's (norm weights,
  // biases, whose gradients fused kernels compute alongside dx) is a scratch shared by all of them
  // that nothing reads.
  float* grad_data(int id) const {
    const ParamSpec& s = spec(id);
    if (s.trainable) return grads_.data<float>() + s.offset;
    return s.global_shape.size() == 1 ? frozen_grad_sink_.data<float>() : nullptr;
  }
  // The flat buffers: parameters [numel], gradients [trainable_numel].
  const Tensor& flat_params() const { return params_; }
  const Tensor& flat_grads() const { return grads_; }
  void zero_grads() {
    grads_.zero();
    if (frozen_grad_sink_.defined()) frozen_grad_sink_.zero();
  }

  // --bf16 / --fp16: a bf16 or f16 copy of every parameter for the model's GEMMs (the GEMM copy);
  // the f32 buffer stays the optimizer's master copy (and gradients stay f32). Call
  // refresh_gemm_copy() after any change of the f32 values (initialisation, checkpoint load,
  // optimizer step, parameter all-gather).
  void enable_gemm_copy(DType dtype);  // kBF16 or kF16
  bool has_gemm_copy() const { return params_gemm_.defined(); }
  // The copy's type: kBF16, kF16, or kF32 when there is none.
  DType gemm_copy_dtype() const { return has_gemm_copy() ? params_gemm_.dtype() : DType::kF32; }
  const bf16* param_bf16_data(int id) const { return params_gemm_.data<bf16>() + spec(id).offset; }
  const f16* param_f16_data(int id) const { return params_gemm_.data<f16>() + spec(id).offset; }
  void refresh_gemm_copy();                                // the whole buffer
  void refresh_gemm_copy(int64_t offset, int64_t count);  // elements [offset, offset + count)

  // Megatron's initialisation (docs/model.md), drawn from the counter-based RNG so that every
  // element's value depends only on (seed, parameter name, global index).
  void initialize(uint64_t seed);

 private:
  std::vector<ParamSpec> specs_;
  int64_t numel_ = 0, dense_numel_ = 0, trainable_numel_ = 0;
  Tensor params_, grads_, params_gemm_;
  Tensor frozen_grad_sink_;  // [largest frozen 1-D parameter], only with frozen 1-D parameters
};

// Stream id of a parameter's initial values: a hash of its name.
uint64_t param_init_stream(const std::string& name);

}  // namespace gale
