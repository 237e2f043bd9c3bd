// The optimizer over the flat parameter/gradient buffers of this rank's model chunks: global-norm
// clipping, NaN/inf detection and the AdamW, SGD, Muon or Lion update with per-parameter weight decay.
//
// The optimizer updates the *owned* part of each buffer: all of it normally, or, with the
// distributed optimizer (ZeRO-1, Megatron's DistributedOptimizer), this data-parallel rank's shard
// of every gradient bucket (optim/grad_buckets.h). Its fp32 state (Adam moments, or SGD momentum)
// exists only for the owned elements, packed in owned-range order: that is the memory saving.
// Owned ranges may start and end inside a parameter; each piece of a parameter (a Segment) still
// gets that parameter's weight decay, and the global gradient norm counts every element exactly
// once across the job (sum of squares over the owned pieces of the parameters that count on this
// rank, summed over the shard group and the model-parallel group).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/timers.h"
#include "kernels/cpu/newton_schulz.h"
#include "kernels/cpu/quant_states.h"
#include "kernels/cpu/scaled_states.h"
#include "kernels/op_table.h"
#include "model/params.h"
#include "optim/grad_buckets.h"
#include "optim/state_swap.h"

namespace gale {

// --optimizer muon (Megatron-LM's TensorParallelMuon over NVIDIA's emerging_optimizers): the
// parameters OptimizedBuffer::muon marks get
//   p ← p − lr·wd·p                         (decoupled weight decay, before the momentum)
//   buf ← lerp(buf, g, 1 − momentum)        (an EMA: momentum·buf + (1 − momentum)·g)
//   u ← nesterov ? lerp(g, buf, momentum) : buf
//   p ← p − lr · NS(u) · scale(out, in) · extra_scale_factor
// where NS is the Newton-Schulz orthogonalisation (kernels/cpu/newton_schulz.h) of the whole
// [out, in] matrix, and scale the --muon-scale-mode factor of its shape. A fused QKV weight
// (OptimizedBuffer::qkv_split) is orthogonalised as three matrices, the query, key and value rows
// of every query group gathered. Every other parameter gets AdamW with the Adam settings (the
// "scalar optimizer"). Clipping and the gradient norm are those of the other optimizers.
// Tensor parallelism (tp_mode): "duplicated" all-gathers a split matrix over the tensor-parallel
// group, orthogonalises the whole matrix on every rank and keeps this rank's shard (the result
// does not depend on TP); "distributed" orthogonalises the whole matrix without gathering it, each
// rank iterating on its shard with the Gram matrices summed over the group
// (kernels/cpu/newton_schulz.h newton_schulz_sharded: the duplicated result up to rounding);
// "blockwise" orthogonalises each rank's shard on its own (it depends on TP). The experts' matrices
// (OptimizedBuffer::expert_tp) use the expert-tensor-parallel group instead; each expert's matrix
// is a parameter of its own, so each is orthogonalised apart (Megatron's TEGroupedMLP weights).
// With the distributed optimizer Muon runs layer-wise (OptimizedBuffer::layer_wise_owner).
struct MuonConfig {
  double momentum = 0.9;                   // --muon-momentum
  bool nesterov = false;                   // --muon-nesterov
  bool split_qkv = true;                   // --muon-no-split-qkv clears it
  std::string scale_mode = "spectral";     // --muon-scale-mode: spectral, unit_rms_norm, shape_scaling
  std::string fp32_matmul_prec = "medium"; // --muon-fp32-matmul-prec: medium (bf16 iteration) or high (f32)
  std::string coefficient_type = "quintic";// --muon-coefficient-type
  int64_t num_ns_steps = 5;                // --muon-num-ns-steps
  std::string tp_mode = "duplicated";      // --muon-tp-mode: duplicated, distributed or blockwise
  double extra_scale_factor = 1.0;         // --muon-extra-scale-factor
  // --muon-scalar-optimizer: what updates the parameters Muon does not (embedding, output layer,
  // norms, biases): "adam" (AdamW with the Adam settings) or "lion" (LionConfig's update with
  // --lion-beta1/--lion-beta2).
  std::string scalar_optimizer = "adam";
};

// --optimizer lion (Megatron-LM main over NVIDIA's emerging_optimizers Lion, decoupled weight decay):
// per element of a Lion parameter, with its (clipped) gradient g and its one state tensor m
// ("exp_avg", zero at first):
//   p ← p − lr·wd·p
//   c ← lerp(m, g, 1 − β1)          (β1·m + (1 − β1)·g)
//   m ← lerp(m, g, 1 − β2)
//   p ← p − lr·sign(c)              (sign(0) = 0)
// Megatron builds Lion as an emerging optimizer: with --optimizer lion it updates the parameters
// Muon would (OptimizedBuffer::muon: the 2-D weights other than the word embedding and output
// layer) with β = (--adam-beta1, --adam-beta2) (Megatron's default kwargs of an emerging optimizer),
// and AdamW updates the rest; --lion-beta1/--lion-beta2 are the betas of Lion as Muon's scalar
// optimizer (MuonConfig::scalar_optimizer). With the distributed optimizer Lion runs layer-wise,
// as Muon (OptimizedBuffer::layer_wise_owner).
struct LionConfig {
  double beta1 = 0.95;  // --lion-beta1 (Lion as Muon's scalar optimizer)
  double beta2 = 0.98;  // --lion-beta2
};

struct OptimizerConfig {
  std::string type = "adam";  // "adam" (AdamW), "sgd", "muon" or "lion"
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double sgd_momentum = 0.9;
  double clip_grad = 1.0;  // 0 disables clipping
  MuonConfig muon;
  LionConfig lion;
  // --swap-optimizer (optim/state_swap.h): the fp32 state lives in an anonymous file in `swap_dir`
  // ("" = $TMPDIR or /tmp) and comes back in `swap_times` chunks during the step. AdamW and SGD;
  // not Muon, not --reuse-fp32-param. The owner calls open_swap() before the first step.
  bool swap = false;
  int64_t swap_times = 16;
  std::string swap_dir;
  // --compress-optimizer (MindSpeed's CompressOptimizerFeature; optim/state_swap.h): the fp32 state
  // is held losslessly compressed in memory (core/plane_codec.h) in chunks of about `compress_chunk`
  // elements (the swap optimizer's chunk plan: edges on 64-element multiples inside a parameter), and
  // each chunk is decompressed into one staging buffer for its update and compressed again after it:
  // training is bit-identical. AdamW and SGD; not Muon, --swap-optimizer, --quant-states,
  // fused_ema_adamw or --reuse-fp32-param. Set up by the constructor.
  bool compress = false;
  int64_t compress_chunk = int64_t{1} << 16;
  // --quant-states (MindSpeed's low-precision optimizer; kernels/cpu/quant_states.h): "" keeps the
  // f32 moments; "fp8" stores exp_avg as E4M3 and exp_avg_sq as E5M2 codes with an f32 scale per
  // block of gcd(numel, 128) elements of each parameter (one per parameter when that is below 16);
  // "mxfp8" the same formats, k-scaled, with an E8M0 scale per 32 elements; "hif8" both moments as
  // HiFloat8 codes with fp8's blocks and MindSpeed's hif8 scale (targets 15 and 224, which cancel:
  // quant_states.h). AdamW only, not with
  // --swap-optimizer. Blocks are counted from the start of each parameter (its local TP shard);
  // with the distributed optimizer a block cut by a shard boundary is quantised as two blocks,
  // one on each rank (Optimizer::quant_layout).
  std::string quant_states;
  // --optimizer-selection fused_ema_adamw (MindSpeed's FusedEmaAdamW): AdamW also keeps an
  // exponential moving average of the f32 parameters as a third state tensor, "ema_params", updated
  // in the same pass after each applied step t (1, 2, ...; skipped steps do not count) with the
  // updated values p_t:
  //   d_t = min(ema_decay, (1 + t) / (10 + t))        (MindSpeed's use_num_updates warm-up)
  //   ema ← d_t·ema + (1 − d_t)·p_t,  with ema = p_0 (the values before step 1) at the first step.
  // Training itself is AdamW's, bit for bit. Adam only; not --swap-optimizer, --reuse-fp32-param.
  bool ema = false;
  double ema_decay = 0.9999;  // --ema-decay, in [0, 1]
  // Megatron's --use-precision-aware-optimizer (Transformer Engine's FusedAdam;
  // kernels/cpu/scaled_states.h): the dtype each Adam moment is stored in between steps
  // (--exp-avg-dtype, --exp-avg-sq-dtype): "fp32", "fp16" or "fp8" (E4M3); an fp16 or fp8 moment
  // keeps one f32 scale per segment (amax / 32752 or amax / 448, renewed at every step) and is
  // dequantised to f32 for the update. AdamW only; not with --quant-states, --swap-optimizer,
  // --compress-optimizer or the EMA.
  std::string exp_avg_dtype = "fp32";
  std::string exp_avg_sq_dtype = "fp32";
  // --freeze-all-layers (Megatron main): nothing trains, so the optimizer holds no state (Megatron's
  // optimizer gets no parameter group and is None): no moments or momentum are allocated, no swap
  // file or compressed store is opened, and step() is an invariant failure. The segments stay, so
  // params_norm() still covers every parameter (Megatron's calc_params_l2_norm reads the model).
  bool frozen = false;
  // --use-mup (train/mup.h, Megatron's get_mup_config_overrides): the µP group's max_lr and min_lr
  // are --lr and --min-lr times mup_lr_mult (the caller schedules its rate: step()'s mup_lr), and
  // Adam's eps of the parameters OptimizedBuffer::mup_eps marks is eps · mup_eps_mult.
  double mup_lr_mult = 1.0;
  double mup_eps_mult = 1.0;
};

// The EMA decay of applied step t (1-based) for --ema-decay `ema_decay` (OptimizerConfig::ema).
float ema_decay_at(double ema_decay, int64_t step);

struct StepResult {
  bool applied = false;    // false when the gradients were not finite (the update was skipped)
  double grad_norm = 0.0;  // global L2 norm before clipping
  int64_t num_zeros = -1;  // zero gradients (only when asked)
};

// The parameters one optimizer updates: a chunk's buffer and which of its parameters count
// towards the global gradient norm on this rank (false for tensor-parallel replicas on TP ranks
// other than 0 and for duplicated tied weights, so that every parameter counts exactly once).
class QuantGradStore;

struct OptimizedBuffer {
  ParamBuffer* params = nullptr;
  std::vector<bool> counts_in_norm;  // empty = all count
  // Distributed optimizer: the disjoint ranges of the flat buffer this rank updates (its shard of
  // every bucket; possibly none). nullopt: the whole buffer.
  std::optional<std::vector<FlatRange>> owned;
  // --decoupled-lr: the parameters updated with the decoupled rate (Megatron's
  // is_embedding_or_output_parameter: the word embedding and the output layer); empty = none.
  std::vector<bool> decoupled_lr;
  // --use-mup: the parameters updated with the µP group's rate (step()'s mup_lr), and those whose
  // Adam eps is scaled (OptimizerConfig::mup_eps_mult); empty = none.
  std::vector<bool> mup_lr;
  std::vector<bool> mup_eps;
  // Per parameter, whether the weight decay applies; empty = ParamSpec::weight_decay (Megatron's
  // rule: not on biases and 1-D parameters). --apply-wd-to-qk-layernorm sets it for the
  // q_layernorm / k_layernorm parameters too.
  std::vector<bool> weight_decay;
  // --optimizer muon (or lion): the parameters Muon (or Lion) updates (Megatron: every 2-D parameter
  // except the word embedding and the output layer); the others get the scalar optimizer (AdamW, or
  // with --muon-scalar-optimizer lion Lion). Empty = none.
  std::vector<bool> muon;
  // --muon-split-qkv: for a fused QKV weight, the rows of one query group's query, key and value
  // blocks ({NH/KV·HD, HD, HD}); empty for every other parameter (or all empty).
  std::vector<std::vector<int64_t>> qkv_split;
  // Parameters split over the expert-tensor-parallel group (ExpertNormGroups::tp_group), not the
  // tensor-parallel one: the MoE experts' weights. Empty = none.
  std::vector<bool> expert_tp;
  // --optimizer muon --use-distributed-optimizer (Megatron's LayerWiseDistributedOptimizer, its
  // ping-pong assignment; optim/layer_wise.h): per parameter, the rank of its shard group that
  // updates it whole (-1: none, e.g. frozen), the data-parallel group's (the optimizer's
  // `shard_group`) or, for expert-parallel parameters, the expert-data-parallel group's
  // (ExpertNormGroups::shard_group). `owned` then holds exactly this rank's parameters, whose state
  // only this rank keeps; the gradients are all-reduced as without the distributed optimizer, and
  // step() ends each buffer by all-gathering the updated parameters from their owners. Empty = not
  // layer-wise.
  std::vector<int> layer_wise_owner;
  // --quant-grads (optim/quant_grads.h): the chunk's main gradients are read from its store (FP16
  // codes dequantised a segment at a time), not from the params' f32 gradient buffer. Null: none.
  QuantGradStore* quant_grads = nullptr;
};

// Expert parallelism: the groups over which the expert-parallel parameters' (ParamSpec::
// expert_parallel) squared norms and zero counts are summed instead of the dense ones (Megatron's
// expert-parallel optimizer chained with the dense one: the global norm is the square root of
// both sums together). Both null without expert parallelism.
struct ExpertNormGroups {
  Comm norm_group;   // the expert tensor-model-pipeline group (tp-ep-pp of the expert generator)
  Comm shard_group;  // the expert-data-parallel group with the distributed optimizer; else null
  Comm tp_group;     // the expert-tensor-parallel group (Muon's split expert matrices); may be null
};

class Optimizer {
 public:
  // A piece of one parameter inside an owned range: flat elements [begin, begin + numel) of the
  // buffer, i.e. local elements [begin − spec.offset, ...) of parameter `param_id`, whose state
  // sits at [state_offset, state_offset + numel) of the state tensors.
  struct Segment {
    int param_id = 0;
    int64_t begin = 0;
    int64_t numel = 0;
    int64_t state_offset = 0;
  };

