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
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/mx_quant.h"

namespace gale {

struct Fp8Config;  // model/fp8.h

// kUniform: U(-init_std, init_std) (LoRA's A: kaiming-uniform with a = sqrt(5), bound 1/sqrt(fan_in);
// --init-method-xavier-uniform: bound xavier_uniform_bound of the global shape).
// kMambaALog: log U(1, 16) (the Mamba mixer's A_log); kMambaDtBias: softplus⁻¹(Δ0) with
// Δ0 = max(exp(U(log 0.001, log 0.1)), 1e-4) (its dt_bias; model/mamba_mixer.h).
// kConstant: every element init_std (mHC's alphas, model/hyper_connection.h).
enum class InitKind { kNormal, kZeros, kOnes, kUniform, kMambaALog, kMambaDtBias, kConstant };

// ZeRO-3 storage (ParamBuffer::shard_storage, optim/zero3_sync.h): a unit of whole parameters,
// contiguous in the flat layout, and this rank's shard of it.
struct ParamUnit {
  int64_t begin = 0, end = 0;          // flat elements of the unit
  int64_t own_begin = 0, own_end = 0;  // this rank's shard, inside [begin, end) (possibly empty)
  int64_t shard_offset = 0;            // where the shard starts in the compact buffers
  int64_t padded = 0;                  // end − begin rounded up to a multiple of the DP size
};

struct ParamSpec {
  std::string name;         // Megatron-Core name, e.g. "decoder.layers.0.mlp.linear_fc1.weight"
  Shape global_shape;       // the full, unsharded tensor
  int split_dim = -1;       // -1: replicated over TP; else the dimension split across TP ranks
  int split_blocks = 1;     // the split dimension holds this many equal blocks, each split (SwiGLU fc1: 2)
  int64_t split_parts = 1;  // TP size
  int64_t split_rank = 0;   // TP rank
  // Each block is made of whole units of this many rows along split_dim (linear_qkv: one query
  // group's rows, linear_proj: one group's heads·HD columns), dealt out to the TP ranks by
  // parallel/tp_share.h: evenly when they divide, else (--unaligned-linear) one more unit to each
  // of the first ranks. A unit never straddles two ranks.
  int64_t split_unit = 1;
  // Non-empty: the split_blocks blocks along split_dim have these global extents instead of equal
  // ones (the Mamba mixer's in_proj z|x|B|C|dt and conv1d x|B|C, model/mamba_mixer.h); each is
  // dealt out in units of split_unit as an equal block is.
  std::vector<int64_t> split_block_extents;
  // --tp-2d (model/tp2d_layer.h): a 2-D weight whose dimension 0 is split as above over one axis
  // of the X×Y tensor-parallel grid has its dimension 1 split too, evenly, over the other axis:
  // this rank holds columns [split2_rank·C, (split2_rank + 1)·C), C = global columns / split2_parts.
  int64_t split2_parts = 1;
  int64_t split2_rank = 0;
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
  // A linear layer's weight that the model reads only through the GEMM copy (the transformer
  // layers' linear_qkv, linear_proj, linear_fc1 and linear_fc2 weights): under --reuse-fp32-param
  // its f32 master is stored as the bf16 GEMM copy plus a 16-bit residual (ParamBuffer).
  bool gemm_weight = false;
  // --qat-scheme (model/qat.h): the linear GEMMs read this weight MX fake-quantised to this element
  // format in blocks of qat_block along its rows (kNone: as stored). The stored values are untouched.
  MxElement qat_element = MxElement::kNone;
  int64_t qat_block = 0;
  // --fp8-format (model/fp8.h): the linear GEMMs reading this weight run on FP8-quantised operands;
  // fp8_state: the delayed recipe's amax-history buffer (the scale buffer is fp8_state + 1), else −1.
  bool fp8 = false;
  int fp8_state = -1;
  // One of those state buffers (a checkpoint without it leaves the initial state: ckpt/model_checkpoint.h).
  bool fp8_state_buffer = false;
  int64_t offset = 0;               // in the flat buffers, set by ParamBuffer

