// What a training process runs with: the parallel state, this rank's model chunks, the op table
// (features applied), the optimizer and the learning-rate scheduler — built the same way by
// `gale pretrain` and by the tests.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "model/gpt_model.h"
#include "optim/data_parallel_sync.h"
#include "schedule/pipeline_order.h"
#include "schedule/stage_tensors.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "core/timers.h"
#include "optim/optimizer.h"
#include "optim/quant_grads.h"
#include "optim/zero3_sync.h"
#include "parallel/adaptive_cp.h"
#include "parallel/distopt_instance_groups.h"
#include "parallel/tp2d_groups.h"
#include "parallel/parallel_state.h"
#include "train/arguments.h"

namespace gale {

class ExpertPlacer;  // train/expert_placer.h

struct Engine {
  ParallelState ps;
  OpTable ops;
  // --context-parallel-algo hybrid_cp_algo: the Ulysses and ring sub-groups of ps.cp() (null otherwise).
  HybridCpGroups cp_hybrid;
  // --context-parallel-algo adaptive_cp_algo (CP > 1): the layouts micro-batches are sliced with
  // (parallel/adaptive_cp.h; one per micro-batch with --adaptive-cp-dynamic-attn-mask); null otherwise.
  std::unique_ptr<AdaptiveCpPlanner> adaptive_cp;
  Tp2dGroups tp2d;  // --tp-2d: the X and Y axes of the TP group (parallel/tp2d_groups.h), shared by every chunk
  // --num-distributed-optimizer-instances N > 1: the intra- and inter-instance sub-groups of
  // ps.dp_cp() (parallel/distopt_instance_groups.h; null otherwise). The distributed optimizer
  // shards over `intra`; dp_sync all-reduces each shard's gradients over `inter`.
  DistOptInstanceGroups distopt_instances;
  std::vector<std::unique_ptr<GPTModel>> chunks;  // virtual pipeline stages of this rank, in order
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<LrScheduler> scheduler;
  // --enable-expert-placement (train/expert_placer.h): runs after every optimizer step; null when off.
  std::shared_ptr<ExpertPlacer> expert_placer;
  // --smart-swap (model/smart_swap.h): the swap policy's sampling and state, shared by the (one)
  // chunk; the trainer brackets every training iteration with it. Null when off.
  std::unique_ptr<SmartSwap> smart_swap;
  // --fp16: the loss scaler (constant with --loss-scale, else dynamic); null otherwise.
  std::unique_ptr<GradScaler> grad_scaler;
  // Data-parallel gradient reduction / parameter gathering of each chunk (same order as `chunks`;
  // train/grad_sync.h drives them). Empty in an engine assembled by hand, which then must not be
  // data-parallel.
  std::vector<std::unique_ptr<DataParallelSync>> dp_sync;
  // Expert parallelism (--expert-model-parallel-size > 1): each chunk's expert parameters (the end
  // of its buffer, ParamBuffer::dense_numel() onwards) reduced over the expert-data-parallel
  // group, scaled by 1/DP; dp_sync then covers only the dense part. Empty without EP.
  std::vector<std::unique_ptr<DataParallelSync>> expert_dp_sync;
  // --quant-grads (optim/quant_grads.h): each chunk's FP16 main gradients with per-parameter scales
  // (same order as `chunks`; train/grad_sync.cc drives them). Empty without the flag.
  std::vector<std::unique_ptr<QuantGradStore>> quant_grads;
  // ZeRO-2/3 (--use-custom-fsdp --data-parallel-sharding-strategy optim_grads / optim_grads_params,
  // --layerzero): each chunk's per-layer gathers and reduce-scatters (optim/zero3_sync.h); dp_sync
  // is then empty. Empty otherwise.
  std::vector<std::unique_ptr<Zero3Sync>> zero3;
  // --layerzero with zero3_size < DP (FSDP2: sharding_size < DP): `intra` the ZeRO-3 sub-groups of consecutive
  // ranks of ps.dp_cp(), `inter` the ranks holding the same shard in the others (null otherwise).
  DistOptInstanceGroups layerzero_groups;
  // FSDP2's HSDP (--use-torch-fsdp2 with sharding_size < DP): the group whose ranks update disjoint
  // shards (layerzero_groups.intra; the replicas across it update copies); null otherwise.
  Comm zero3_optimizer_group;
  // The run's Megatron timers (core/timers.h; owned by the pretrain driver), or null: untimed.
  Timers* timers = nullptr;
  // --schedules-method dualpipev: `chunks` are the V's two chunks (stages rank and 2·PP−1−rank), the
  // loss is on pipeline rank 0 and the tied embedding's two copies both live there.
  bool dualpipev = false;
  // --dualpipev-dw-detach: DualPipeV's deferred weight-gradient steps (schedule/schedules.h).
  bool dualpipev_dw_detach = false;
  // --recompute-in-advance / --recompute-in-bubble (MindSpeed's RiPipe; interleaved schedule).
  RiPipe ripipe = RiPipe::kNone;
  // --optimize-send-recv-comm (MindSpeed's OptimizeSendRecvCommFeature): a second communicator over
  // the ranks of ps.pp(), named "pp-backward", that carries the 1F1B schedule's gradients while the
  // activations stay on ps.pp() (schedule/pipeline_p2p.h); null otherwise.
  Comm pp_backward;
  // --use-multiparameter-pipeline-model-parallel (MindSpeed's MultiParameterFeature): the list of
  // typed tensors the pipeline stages exchange (schedule/stage_tensors.h); null otherwise.
  std::unique_ptr<StageTensors> stage_tensors;
  // The pipeline rank whose chunk computes the loss: the last, or 0 under DualPipeV.
  int loss_pipeline_rank() const { return dualpipev ? 0 : ps.pp_size() - 1; }