  // `norm_group` sums the per-rank squared norms (Megatron's model-parallel group; self with one
  // process). `shard_group` is the group whose ranks own disjoint parts of the buffers (the
  // data-parallel group with the distributed optimizer; null otherwise): norms and zero counts
  // are summed over it too.
  // `tp_group` (Muon's duplicated and distributed modes) is the group of the tensor-parallel shards
  // of split matrices; null or size 1: none is split. Muon takes sharded buffers only layer-wise
  // (OptimizedBuffer::layer_wise_owner).
  Optimizer(const OptimizerConfig& config, std::vector<OptimizedBuffer> buffers, const OpTable* ops, Comm norm_group,
            Comm shard_group = nullptr, ExpertNormGroups expert_groups = {}, Comm tp_group = nullptr);
  // One buffer, every parameter counting.
  Optimizer(const OptimizerConfig& config, ParamBuffer* params, const OpTable* ops, Comm norm_group);

  // Global gradient norm (before clipping), over all ranks of the norm (and shard) group.
  double grad_norm() const;
  // Global L2 norm of the parameters, counted the same way (--log-params-norm). With the
  // distributed optimizer it reads only the owned shards, so it is right before the parameter
  // all-gather too.
  double params_norm() const;
  // Unscale, clip, then update every owned parameter element with learning rate `lr` and weight
  // decay `wd` (0 for parameters without decay). `inv_grad_scale` (--fp16's 1 / loss scale,
  // optim/grad_scaler.h) multiplies every owned gradient element first, in place, as Megatron
  // unscales its main gradients; 1 leaves them untouched. Skips the update when the gradient norm
  // is not finite (the loss scaler's found_inf).
  // AdamW folds the clipping factor into its update (bit-identical; the gradient buffers keep the
  // unclipped values); SGD scales the owned gradients in place first.
  // `timers` (may be null) times Megatron's level-1 phases: optimizer-unscale-and-check-inf (when
  // `inv_grad_scale` is not 1), optimizer-clip-main-grad (the norm and, for SGD, the clipping),
  // optimizer-count-zeros and optimizer-inner-step.
  // `decoupled_lr` (--decoupled-lr) replaces `lr` for the parameters OptimizedBuffer::decoupled_lr
  // marks, `mup_lr` (--use-mup) for those OptimizedBuffer::mup_lr marks.
  StepResult step(double lr, double wd, bool count_zeros = false, float inv_grad_scale = 1.0f,
                  Timers* timers = nullptr, std::optional<double> decoupled_lr = std::nullopt,
                  std::optional<double> mup_lr = std::nullopt);