  const std::string& whole_model_name() const { return global_name.empty() ? name : global_name; }

  Shape local_shape() const;
  int64_t local_numel() const;
  // Along split_dim, the rows of each block this rank holds and where they start in the global
  // block (the whole block and 0 when not split). Equal blocks only (split_block for any).
  int64_t split_block_rows() const;
  int64_t split_block_offset() const;
  // Block b along split_dim: where it starts in the global and in the local tensor, the rows this
  // rank holds of it and where they start within the global block.
  struct SplitBlock {
    int64_t global_start = 0, local_start = 0, rows = 0, offset = 0;
  };
  SplitBlock split_block(int64_t b) const;
  // First global column of this rank's columns (0 without a --tp-2d column split).
  int64_t split2_offset() const;
  // Whether the tensor is split at all (over TP, or over a --tp-2d axis).
  bool is_split() const { return (split_dim >= 0 && split_parts > 1) || split2_parts > 1; }
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
  // Mark parameter `id` for --qat-scheme (ParamSpec::qat_element; model/qat.h). Any time.
  void set_qat(int id, MxElement element, int64_t block);
  // Mark parameter `id` for --fp8-format (ParamSpec::fp8, fp8_state; model/fp8.h add_fp8_params).
  void set_fp8(int id, int state_id);
  // The FP8 configuration the marked weights' GEMMs follow (null: none), kept here for linear_weight.
  void set_fp8_config(std::shared_ptr<const Fp8Config> c) { fp8_config_ = std::move(c); }
  const Fp8Config* fp8_config() const { return fp8_config_.get(); }
  bool finalized() const { return params_.defined() || sharded_; }
  // --param-and-grad-buffer-pad (optim/grad_buckets.h pad_grad_buckets): after finalize(), insert
  // `count` zero elements at flat offset `at` of the current layout for every (at, count) in `gaps`
  // (`at` a parameter boundary, at most trainable_numel(); several gaps at one offset add up).
  // Every parameter at or after `at` moves up by `count`: the flat buffers, numel(),
  // dense_numel() and trainable_numel() grow, values and gradients move with their parameters, the
  // GEMM copy is refreshed. The padding elements belong to no parameter: they stay zero (no
  // optimizer segment, norm or checkpoint reaches them). Not with --reuse-fp32-param's split
  // storage or shard_storage.
  void insert_padding(const std::vector<std::pair<int64_t, int64_t>>& gaps);
  // Elements of padding inserted so far (included in numel()), and their ranges in flat order.
  int64_t padding_numel() const;
  const std::vector<std::pair<int64_t, int64_t>>& padding() const { return padding_; }

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
  // Renames parameter `id`'s whole-model tensor (ParamSpec::global_name): --enable-expert-placement
  // moves an expert slot to another global expert, whose name its checkpoint tensors then take.
  void set_global_name(int id, std::string name) { specs_.at(static_cast<size_t>(id)).global_name = std::move(name); }
  int find(const std::string& name) const;  // -1 when absent

  // Named views (shape = local shape). Not for a parameter stored split (--reuse-fp32-param,
  // below): it has no f32 view; read it with param_values() / read_values().
  Tensor param(int id) const;
  Tensor grad(int id) const;
  float* param_data(int id) const {
    GALE_CHECK(!is_split(id)) << spec(id).name
                              << " is stored as bf16 + residual (--reuse-fp32-param): it has no f32 view";
    if (values_sharded_) return unit_param_data(id);
    return params_.data<float>() + spec(id).offset;
  }
  // A frozen parameter has no gradient: null, so that the model skips its gradient work (the dW
  // GEMMs, the embedding and output-layer gradients). A frozen 1-D parameter's (norm weights,
  // biases, whose gradients fused kernels compute alongside dx) is a scratch shared by all of them
  // that nothing reads.
  float* grad_data(int id) const {
    const ParamSpec& s = spec(id);
    if (s.trainable) {
      if (!grad_alias_.empty()) return grad_storage_.data<float>() + grad_alias_[static_cast<size_t>(id)];
      return sharded_ ? unit_grad_data(id) : grads_.data<float>() + s.offset;
    }
    return s.global_shape.size() == 1 ? frozen_grad_sink_.data<float>() : nullptr;
  }
  // The flat buffers: parameters [numel], gradients [trainable_numel]. The gradients are undefined
  // under shard_storage (use master_data / master_grad) and under alias_grads.
  const Tensor& flat_params() const { return params_; }
  const Tensor& flat_grads() const { return grads_; }
  void zero_grads();
  // The f32 master value / gradient of flat element `offset`: in the flat buffers, or under
  // shard_storage in the compact shards (`offset` must lie in this rank's shard of its unit).
  float* master_data(int64_t offset) const;
  float* master_grad(int64_t offset) const;