  std::vector<GPTModel*> chunk_pointers() const;
};

// Settings of build_engine that are not command-line flags.
struct EngineOptions {
  // Gradient bucket size in elements for every chunk, whatever the flags; 0 = Megatron's rule
  // (chunk_bucket_size with --ddp-bucket-size / --ddp-num-buckets). Tests set it to get several
  // buckets out of a tiny model.
  int64_t ddp_bucket_size = 0;
  // Activations every chunk's backward recomputes (installed by the memory features).
  RecomputePlan recompute;
  // The embedding and the transformer layers below this global index frozen (ModelConfig::frozen_layers;
  // --dist-train sets it from its forward-only sub-worlds, tests build their single-process reference with it).
  int64_t frozen_layers = 0;
};

// The transformer layers of every virtual stage, [pp rank][virtual chunk]: the explicit
// --num-layer-list / --pipeline-num-transformer-layers (ParallelArgs::pipeline_layers), or
// Megatron's split: even, or --decoder-first/last-pipeline-num-layers with the rest even, each
// stage's layers divided evenly among its virtual chunks; with
// --account-for-embedding-in-pipeline-split (--account-for-loss-in-pipeline-split) the embedding
// (the loss) counts as one layer of the first (last) virtual stage, which then builds one
// transformer layer fewer, possibly none.
std::vector<std::vector<int64_t>> pipeline_layer_counts(const Arguments& args);

// Whether the run uses DualPipeV (--schedules-method dualpipev).
bool uses_dualpipev(const Arguments& args);

// The virtual stage (position along the model) of chunk `vp` on pipeline rank `pp_rank`: v·PP + r
// (Megatron's interleaving), or under DualPipeV r for chunk 0 and 2·PP−1−r for chunk 1.
int64_t virtual_stage_of(const Arguments& args, int64_t pp_rank, int64_t vp);

// Global layers [first, first + count) of virtual chunk `vp` on pipeline rank `pp_rank`: the
// counts of pipeline_layer_counts laid out in virtual-stage order (virtual_stage_of: chunk v of
// every stage precedes chunk v + 1, within a chunk index rank r precedes rank r + 1, as Megatron
// and MindSpeed; under DualPipeV down the ranks through chunk 0, back up through chunk 1).
std::pair<int64_t, int64_t> chunk_layers(const Arguments& args, int64_t pp_rank, int64_t vp);

// Megatron's configured data-parallel bucket size (get_model): --ddp-bucket-size, or
// `num_parameters` (every element of every model chunk on this rank) / --ddp-num-buckets (at
// least 1); 0 when neither flag is given (DistributedDataParallel's default then applies).
// chunk_bucket_size decides where it applies: with --overlap-grad-reduce, on the first chunk of
// the first pipeline stage.
int64_t configured_ddp_bucket_size(const ParallelArgs& par, int64_t num_parameters);

// This rank's partition of virtual chunk `vp`; `hybrid` the sub-groups of hybrid_cp_algo (empty otherwise).
ModelPartition chunk_partition(const Arguments& args, const ParallelState& ps, int64_t vp,
                               const HybridCpGroups& hybrid = {}, const Tp2dGroups& tp2d = {});

// Whether parameter `id` of `model` counts towards the global gradient norm on this rank (every
// parameter exactly once across the model-parallel group).
std::vector<bool> norm_counting(const GPTModel& model);

// --optimizer muon (or lion): marks in `buffer` (OptimizedBuffer::muon, ::qkv_split) the parameters
// of `model` that Muon (or Lion) updates, as Megatron picks them: every trainable 2-D parameter except the word
// embedding and the output layer (the position embedding and the layers' linear weights); the
// fused QKV weights split into one query group's {NH/KV·HD, HD, HD} query, key and value rows.
void set_muon_params(const GPTModel& model, OptimizedBuffer* buffer);

// --use-mup (train/mup.h): marks in `buffer` (OptimizedBuffer::mup_lr, ::mup_eps) the parameters of
// `model` in Megatron's µP learning-rate and Adam-eps groups; call after set_muon_params and after
// OptimizedBuffer::decoupled_lr is set. Nothing without --use-mup or at width multiplier 1.
void set_mup_params(const GPTModel& model, const Arguments& args, OptimizedBuffer* buffer);

// --apply-wd-to-qk-layernorm: per parameter of `model`, whether the weight decay applies
// (OptimizedBuffer::weight_decay): Megatron's rule (not on biases and 1-D parameters) except that the
// parameters named `*q_layernorm.*` or `*k_layernorm.*` decay too, as Megatron main's optimizer
// matches them by name.
std::vector<bool> qk_layernorm_weight_decay(const GPTModel& model);

// The parallel sizes of the layout flags on a world of `world_size` ranks.
ParallelSizes parallel_sizes_from_args(const Arguments& args, int64_t world_size);

// Builds the engine for validated `args` (with padded_vocab_size set) on `world`; the model is
// initialised from --seed. `ops` is the op table to use (features already applied). The optimizer
// is the distributed one with --use-distributed-optimizer (state for this DP rank's shards only),
// and the chunks' grad-ready / params-needed hooks drive the data-parallel sync with
// --overlap-grad-reduce / --overlap-param-gather.
StatusOr<std::unique_ptr<Engine>> build_engine(const Arguments& args, const Comm& world, const OpTable& ops,
                                               const EngineOptions& options = {});

}  // namespace gale