  // Called by step() with the buffer's index as soon as that buffer's owned parameters are updated
  // (--overlap-param-gather-with-optimizer-step starts the first chunk's all-gather there).
  void set_after_buffer_step(std::function<void(size_t)> fn) { after_buffer_step_ = std::move(fn); }

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  const OptimizerConfig& config() const { return config_; }
  size_t num_buffers() const { return buffers_.size(); }
  bool sharded(size_t b = 0) const { return buffers_.at(b).sharded; }
  const ParamBuffer& buffer_params(size_t b) const { return *buffers_.at(b).buffer.params; }
  // The owned pieces of buffer `b`'s parameters, in state order. Without sharding: one segment per
  // parameter, with state_offset equal to the parameter's offset less the elements of
  // --param-and-grad-buffer-pad's padding below it (ParamBuffer::insert_padding: no state for them).
  const std::vector<Segment>& segments(size_t b = 0) const { return buffers_.at(b).segments; }
  // State tensors of buffer `b`, indexed by Segment::state_offset: "exp_avg", "exp_avg_sq" for Adam
  // (and "ema_params", the parameters' EMA, with OptimizerConfig::ema),
  // "momentum_buffer" for SGD (with momentum). Without sharding (and without padding) they have the
  // parameters' offsets.
  // Muon: "exp_avg", "exp_avg_sq" and "momentum_buffer", where the momentum buffer of a Muon
  // parameter lives in the exp_avg storage (the same tensor), so the state takes Adam's memory;
  // holds_state() says which of them a parameter has. Lion: "exp_avg" and "exp_avg_sq", a Lion
  // parameter holding exp_avg only; with --muon-scalar-optimizer lion no parameter holds exp_avg_sq
  // and none is allocated ("exp_avg" and "momentum_buffer"). OptimizerConfig::frozen: none.
  std::vector<std::pair<std::string, Tensor>> state(size_t b = 0) const;
  // Whether parameter `param_id` of buffer `b` has state tensor `name` (Muon: momentum_buffer for
  // the Muon parameters, exp_avg and exp_avg_sq for the AdamW ones, exp_avg for Lion ones; Lion:
  // exp_avg for the Lion parameters, exp_avg and exp_avg_sq for the others; otherwise every
  // state() tensor).
  bool holds_state(size_t b, int param_id, const std::string& name) const;
  // Whether Muon (with --optimizer lion: Lion) updates parameter `param_id` of buffer `b`.
  bool is_muon(size_t b, int param_id) const;
  // Whether Lion updates parameter `param_id` of buffer `b` (--optimizer lion's matrices, or Muon's
  // scalar parameters with --muon-scalar-optimizer lion).
  bool is_lion(size_t b, int param_id) const;
  // Bytes of optimizer state held in memory by this rank (all buffers); with --swap-optimizer the
  // staging buffer only; with --compress-optimizer the staging buffer and the compressed chunks;
  // with --quant-states, or the precision-aware optimizer's fp16/fp8 moments, the codes and scales
  // (not the step's transient f32 copies of one segment).
  int64_t state_bytes() const;