  // --quant-grads (optim/quant_grads.h): the flat f32 gradient buffer is freed and each trainable
  // parameter's gradient lives at `storage` + offsets[id] instead (offsets: one per parameter, the
  // frozen ones ignored); several parameters may share storage (the store drains one before another
  // is written). After finalize, not with shard_storage; flat_grads() is then undefined and
  // master_grad fails (the store serves the optimizer). `storage` is f32 and kept alive here.
  void alias_grads(std::vector<int64_t> offsets, Tensor storage);
  bool grads_aliased() const { return !grad_alias_.empty(); }
  // Bytes of the f32 gradient storage: the flat buffer, the aliased storage, or the ZeRO shards.
  int64_t grad_storage_bytes() const;

  // ZeRO-3 (optim/zero3_sync.h). shard_storage (after finalize and initialize; all parameters
  // trainable; no GEMM copy, or a bf16 one with `values`: gathers_bf16 below) keeps of every unit
  // only this rank's shard of its values (taken from the flat buffer, which is then freed) and a
  // zeroed shard of its gradients, in two compact
  // buffers; `units` tile [0, numel()) in flat order and each holds whole parameters. A unit's
  // whole values and gradients exist only between set_unit_storage and release_unit: param_data /
  // grad_data of a parameter of a released unit fail a GALE_CHECK naming it. With `values` false
  // (ZeRO-2) only the gradients are sharded so: the values stay in the whole flat buffer.
  void shard_storage(std::vector<ParamUnit> units, bool values = true);
  bool sharded() const { return sharded_; }
  bool values_sharded() const { return values_sharded_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const ParamUnit& unit(int u) const { return units_.at(static_cast<size_t>(u)); }
  int unit_of(int id) const { return unit_of_param_.at(static_cast<size_t>(id)); }
  // Whether unit u's whole gradients (and, values sharded, its whole values) exist now.
  bool unit_gathered(int u) const { return unit_grads_.at(static_cast<size_t>(u)).defined(); }
  // `values` (undefined when the values are not sharded) and `grads`: f32, at least the unit's
  // elements each (element 0 = the unit's begin).
  void set_unit_storage(int u, Tensor values, Tensor grads);
  void release_unit(int u);
  const Tensor& unit_values(int u) const { return unit_values_.at(static_cast<size_t>(u)); }
  const Tensor& unit_grads(int u) const { return unit_grads_.at(static_cast<size_t>(u)); }
  // This rank's shard of unit u in the compact buffers (own_end − own_begin elements; values only
  // when values_sharded()).
  float* shard_values(int u) const { return shard_values_.data<float>() + unit(u).shard_offset; }
  float* shard_grads(int u) const { return shard_grads_.data<float>() + unit(u).shard_offset; }
  // Bytes of the compact shards (values + gradients) and of the gathered units now.
  int64_t shard_bytes() const;
  int64_t gathered_bytes() const;

  // FSDP2's param_dtype bf16 (--use-torch-fsdp2 with --bf16, optim/zero3_sync.h): shard_storage of a
  // buffer with a bf16 GEMM copy frees the whole copy and gathers_bf16() turns on. A unit is then
  // gathered in one of two forms. For the model (set_unit_storage_bf16): every
  // ParamSpec::gemm_weight parameter as bf16 only — the values Gale's --bf16 GEMMs read
  // (param_bf16_data), 2 bytes each; its param_data fails a GALE_CHECK and f32_readable is false —
  // and every other parameter (norms, biases, embedding, output layer: what --bf16 reads in f32)
  // as f32; each kind packed in flat order, a parameter at compact_offset of its kind's storage.
  // For checkpoints (set_unit_storage): every parameter in f32 as without bf16, no bf16 copy.
  bool gathers_bf16() const { return sharded_bf16_; }
  bool f32_readable(int id) const;  // false: stored split, or a GEMM weight of a unit gathered in bf16
  int64_t compact_offset(int id) const { return compact_offset_.at(static_cast<size_t>(id)); }
  // `values`: f32, at least the unit's non-GEMM elements; `values_bf16`: bf16, at least its GEMM
  // elements; `grads`: f32 as set_unit_storage's.
  void set_unit_storage_bf16(int u, Tensor values, Tensor values_bf16, Tensor grads);
  const Tensor& unit_values_bf16(int u) const { return unit_values_bf16_.at(static_cast<size_t>(u)); }

  // --bf16 / --fp16: a bf16 or f16 copy of every parameter for the model's GEMMs (the GEMM copy);
  // the f32 buffer stays the optimizer's master copy (and gradients stay f32). Call
  // refresh_gemm_copy() after any change of the f32 values (initialisation, checkpoint load,
  // optimizer step, parameter all-gather).
  //
  // --reuse-fp32-param (`reuse_fp32`, bf16 only; MindSpeed's ReuseFP32Param): no separate GEMM
  // buffer. A trainable ParamSpec::gemm_weight parameter of n elements keeps, in the 4n bytes its
  // f32 master would take in the flat buffer, the bf16 copy b[0..n) (bytes [0, 2n), what the GEMMs
  // read, bit-identical to the copy refresh_gemm_copy() makes) followed by a 16-bit residual
  // r[0..n) (bytes [2n, 4n)): it is "stored split". Every other parameter (embeddings, norms,
  // biases, the output layer: the model reads them in f32) stays f32 and has no GEMM copy. Either
  // way a parameter takes 4 bytes instead of 6: 2 bytes per parameter less.
  // Bit layout of element i with f32 bits u = (t << 16) | low, t = u >> 16:
  //   b = round_to_nearest_even_bf16(f) (core/dtype.h: NaN → the quiet NaN (t | 0x40));
  //   r = low (u's low 16 bits);
  //   reconstruction: u = (b << 16 | r) − (rounded up ? 1 << 16 : 0), where b is NaN → not rounded
  //   up; r < 0x8000 → not; r > 0x8000 → rounded up; r = 0x8000 (an exact tie) → rounded up unless
  //   i is in the tie list.
  // RNE maps 65537 f32 patterns to an even finite b (t = b with low ≤ 0x8000, t = b − 1 with
  // low ≥ 0x8000) but 16 bits tell only 65536 apart: the one left over, an exact tie that rounded
  // down to even t (u's low 17 bits = 0x08000), is recorded in a sorted list of flat indices (8
  // bytes each; about one element in 131072 of trained weights, none for most initial values —
  // MindSpeed's deterministic mode keeps that bit in the sign of Adam's exp_avg_sq instead).
  // So every finite f — ±0, denormals, ties, values up to FLT_MAX that round to ±Inf in bf16 — is
  // reconstructed bit for bit; ±Inf too; a NaN stays a NaN of the same sign (quiet, as b).
  void enable_gemm_copy(DType dtype, bool reuse_fp32 = false);  // kBF16 or kF16
  bool has_gemm_copy() const { return params_gemm_.defined() || reuse_fp32_ || sharded_bf16_; }
  bool reuses_fp32() const { return reuse_fp32_; }
  // Whether parameter `id` is stored split (bf16 + residual).
  bool is_split(int id) const { return reuse_fp32_ && split_[static_cast<size_t>(id)]; }
  // The copy's type: kBF16, kF16, or kF32 when there is none.
  DType gemm_copy_dtype() const {
    return reuse_fp32_ || sharded_bf16_ ? DType::kBF16 : has_gemm_copy() ? params_gemm_.dtype() : DType::kF32;
  }
  // The GEMM copy of parameter `id`; with --reuse-fp32-param only a split parameter has one (null
  // for the others).
  const bf16* param_bf16_data(int id) const {
    if (sharded_bf16_) return unit_param_bf16_data(id);
    if (reuse_fp32_)
      return is_split(id) ? reinterpret_cast<const bf16*>(params_.data<float>() + spec(id).offset) : nullptr;
    return params_gemm_.data<bf16>() + spec(id).offset;
  }
  const f16* param_f16_data(int id) const { return params_gemm_.data<f16>() + spec(id).offset; }
  void refresh_gemm_copy();                                // the whole buffer (no-op with --reuse-fp32-param)
  void refresh_gemm_copy(int64_t offset, int64_t count);  // elements [offset, offset + count)

  // The f32 values of flat elements [offset, offset + count) (the master values: reconstructed
  // where stored split), into `out`. Any parameter, any storage.
  void read_values(int64_t offset, int64_t count, float* out) const;
  // Sets the f32 values of flat elements [offset, offset + count) from `in` (split again where
  // stored split) and refreshes their GEMM copy.
  void write_values(int64_t offset, int64_t count, const float* in);
  // Parameter `id`'s values (local shape): its f32 view, or a copy when stored split. Read only.
  Tensor param_values(int id) const;
  // Sets parameter `id`'s values from `in` (local_numel() floats), its GEMM copy included.
  void set_param_values(int id, const float* in) { write_values(spec(id).offset, spec(id).local_numel(), in); }
  // --reuse-fp32-param: entries of the tie list (see above).
  int64_t num_split_ties() const { return static_cast<int64_t>(ties_.size()); }
  // Bytes this buffer holds for parameter values: the f32 buffer, the GEMM copy and the tie list
  // (gradients not included).
  int64_t value_bytes() const;

  // Megatron's initialisation (docs/model.md), drawn from the counter-based RNG so that every
  // element's value depends only on (seed, parameter name, global index).
  void initialize(uint64_t seed);

 private:
  float* unit_param_data(int id) const;
  float* unit_grad_data(int id) const;
  const bf16* unit_param_bf16_data(int id) const;
  int unit_at(int64_t offset) const;  // the unit holding flat element `offset`
  // Split storage of parameter `id` (a piece [begin, begin + count) of its local elements).
  void merge_split(int id, int64_t begin, int64_t count, float* out) const;
  void store_split(int id, int64_t begin, int64_t count, const float* in);

  std::vector<ParamSpec> specs_;
  std::shared_ptr<const Fp8Config> fp8_config_;
  std::vector<std::pair<int64_t, int64_t>> padding_;  // (offset, count) of each padding run, current layout
  int64_t numel_ = 0, dense_numel_ = 0, trainable_numel_ = 0;
  bool reuse_fp32_ = false;
  std::vector<bool> split_;     // per parameter, with reuse_fp32_
  std::vector<int64_t> ties_;   // sorted flat indices of split elements that were exact ties rounded down
  Tensor params_, grads_, params_gemm_;
  std::vector<int64_t> grad_alias_;  // alias_grads: per parameter, its gradient's offset in grad_storage_
  Tensor grad_storage_;
  Tensor frozen_grad_sink_;  // [largest frozen 1-D parameter], only with frozen 1-D parameters
  // shard_storage: the units, each parameter's unit, the compact shards and the gathered units.
  bool sharded_ = false, values_sharded_ = false;
  std::vector<ParamUnit> units_;
  std::vector<int> unit_of_param_;
  Tensor shard_values_, shard_grads_;
  std::vector<Tensor> unit_values_, unit_grads_;
  // gathers_bf16: per parameter its offset in its kind's compact storage; per unit the bf16 values.
  bool sharded_bf16_ = false;
  std::vector<int64_t> compact_offset_;
  std::vector<Tensor> unit_values_bf16_;
};

// Stream id of a parameter's initial values: a hash of its name.
uint64_t param_init_stream(const std::string& name);

}  // namespace gale