  // --quant-states: whether the moments are stored quantised, and the block layout of segment `s`
  // of buffer `b` (its scales start at quant_scale_offset(b, s) bytes into the scale tensors).
  // Also true for the precision-aware optimizer's fp16/fp8 moments (OptimizerConfig::exp_avg_dtype).
  bool quantised() const { return quant_ || scaled_; }
  // How the moments are stored, as a checkpoint records it: the --quant-states mode, or for the
  // precision-aware optimizer "exp_avg:<dtype>,exp_avg_sq:<dtype>"; "" for f32 moments.
  std::string state_format() const;
  const QuantLayout& quant_layout(size_t b, size_t s) const { return buffers_.at(b).quant.at(s).layout; }
  int64_t quant_scale_offset(size_t b, size_t s) const { return buffers_.at(b).quant.at(s).scale_offset; }
  // The quantised storage of buffer `b` (shared, not copies): "exp_avg.codes", "exp_avg_sq.codes"
  // (u8, one per state element, in state order), "exp_avg.scales", "exp_avg_sq.scales" (u8 bytes:
  // f32 scales for fp8, E8M0 exponents for mxfp8, segment after segment). A checkpoint saves and
  // restores them as they are, so that a resumed run continues bit for bit. Empty without
  // --quant-states. (state() and store_state() then give and take dequantised f32 copies.)
  // The precision-aware optimizer: the same names for each fp16/fp8 moment, codes f16 or u8 (E4M3)
  // and scales f32, one per segment (an f32 moment is not listed: state() shares it).
  std::vector<std::pair<std::string, Tensor>> quantised_state(size_t b) const;

  // --swap-optimizer: creates the state file (zeros: the initial state) and the staging buffer.
  // Call once, before the first step or state access, when config().swap is set.
  Status open_swap();
  // The swapped (or --compress-optimizer's compressed) state, or null.
  const OptimizerStateSwap* swap() const { return swap_.get(); }
  // Makes the values of state() tensors of buffer `b` the optimizer's: with --swap-optimizer
  // state() returns copies read from the file, and a checkpoint load writes them back with this;
  // with --quant-states state() returns dequantised copies and this quantises them again;
  // otherwise state() shares the optimizer's storage and this does nothing.
  Status store_state(size_t b, const std::vector<std::pair<std::string, Tensor>>& tensors);
  void set_ops(const OpTable* ops) { ops_ = ops; }

 private:
  struct BufferState {
    OptimizedBuffer buffer;
    bool sharded = false;
    std::vector<Segment> segments;
    Tensor exp_avg, exp_avg_sq, momentum;  // undefined with --swap-optimizer (the state is in swap_)
    Tensor ema;                            // OptimizerConfig::ema: the parameters' EMA (else undefined)
    int64_t state_numel = 0;  // elements of each state tensor
    int64_t state_base = 0;   // where they start in the swap file's packed order (all buffers)
    // --quant-states: per segment, its blocks and where its scales start (bytes).
    struct QuantSegment {
      QuantLayout layout;
      int64_t scale_offset = 0;
    };
    std::vector<QuantSegment> quant;
    Tensor m_codes, v_codes, m_scales, v_scales;  // u8 (precision-aware: f16 or u8 codes, f32 scales)
  };
  // The precision-aware optimizer: segment `s` of `b`'s first (second) moment.
  ScaledStateRef scaled_ref(const BufferState& b, size_t s, bool second) const;
  // Segment `s` of `b`'s moments as quantised pieces.
  QuantStateRef quant_ref(const BufferState& b, size_t s, bool second) const;
  // --optimizer muon --muon-scalar-optimizer lion: no AdamW parameter, so no exp_avg_sq.
  bool muon_lion_only() const;
  // The state tensors' names, in the swap file's order.
  std::vector<std::string> state_names() const;
  // Element `index` of state `k` (state_names() order) of buffer `b`, resident or in the staging
  // chunk (which must hold it).
  float* state_at(BufferState& b, int k, int64_t index);
  // Calls fn(at, n) for the pieces [at, at + n) of segment `seg` that lie in one swap chunk each,
  // with that chunk resident (one piece, the whole segment, without --swap-optimizer).
  template <class Fn>
  void for_each_swap_piece(const BufferState& b, const Segment& seg, Fn&& fn);
  double norm_of(bool grads) const;
  // Segment `seg`'s f32 gradient: in the flat buffer (or ZeRO shard), or --quant-grads' store's
  // dequantised copy (valid until the next call).
  float* grad_of(const BufferState& b, const Segment& seg) const;
  // Sums the dense and the expert-parallel part each over its groups, then adds them.
  double sum_over_groups(double dense, double expert) const;
  // Muon's update of one whole parameter (see MuonConfig), its clipped gradient in `g`.
  void muon_step(BufferState& b, const Segment& seg, float* p, float* g, double lr, float wd);
  // The orthogonalised, scaled update of momentum `u` (local shape) of parameter `spec`, into `out`;
  // `expert_tp`: split over the expert-tensor-parallel group.
  void muon_update(const ParamSpec& spec, const std::vector<int64_t>& qkv_split, bool expert_tp, const float* u,
                   float* out) const;
  // Layer-wise buffers: every parameter updated on another rank, all-gathered from its owner.
  void gather_layer_wise(BufferState& b);

  OptimizerConfig config_;
  std::vector<BufferState> buffers_;
  const OpTable* ops_;
  Comm norm_group_, shard_group_;
  ExpertNormGroups expert_groups_;
  Comm tp_group_;
  NsCoefficients ns_coefficients_;
  int64_t step_ = 0;
  std::function<void(size_t)> after_buffer_step_;
  std::unique_ptr<OptimizerStateSwap> swap_;
  bool quant_ = false;
  QuantMode quant_mode_ = QuantMode::kLinear;
  // The precision-aware optimizer with an fp16 or fp8 moment; each moment's dtype.
  bool scaled_ = false;
  StateDType m_dtype_ = StateDType::kF32, v_dtype_ = StateDType::kF32;
};

}  // namespace gale
