// Validation of the distributed layout flags against the world size and the model shape.
#include <cstdlib>
#include <string>

#include "core/log.h"
#include "model/hybrid_pattern.h"
#include "schedule/pipeline_order.h"
#include "train/arguments.h"
#include "train/fsdp2_config.h"
#include "train/layerzero_config.h"
#include "train/pipeline_layout.h"

namespace gale {

namespace {

Status positive(int64_t v, const char* flag) {
  if (v <= 0) return InvalidArgument(flag, ": expected a positive integer, found ", v);
  return Status::Ok();
}

// Megatron's partial distributed optimizer (parallel_state and DistributedDataParallel asserts).
Status validate_distributed_optimizer_instances(const ParallelArgs& par) {
  const int64_t n = par.num_distributed_optimizer_instances;
  GALE_RETURN_IF_ERROR(positive(n, "--num-distributed-optimizer-instances"));
  if (n == 1) return Status::Ok();
  if (!par.use_distributed_optimizer)
    return InvalidArgument("--num-distributed-optimizer-instances ", n,
                           " shards the distributed optimizer: expected --use-distributed-optimizer");
  if (par.expert_model_parallel_size > 1)
    return InvalidArgument("--num-distributed-optimizer-instances ", n,
                           ": Megatron's partial distributed optimizer cannot be used with expert parallelism "
                           "(found --expert-model-parallel-size ", par.expert_model_parallel_size, ")");
  const int64_t dp_cp = par.data_parallel_size * par.context_parallel_size;
  if (dp_cp % n != 0)
    return InvalidArgument("--num-distributed-optimizer-instances ", n,
                           ": expected a divisor of the data-parallel size x --context-parallel-size, found ",
                           par.data_parallel_size, " x ", par.context_parallel_size, " = ", dp_cp);
  return Status::Ok();
}

// What ZeRO-2/3 (--data-parallel-sharding-strategy optim_grads / optim_grads_params, --layerzero;
// `who` names it) runs with: data parallelism only, fp32, one forward and backward per
// micro-batch, and no code that reads parameters outside the per-layer gathers
// (docs/parallelism.md §16). The first combination found, or Ok.
Status validate_zero3(Arguments& a, const std::string& who) {
  const ParallelArgs& par = a.parallel;
  const TrainingArgs& t = a.training;
  auto refuse = [&who](const std::string& what, const std::string& why) {
    return Unimplemented(who, " with ", what, ": not supported yet (", why, ")");
  };
  const char* parallel_only = "Gale's ZeRO-2/3 shards over the data-parallel group only";
  if (par.tensor_model_parallel_size > 1)
    return refuse(str_cat("--tensor-model-parallel-size ", par.tensor_model_parallel_size), parallel_only);
  if (par.pipeline_model_parallel_size > 1)
    return refuse(str_cat("--pipeline-model-parallel-size ", par.pipeline_model_parallel_size), parallel_only);
  if (par.context_parallel_size > 1)
    return refuse(str_cat("--context-parallel-size ", par.context_parallel_size), parallel_only);
  if (par.expert_model_parallel_size > 1 || a.moe.num_experts > 0)
    return refuse("MoE layers (--num-experts)", "the router's expert bias is read outside the per-layer gathers");
  if (par.num_distributed_optimizer_instances > 1)
    return refuse("--num-distributed-optimizer-instances", "one shard group: the whole data-parallel group");
  if (par.overlap_param_gather_with_optimizer_step)
    return refuse("--overlap-param-gather-with-optimizer-step", "nothing is gathered after the step");
  // FSDP2 gathers its bf16 GEMM copy per unit (param_dtype bf16, optim/zero3_sync.h); the others run in fp32.
  const bool fsdp2_bf16 = t.bf16 && who == "--use-torch-fsdp2";
  if ((t.bf16 && !fsdp2_bf16) || t.fp16)
    return refuse(t.bf16 ? "--bf16" : "--fp16", "the half-precision GEMM copy is not sharded; ZeRO-3 runs in fp32");
  if (fsdp2_bf16 && t.reuse_fp32_param)
    return refuse("--bf16 --reuse-fp32-param", "FSDP2 gathers the bf16 copy; the f32 masters are the shards");
  if (fsdp2_bf16 && !a.model.qat_scheme.empty())
    return refuse("--bf16 --qat-scheme", "the fake quantisation reads the f32 weights, gathered in bf16 here");
  if (fsdp2_bf16 && !a.model.fp8_format.empty())
    return refuse("--bf16 --fp8-format", "the FP8 casts read the f32 weights, gathered in bf16 here");
  if (t.optimizer == "muon") return refuse("--optimizer muon", "Muon orthogonalises whole matrices");
  if (t.optimizer == "lion") return refuse("--optimizer lion", "Megatron refuses its emerging optimizers with FSDP");
  if (t.swap_optimizer) return refuse("--swap-optimizer", "its state file follows the flat layout");
  if (t.compress_optimizer) return refuse("--compress-optimizer", "its compressed chunks follow the flat layout");
  if (t.calculate_per_token_loss)
    return refuse("--calculate-per-token-loss", "the gradients are rescaled after the reduce-scatter");
  if (t.check_weight_hash_across_dp_replicas_interval != kUnset)
    return refuse("--check-weight-hash-across-dp-replicas-interval", "the ranks hold shards, not replicas");
  // One layer per recomputed group (uniform by 1, or block) reruns while the layer is gathered for
  // its backward; a group of several would need them all gathered.
  if (a.model.recompute_granularity == "full" && a.model.recompute_method == "uniform" &&
      a.model.recompute_num_layers > 1)
    return refuse(str_cat("--recompute-granularity full --recompute-method uniform --recompute-num-layers ",
                          a.model.recompute_num_layers),
                  "a recomputed layer group would need all its layers gathered; groups of 1 layer work");
  if (a.model.mtp_num_layers != kUnset && a.model.mtp_num_layers > 0)
    return refuse("--mtp-num-layers", "the MTP layers run inside the head");
  if (a.lora.enabled()) return refuse("LoRA (--lora-target-modules)", "frozen parameters are not sharded");
  if (a.dpo.stage == "dpo") return refuse("--stage dpo", "the reference model is not sharded");
  if (a.checkpoint.async_save) return refuse("--async-save", "the gathered parameters are released after the save");
  if (par.overlap_grad_reduce || par.overlap_param_gather)
    warn_rank0("--overlap-grad-reduce / --overlap-param-gather have no effect with " + who +
               ": Gale's ZeRO-2/3 gathers each layer before its use and reduce-scatters its gradients after its "
               "backward, blocking");
  return Status::Ok();
}

// Megatron's custom FSDP (--use-custom-fsdp / --use-megatron-fsdp): each sharding strategy maps
// onto Gale's data-parallel paths (docs/parallelism.md §16). no_shard is plain data parallelism,
// optim is ZeRO-1, which is what the distributed optimizer does, optim_grads (ZeRO-2) and
// optim_grads_params (ZeRO-3) are optim/zero3_sync.h (build_engine). Also MindSpeed's --layerzero.
// MindSpeed's --layerzero (features/feature_layerzero.cc): the configuration file, zero3_size
// dividing the data-parallel size, and ZeRO-3's restrictions.
Status resolve_layerzero(Arguments& a) {
  ParallelArgs& par = a.parallel;
  if (!par.layerzero) {
    if (!par.layerzero_config.empty())
      return InvalidArgument("--layerzero-config ", par.layerzero_config, " configures LayerZeRO: expected --layerzero");
    return Status::Ok();
  }
  if (par.layerzero_config.empty())
    return InvalidArgument("--layerzero needs --layerzero-config FILE.yaml (MindSpeed's LayerZeRO configuration)");
  if (par.use_custom_fsdp && par.data_parallel_sharding_strategy != "no_shard")
    return InvalidArgument("--layerzero and --use-custom-fsdp --data-parallel-sharding-strategy ",
                           par.data_parallel_sharding_strategy, " both shard the model: expected one of them");
  GALE_ASSIGN_OR_RETURN(LayerZeroConfig config, read_layerzero_config(par.layerzero_config));
  const int64_t dp = par.data_parallel_size;
  if (dp % config.zero3_size != 0)
    return InvalidArgument("--layerzero-config ", par.layerzero_config, ": zero3_size ", config.zero3_size,
                           " must divide the data-parallel size ", dp);
  par.layerzero_zero3_size = config.zero3_size;
  for (const std::string& key : config.accepted_without_effect)
    warn_rank0("--layerzero-config " + par.layerzero_config + ": " + key +
               " has no effect in Gale (each unit is gathered just before its use, blocking, in fp32)");
  return validate_zero3(a, "--layerzero");
}

// Megatron's --use-torch-fsdp2 with MindSpeed's --fsdp2-config-path (features/feature_torch_fsdp2.cc):
// the conflicts, the configuration file (Megatron's defaults without it), sharding_size dividing the
// data-parallel size, and ZeRO-3's restrictions.
Status resolve_torch_fsdp2(Arguments& a) {
  ParallelArgs& par = a.parallel;
  if (!par.use_torch_fsdp2) {
    if (!par.fsdp2_config_path.empty())
      return InvalidArgument("--fsdp2-config-path ", par.fsdp2_config_path,
                             " configures FSDP2: expected --use-torch-fsdp2");
    return Status::Ok();
  }
  GALE_RETURN_IF_ERROR(check_torch_fsdp2_conflicts(a));
  Fsdp2Config config;
  if (!par.fsdp2_config_path.empty()) {
    GALE_ASSIGN_OR_RETURN(config, read_fsdp2_config(par.fsdp2_config_path));
  }
  const int64_t dp = par.data_parallel_size;
  if (config.sharding_size == 0) config.sharding_size = dp;
  if (dp % config.sharding_size != 0)
    return InvalidArgument("--fsdp2-config-path ", par.fsdp2_config_path, ": sharding_size ", config.sharding_size,
                           " must divide the data-parallel size ", dp);
  if (config.num_to_forward_prefetch > 0 && a.model.num_layers != kUnset &&
      config.num_to_forward_prefetch >= a.model.num_layers) {
    warn_rank0(str_cat("--fsdp2-config-path ", par.fsdp2_config_path, ": num_to_forward_prefetch ",
                       config.num_to_forward_prefetch, " is not below --num-layers ", a.model.num_layers,
                       ": no prefetch (as MindSpeed)"));
    config.num_to_forward_prefetch = 0;
  }
  par.fsdp2_sharding_size = config.sharding_size;
  par.fsdp2_wrap_embedding = config.wrap_embedding;
  par.fsdp2_wrap_layers = config.wrap_layers;
  par.fsdp2_wrap_head = config.wrap_head;
  par.fsdp2_reshard_after_forward = config.reshard_after_forward;
  // Megatron-LM main's --torch-fsdp2-no-reshard-after-forward: TorchFullyShardedDataParallelConfig(reshard_after_forward=False).
  if (par.torch_fsdp2_no_reshard_after_forward) par.fsdp2_reshard_after_forward = false;
  par.fsdp2_forward_prefetch = config.num_to_forward_prefetch;
  GALE_RETURN_IF_ERROR(fsdp2_precision(config, a).status());  // param_dtype / reduce_dtype against --bf16
  if (config.recompute_layers) {  // MindSpeed's activation checkpointing of every transformer layer
    ModelArgs& m = a.model;
    if (!m.recompute_granularity.empty())
      return InvalidArgument("--fsdp2-config-path ", par.fsdp2_config_path, ": recompute_modules and "
                             "--recompute-granularity ", m.recompute_granularity,
                             " both set recomputation: expected one of them (MindSpeed: leave the flags out)");
    m.recompute_granularity = "full";
    m.recompute_method = "uniform";
    m.recompute_num_layers = 1;
  }
  for (const std::string& key : config.accepted_without_effect)
    warn_rank0("--fsdp2-config-path " + par.fsdp2_config_path + ": " + key +
               " has no effect in Gale (it trains on the CPU, in fp32: parameters, gradients and optimizer state "
               "already are in host memory)");
  return validate_zero3(a, "--use-torch-fsdp2");
}

Status resolve_custom_fsdp(Arguments& a) {
  ParallelArgs& par = a.parallel;
  GALE_RETURN_IF_ERROR(resolve_torch_fsdp2(a));
  GALE_RETURN_IF_ERROR(resolve_layerzero(a));
  const std::string& strategy = par.data_parallel_sharding_strategy;
  if (!par.use_custom_fsdp) {
    if (strategy != "no_shard")
      warn_rank0("--data-parallel-sharding-strategy " + strategy +
                 " has no effect without --use-custom-fsdp (as in Megatron); use --use-distributed-optimizer for "
                 "ZeRO-1");
    return Status::Ok();
  }
  if (strategy == "optim_grads" || strategy == "optim_grads_params")
    return validate_zero3(a, "--data-parallel-sharding-strategy " + strategy);
  if (strategy == "no_shard" && par.use_distributed_optimizer)
    return InvalidArgument("--use-custom-fsdp --data-parallel-sharding-strategy no_shard keeps the optimizer state "
                           "whole, but --use-distributed-optimizer shards it: expected --data-parallel-sharding-"
                           "strategy optim (ZeRO-1), found no_shard");
  if (strategy == "optim") par.use_distributed_optimizer = true;  // ZeRO-1 is the distributed optimizer
  return Status::Ok();
}

// The flag that gives the explicit split (one of them is set).
const char* explicit_split_flag(const ParallelArgs& par) {
  if (!par.num_layer_list.empty()) return "--num-layer-list";
  if (!par.pipeline_model_parallel_layout.empty()) return "--pipeline-model-parallel-layout";
  return "--pipeline-num-transformer-layers";
}

// The flags an explicit split cannot be combined with (MindSpeed's and MindSpeed-LLM's rules, and
// Megatron's own split flags, which it replaces).
Status check_explicit_split_flags(const ParallelArgs& par, const ModelArgs& m) {
  const bool list = !par.num_layer_list.empty(), layout = !par.pipeline_model_parallel_layout.empty();
  const char* flag = explicit_split_flag(par);
  const int given = int{list} + int{layout} + int{!par.pipeline_num_transformer_layers.empty()};
  if (given > 1)
    return InvalidArgument("--num-layer-list, --pipeline-num-transformer-layers and --pipeline-model-parallel-layout "
                           "each give the layers of every pipeline stage: expected one of them, found ", given);
  if (layout && (par.num_layers_per_virtual_pipeline_stage != kUnset || par.num_virtual_stages_per_pipeline_rank != kUnset))
    return InvalidArgument("--pipeline-model-parallel-layout gives the virtual stages itself (as Megatron: no more "
                           "than one of it, --num-layers-per-virtual-pipeline-stage and "
                           "--num-virtual-stages-per-pipeline-rank), found ",
                           par.num_layers_per_virtual_pipeline_stage != kUnset
                               ? "--num-layers-per-virtual-pipeline-stage"
                               : "--num-virtual-stages-per-pipeline-rank");
  if (!m.noop_layers_flag.empty())
    return InvalidArgument(flag, " cannot be combined with --noop-layers (as in MindSpeed: both decide which "
                           "stage holds which layers; give one), found --noop-layers ", m.noop_layers_flag);
  for (auto [set, other] : {std::pair{par.decoder_first_pipeline_num_layers != kUnset,
                                      "--decoder-first-pipeline-num-layers"},
                            std::pair{par.decoder_last_pipeline_num_layers != kUnset,
                                      "--decoder-last-pipeline-num-layers"},
                            std::pair{par.account_for_embedding_in_pipeline_split,
                                      "--account-for-embedding-in-pipeline-split"},
                            std::pair{par.account_for_loss_in_pipeline_split, "--account-for-loss-in-pipeline-split"}})
    if (set)
      return InvalidArgument(flag, " gives every stage's layers itself: expected no ", other, ", found it set");
  if (list) {  // MindSpeed-LLM's NumLayerListFeature
    if (par.pipeline_model_parallel_size < 2)
      return InvalidArgument("--num-layer-list splits the layers over pipeline stages: expected "
                             "--pipeline-model-parallel-size > 1, found ", par.pipeline_model_parallel_size);
    if (par.num_layers_per_virtual_pipeline_stage != kUnset || par.num_virtual_stages_per_pipeline_rank != kUnset)
      return InvalidArgument("--num-layer-list cannot be combined with ",
                             par.num_layers_per_virtual_pipeline_stage != kUnset
                                 ? "--num-layers-per-virtual-pipeline-stage"
                                 : "--num-virtual-stages-per-pipeline-rank",
                             " (as in MindSpeed-LLM: one count per pipeline rank, no virtual stages; give "
                             "--pipeline-num-transformer-layers for the layers of each virtual stage)");
  }
  return Status::Ok();
}

// --num-layer-list / --pipeline-num-transformer-layers against the layout (the VPP size already
// derived): one row per pipeline rank, one count per virtual stage, none negative, summing to
// --num-layers. Zero counts are allowed (MindSpeed's [[0,1],...]): a virtual stage may hold only
// the embedding, only the loss, or nothing. Sets par.pipeline_layers.
Status validate_explicit_split(ParallelArgs& par, const ModelArgs& m) {
  const int64_t num_layers = m.num_layers;
  if (!par.pipeline_model_parallel_layout.empty()) {
    StatusOr<std::vector<std::vector<int64_t>>> layers =
        pipeline_layout_layers(par.pipeline_model_parallel_layout, par.pipeline_model_parallel_size, num_layers,
                               m.mtp_num_layers == kUnset ? 0 : m.mtp_num_layers);
    if (!layers.ok()) return layers.status();
    par.pipeline_layers = std::move(*layers);
    return Status::Ok();
  }
  const bool list = !par.num_layer_list.empty();
  const char* flag = list ? "--num-layer-list" : "--pipeline-num-transformer-layers";
  const std::string& text = list ? par.num_layer_list : par.pipeline_num_transformer_layers;
  StatusOr<std::vector<std::vector<int64_t>>> rows =
      list ? parse_num_layer_list(text) : parse_pipeline_num_transformer_layers(text);
  if (!rows.ok()) return rows.status();
  const int64_t pp = par.pipeline_model_parallel_size, vpp = par.virtual_pipeline_model_parallel_size;
  if (static_cast<int64_t>(rows->size()) != pp)
    return InvalidArgument(flag, " ", text, ": expected ", list ? "one count" : "one row",
                           " per pipeline rank (--pipeline-model-parallel-size ", pp, "), found ", rows->size());
  int64_t total = 0;
  for (size_t r = 0; r < rows->size(); ++r) {
    const std::vector<int64_t>& row = (*rows)[r];
    if (static_cast<int64_t>(row.size()) != vpp)
      return InvalidArgument(flag, " ", text, ": expected ", vpp, " count", vpp == 1 ? "" : "s",
                             " per row (the virtual stages of each pipeline rank", vpp == 1 ? ": none" : "",
                             "), found ", row.size(), " in row ", r);
    for (int64_t n : row) {
      if (n < 0)
        return InvalidArgument(flag, " ", text, ": expected layer counts >= 0, found ", n, " for pipeline rank ", r);
      total += n;
    }
  }
  if (total != num_layers)
    return InvalidArgument(flag, " ", text, " places ", total, " layers: expected the sum to be --num-layers ",
                           num_layers);
  par.pipeline_layers = std::move(*rows);
  return Status::Ok();
}

// The pipeline split of a hybrid pattern with '|' (model/hybrid_pattern.h): each segment one
// virtual stage, segment k = v·PP + r on pipeline rank r. Sets the VPP size and par.pipeline_layers.
Status hybrid_pattern_split(ParallelArgs& par, const ModelArgs& m) {
  StatusOr<HybridLayerPattern> pattern = parse_hybrid_layer_pattern(m.hybrid_override_pattern, "--hybrid-layer-pattern");
  if (!pattern.ok()) return pattern.status();
  StatusOr<std::vector<std::vector<int64_t>>> layers =
      hybrid_pattern_stage_layers(*pattern, par.pipeline_model_parallel_size, "--hybrid-layer-pattern");
  if (!layers.ok()) return layers.status();
  par.virtual_pipeline_model_parallel_size = static_cast<int64_t>(layers->front().size());
  par.pipeline_layers = std::move(*layers);
  return Status::Ok();
}

// Megatron's pipeline split rules (arguments.py and TransformerConfig): layers divide evenly over
// the stages, or over the middle stages once --decoder-first/last-pipeline-num-layers are taken
// out, and each stage's layers divide by the virtual stages per rank. With
// --account-for-embedding/loss-in-pipeline-split the embedding and the loss count as layers of the
// even split (and exclude the uneven one). Sets the derived VPP size.
//
// An explicit split (--num-layer-list, --pipeline-num-transformer-layers) replaces all of these;
// validate_explicit_split checks it.
Status validate_pipeline_split(ParallelArgs& par, const ModelArgs& m) {
  // A hybrid pattern's '|' give every stage's layers (the flags that would give them otherwise are
  // refused by resolve_hybrid_layer_pattern, train/arguments_hybrid.cc).
  if (m.is_hybrid_model && has_hybrid_pipes(m.hybrid_override_pattern)) return hybrid_pattern_split(par, m);
  const int64_t num_layers = m.num_layers;
  const int64_t pp = par.pipeline_model_parallel_size;
  const int64_t first = par.decoder_first_pipeline_num_layers, last = par.decoder_last_pipeline_num_layers;
  const bool uneven = first != kUnset || last != kUnset;
  const bool with_embedding = par.account_for_embedding_in_pipeline_split;
  const bool with_loss = par.account_for_loss_in_pipeline_split;
  const bool explicit_split = !par.num_layer_list.empty() || !par.pipeline_num_transformer_layers.empty() ||
                              !par.pipeline_model_parallel_layout.empty();
  if (explicit_split) GALE_RETURN_IF_ERROR(check_explicit_split_flags(par, m));
  if (uneven && (with_embedding || with_loss))
    return InvalidArgument(
        with_embedding ? "--account-for-embedding-in-pipeline-split" : "--account-for-loss-in-pipeline-split",
        " cannot be combined with ",
        first != kUnset ? "--decoder-first-pipeline-num-layers" : "--decoder-last-pipeline-num-layers",
        " (Megatron counts the embedding and the loss only in the even split)");
  // The layers divided among the stages, and how the messages spell them.
  const int64_t split_layers = num_layers + (with_embedding ? 1 : 0) + (with_loss ? 1 : 0);
  std::string layers_text = "--num-layers " + std::to_string(num_layers);
  if (split_layers != num_layers)
    layers_text = "(" + layers_text + " + " + std::to_string(split_layers - num_layers) + " for the " +
                  (with_embedding && with_loss ? "embedding and the loss"
                   : with_embedding        ? "embedding"
                                           : "loss") +
                  ")";
  const bool by_layers = par.num_layers_per_virtual_pipeline_stage != kUnset;
  const bool by_stages = par.num_virtual_stages_per_pipeline_rank != kUnset;
  if (by_layers && by_stages)
    return InvalidArgument(
        "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank are "
        "exclusive; give one");
  if ((by_layers || by_stages) && pp == 1)
    return InvalidArgument(
        by_layers ? "--num-layers-per-virtual-pipeline-stage" : "--num-virtual-stages-per-pipeline-rank",
        " (interleaved pipeline) needs --pipeline-model-parallel-size > 1");
  if (uneven && pp == 1)
    return InvalidArgument(
        first != kUnset ? "--decoder-first-pipeline-num-layers" : "--decoder-last-pipeline-num-layers",
        " needs --pipeline-model-parallel-size > 1");
  if (uneven && by_layers)
    return InvalidArgument(
        "--num-layers-per-virtual-pipeline-stage cannot be combined with "
        "--decoder-first/last-pipeline-num-layers; give --num-virtual-stages-per-pipeline-rank");
  int64_t vpp = 1;
  if (by_layers) {
    GALE_RETURN_IF_ERROR(
        positive(par.num_layers_per_virtual_pipeline_stage, "--num-layers-per-virtual-pipeline-stage"));
    if (split_layers % pp != 0)
      return InvalidArgument(layers_text, split_layers != num_layers ? " = " + std::to_string(split_layers) : "",
                             " must be divisible by --pipeline-model-parallel-size ", pp);
    if ((split_layers / pp) % par.num_layers_per_virtual_pipeline_stage != 0)
      return InvalidArgument("the ", split_layers / pp, " layers per pipeline stage (", layers_text,
                             " / --pipeline-model-parallel-size ", pp,
                             ") must be divisible by "
                             "--num-layers-per-virtual-pipeline-stage ",
                             par.num_layers_per_virtual_pipeline_stage);
    vpp = split_layers / pp / par.num_layers_per_virtual_pipeline_stage;
  } else if (by_stages) {
    GALE_RETURN_IF_ERROR(positive(par.num_virtual_stages_per_pipeline_rank, "--num-virtual-stages-per-pipeline-rank"));
    vpp = par.num_virtual_stages_per_pipeline_rank;
  }
  if (!par.pipeline_model_parallel_layout.empty()) {  // the stage count / PP (its other rules: pipeline_layout.h)
    StatusOr<std::vector<std::string>> stages = parse_pipeline_layout(par.pipeline_model_parallel_layout);
    if (!stages.ok()) return stages.status();
    const int64_t n = static_cast<int64_t>(stages->size());
    if (n % pp != 0)
      return InvalidArgument("--pipeline-model-parallel-layout '", par.pipeline_model_parallel_layout,
                             "': expected a number of stages divisible by --pipeline-model-parallel-size ", pp,
                             ", found ", n);
    vpp = n / pp;
    if (vpp > 1 && pp == 1)
      return InvalidArgument("--pipeline-model-parallel-layout '", par.pipeline_model_parallel_layout, "' has ", n,
                             " stages: virtual pipeline stages need --pipeline-model-parallel-size > 1");
  }
  par.virtual_pipeline_model_parallel_size = vpp;
  if (par.microbatch_group_size_per_virtual_stage != kUnset)
    GALE_RETURN_IF_ERROR(
        positive(par.microbatch_group_size_per_virtual_stage, "--microbatch-group-size-per-virtual-pipeline-stage"));
  if (explicit_split) return validate_explicit_split(par, m);
  if (!uneven) {
    if (split_layers % pp != 0) {
      if (split_layers != num_layers)
        return InvalidArgument(layers_text, " = ", split_layers, " must be divisible by --pipeline-model-parallel-size ",
                               pp);
      return InvalidArgument("--num-layers ", num_layers, " must be divisible by --pipeline-model-parallel-size ", pp,
                             " (or give --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers)");
    }
    if ((split_layers / pp) % vpp != 0)
      return InvalidArgument("the ", split_layers / pp, " layers per pipeline stage (", layers_text,
                             " / --pipeline-model-parallel-size ", pp,
                             ") must be divisible by --num-virtual-stages-per-pipeline-rank ", vpp);
    return Status::Ok();
  }
  int64_t middle_layers = num_layers, middle_stages = pp;
  for (auto [n, flag] : {std::pair{first, "--decoder-first-pipeline-num-layers"},
                         std::pair{last, "--decoder-last-pipeline-num-layers"}}) {
    if (n == kUnset) continue;
    GALE_RETURN_IF_ERROR(positive(n, flag));
    if (n % vpp != 0)
      return InvalidArgument(flag, " ", n, " must be divisible by --num-virtual-stages-per-pipeline-rank ", vpp);
    middle_layers -= n;
    middle_stages -= 1;
  }
  if (middle_layers < 0)
    return InvalidArgument("--decoder-first/last-pipeline-num-layers take ", num_layers - middle_layers,
                           " layers, more than --num-layers ", num_layers);
  if (middle_stages == 0) {
    if (middle_layers != 0)
      return InvalidArgument("--decoder-first-pipeline-num-layers ", first, " + --decoder-last-pipeline-num-layers ",
                             last, " must equal --num-layers ", num_layers, " with --pipeline-model-parallel-size 2");
    return Status::Ok();
  }
  if (middle_layers % middle_stages != 0)
    return InvalidArgument("the ", middle_layers, " layers left for the ", middle_stages,
                           " middle pipeline stages (--num-layers minus --decoder-first/last-pipeline-num-layers) "
                           "must divide evenly among them");
  if ((middle_layers / middle_stages) % vpp != 0)
    return InvalidArgument("the ", middle_layers / middle_stages,
                           " layers of each middle pipeline stage must be "
                           "divisible by --num-virtual-stages-per-pipeline-rank ",
                           vpp);
  return Status::Ok();
}

// --schedules-method dualpipev (MindSpeed's DualpipeVFeature). Before the split: the flags that
// place layers another way (virtual stages, explicit or uneven splits; Gale cuts the layers into
// 2·PP equal chunks). After it (`split_done`): the chunks per rank (2) and the even cut.
Status validate_dualpipev(ParallelArgs& par, const ModelArgs& m, bool split_done) {
  if (par.schedules_method != "dualpipev") return Status::Ok();
  const int64_t pp = par.pipeline_model_parallel_size;
  if (!split_done) {
    if (pp < 2)
      return InvalidArgument("--schedules-method dualpipev needs --pipeline-model-parallel-size >= 2, found ", pp);
    for (auto [set, flag] :
         {std::pair{par.num_layers_per_virtual_pipeline_stage != kUnset, "--num-layers-per-virtual-pipeline-stage"},
          std::pair{par.num_virtual_stages_per_pipeline_rank != kUnset, "--num-virtual-stages-per-pipeline-rank"},
          std::pair{par.microbatch_group_size_per_virtual_stage != kUnset,
                    "--microbatch-group-size-per-virtual-pipeline-stage"},
          std::pair{!par.num_layer_list.empty(), "--num-layer-list"},
          std::pair{!par.pipeline_num_transformer_layers.empty(), "--pipeline-num-transformer-layers"},
          std::pair{!par.pipeline_model_parallel_layout.empty(), "--pipeline-model-parallel-layout"},
          std::pair{par.decoder_first_pipeline_num_layers != kUnset, "--decoder-first-pipeline-num-layers"},
          std::pair{par.decoder_last_pipeline_num_layers != kUnset, "--decoder-last-pipeline-num-layers"},
          std::pair{par.account_for_embedding_in_pipeline_split, "--account-for-embedding-in-pipeline-split"},
          std::pair{par.account_for_loss_in_pipeline_split, "--account-for-loss-in-pipeline-split"},
          std::pair{par.overlap_param_gather_with_optimizer_step, "--overlap-param-gather-with-optimizer-step"}})
      if (set)
        return InvalidArgument("--schedules-method dualpipev places the layers itself (2 x PP equal chunks, rank r "
                               "holding chunks r and 2PP-1-r): expected no ", flag, ", found it set");
    return Status::Ok();
  }
  if (m.num_layers % (2 * pp) != 0)
    return InvalidArgument("--schedules-method dualpipev cuts the layers into 2 x --pipeline-model-parallel-size = ",
                           2 * pp, " equal chunks: expected --num-layers divisible by ", 2 * pp, ", found ",
                           m.num_layers);
  par.virtual_pipeline_model_parallel_size = 2;  // the V's two chunks per rank
  return Status::Ok();
}

// DualPipeV's micro-batch count: at least 2·PP per iteration (DeepSeek's and MindSpeed's rule;
// the V's warm-up alone runs 2·PP − 1 forwards on rank 0), with the global batch size known.
Status validate_dualpipev_microbatches(const Arguments& a) {
  const ParallelArgs& par = a.parallel;
  if (par.schedules_method != "dualpipev") return Status::Ok();
  const int64_t per_step = a.training.micro_batch_size * par.data_parallel_size;
  const int64_t gbs = a.training.global_batch_size == kUnset ? per_step : a.training.global_batch_size;
  if (per_step <= 0 || gbs % per_step != 0) return Status::Ok();
  if (!a.training.rampup_batch_size.empty())
    return InvalidArgument("--schedules-method dualpipev needs a fixed number of micro-batches per iteration (at "
                           "least 2 x PP): expected no --rampup-batch-size");
  return check_dualpipev_microbatches(static_cast<int>(par.pipeline_model_parallel_size), gbs / per_step);
}

// --dualpipev-dw-detach (MindSpeed's): DualPipeV only, and only where Gale splits a layer's backward
// (model/weight_grad_store.h): the attention (standard or MLA) and MLP linears, the MoE experts and
// shared experts; LoRA adapters and --tp-2d's linears are not split.
// --overlap-grad-reduce would start a bucket's reduction once its layer's backward returns, before
// the deferred weight gradients are in it.
Status validate_dualpipev_dw_detach(const Arguments& a) {
  const ParallelArgs& par = a.parallel;
  if (!par.dualpipev_dw_detach) return Status::Ok();
  if (par.schedules_method != "dualpipev")
    return InvalidArgument("--dualpipev-dw-detach needs --schedules-method dualpipev, found --schedules-method '",
                           par.schedules_method, "'");
  const char* const splits =
      "--dualpipev-dw-detach defers the weight gradients of the GPT layers' linears (attention, MLA, MLP, MoE "
      "experts) only";
  if (a.lora.enabled())
    return InvalidArgument(splits, ": expected no LoRA adapters, found --lora-target-modules (not supported yet)");
  if (par.tp_2d) return InvalidArgument(splits, ": expected no --tp-2d, found it set (not supported yet)");
  if (a.training.swap_attention)
    return InvalidArgument(splits, ": expected no --swap-attention (its swapped-in activations are reused before the "
                           "deferred gradients run), found it set (not supported yet)");
  if (par.overlap_grad_reduce)
    return InvalidArgument("--dualpipev-dw-detach runs weight gradients after their layer's backward: expected no "
                           "--overlap-grad-reduce (a bucket's reduction would start before them), found it set "
                           "(not supported yet)");
  return Status::Ok();
}

// The interleaved schedule's micro-batch count (a multiple of PP, as Megatron requires). The
// global batch size may still be unset (it defaults to micro-batch x DP) or not divide evenly;
// the training-flag checks report that.
Status validate_interleaved_microbatches(const Arguments& a) {
  const ParallelArgs& par = a.parallel;
  if (par.virtual_pipeline_model_parallel_size <= 1 || par.schedules_method == "dualpipev") return Status::Ok();
  const int64_t per_step = a.training.micro_batch_size * par.data_parallel_size;
  const int64_t gbs = a.training.global_batch_size == kUnset ? per_step : a.training.global_batch_size;
  if (per_step <= 0 || gbs % per_step != 0) return Status::Ok();
  const int64_t pp = par.pipeline_model_parallel_size, num_microbatches = gbs / per_step;
  const int64_t group = par.microbatch_group_size_per_virtual_stage;
  if (group != kUnset) return check_interleaved_microbatches(static_cast<int>(pp), num_microbatches, group);
  if (check_interleaved_microbatches(static_cast<int>(pp), num_microbatches).ok()) return Status::Ok();
  return InvalidArgument("the interleaved pipeline schedule needs the micro-batches per iteration (--global-batch-size ",
                         gbs, " / (--micro-batch-size ", a.training.micro_batch_size, " x data-parallel size ",
                         par.data_parallel_size, ") = ", num_microbatches,
                         ") to be a multiple of --pipeline-model-parallel-size ", pp);
}

// Megatron's --cp-comm-type (one type, or one per layer) and --hierarchical-context-parallel-sizes,
// resolved onto the algorithms Gale implements: p2p and allgather stay megatron_cp_algo's two
// variants, a2a is ulysses_cp_algo, and a2a+p2p with sizes [A, P] is hybrid_cp_algo with
// --ulysses-degree-in-cp A (Megatron's first level, A adjacent cp ranks, runs the all-to-all; the
// ring runs across the second level). A lone A = 1 or P = 1 degenerates to the ring or to Ulysses.
Status resolve_cp_comm_type(Arguments& a) {
  ParallelArgs& par = a.parallel;
  const std::vector<std::string>& types = par.cp_comm_type_list;
  if (!types.empty()) {
    const int64_t L = a.model.num_layers;
    for (const std::string& t : types)
      if (t != "p2p" && t != "a2a" && t != "allgather" && t != "a2a+p2p")
        return InvalidArgument("--cp-comm-type: expected p2p, a2a, allgather or a2a+p2p, found '", t, "'");
    if (types.size() > 1 && static_cast<int64_t>(types.size()) != L)
      return InvalidArgument("--cp-comm-type: expected one type or one per layer (--num-layers ", L, "), found ",
                             types.size(), " types");
    for (const std::string& t : types)
      if (t != types[0])
        return Unimplemented("--cp-comm-type with different types per layer (", types[0], ", ", t,
                             "): not supported yet (expected one type for all layers)");
    par.cp_comm_type = types[0];
  }
  std::vector<int64_t> sizes;  // --hierarchical-context-parallel-sizes, parsed
  int64_t hierarchy_product = 1;
  for (const std::string& v : par.hierarchical_context_parallel_sizes) {
    char* end = nullptr;
    const long long size = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || size < 1)
      return InvalidArgument("--hierarchical-context-parallel-sizes: expected positive integers, found '", v, "'");
    sizes.push_back(size);
    hierarchy_product *= size;
  }
  if (!sizes.empty() && hierarchy_product != par.context_parallel_size)
    return InvalidArgument("--hierarchical-context-parallel-sizes: expected sizes whose product is "
                           "--context-parallel-size ", par.context_parallel_size, ", found a product of ",
                           hierarchy_product);
  const std::string comm = par.cp_comm_type, algo = par.context_parallel_algo;
  // MindSpeed's kvallgather_cp_algo (Llama 3's all-gather CP) is the all-gather of keys and
  // values: Megatron's --cp-comm-type allgather, which is all it may be combined with.
  if (algo == "kvallgather_cp_algo" && comm != "a2a" && comm != "a2a+p2p") {
    if (!types.empty() && comm != "allgather")
      return InvalidArgument("--context-parallel-algo kvallgather_cp_algo all-gathers keys and values: expected "
                             "--cp-comm-type allgather or none, found '", comm, "'");
    par.cp_comm_type = "allgather";
    return Status::Ok();
  }
  if (comm != "a2a" && comm != "a2a+p2p") return Status::Ok();
  if (comm == "a2a+p2p" && sizes.empty())
    return InvalidArgument("--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm");
  if (comm == "a2a+p2p" && sizes.size() != 2)
    return InvalidArgument("--cp-comm-type a2a+p2p: expected two --hierarchical-context-parallel-sizes (the "
                           "all-to-all level and the ring level), found ", sizes.size());
  if (algo != "megatron_cp_algo" && !(comm == "a2a" && algo == "ulysses_cp_algo"))
    return InvalidArgument("--cp-comm-type ", comm, " selects the context-parallel algorithm itself (",
                           comm == "a2a" ? "ulysses_cp_algo" : "hybrid_cp_algo",
                           "): expected --context-parallel-algo megatron_cp_algo (the default), found '", algo, "'");
  if (par.context_parallel_size == 1) return Status::Ok();
  const int64_t a2a_size = comm == "a2a" ? par.context_parallel_size : sizes[0];
  par.cp_comm_type = "p2p";
  if (a2a_size == par.context_parallel_size) {
    par.context_parallel_algo = "ulysses_cp_algo";
  } else if (a2a_size > 1) {
    par.context_parallel_algo = "hybrid_cp_algo";
    par.ulysses_degree_in_cp = a2a_size;
  }
  return Status::Ok();
}

// MindSpeed's adaptive CP (--context-parallel-algo adaptive_cp_algo, parallel/adaptive_cp.h) and its
// flags: ring attention only (p2p; the double ring and the key/value cache apply), not with the multi-parameter
// pipeline, the dynamic mode with document masks, and the sub-flags only with the algorithm.
// MindSpeed's hybrid_adaptive_cp_algo is hybrid_cp_algo with adaptive rings: resolved here into
// hybrid_cp_algo plus ParallelArgs::adaptive_cp (as adaptive_cp_algo sets it), before validation.
void resolve_adaptive_cp(ParallelArgs& par) {
  if (par.context_parallel_algo == "hybrid_adaptive_cp_algo") {
    par.context_parallel_algo = "hybrid_cp_algo";
    par.adaptive_cp = true;
  }
  if (par.context_parallel_algo == "adaptive_cp_algo") par.adaptive_cp = true;
}

Status validate_adaptive_cp(const Arguments& a) {
  const ParallelArgs& par = a.parallel;
  const int64_t cp = par.context_parallel_size;
  const bool on = par.adaptive_cp && cp > 1;
  const std::string algo = par.context_parallel_algo == "hybrid_cp_algo" ? "hybrid_adaptive_cp_algo" : "adaptive_cp_algo";
  const std::pair<bool, const char*> sub_flags[] = {
      {par.adaptive_cp_only_reschedule, "--adaptive-cp-only-reschedule"},
      {par.adaptive_cp_without_coarse, "--adaptive-cp-without-coarse"},
      {par.adaptive_cp_dynamic_attn_mask, "--adaptive-cp-dynamic-attn-mask"},
      {par.attention_mask_on_cpu, "--attention-mask-on-cpu"},
      {par.adaptive_cp_manually_set_mask_list, "--adaptive-cp-manually-set-mask-list"}};
  for (const auto& [set, flag] : sub_flags)
    if (set && !on)
      return InvalidArgument(flag, " applies to --context-parallel-algo adaptive_cp_algo or hybrid_adaptive_cp_algo "
                             "with --context-parallel-size > 1, found ",
                             cp == 1 ? std::string("--context-parallel-size 1")
                                     : "--context-parallel-algo " + par.context_parallel_algo);
  if (!on) return Status::Ok();
  if (par.adaptive_cp_manually_set_mask_list)
    return Unimplemented("--adaptive-cp-manually-set-mask-list: not supported yet (MindSpeed takes the mask list from "
                         "a Python function the user edits, generate_adaptive_cp_mask_list_by_user; Gale derives every "
                         "block from the document ids and --sliding-window)");
  if (par.cp_comm_type != "p2p")
    return InvalidArgument("--context-parallel-algo ", algo, " skips the empty blocks of ring attention: expected "
                           "--cp-comm-type p2p, found '", par.cp_comm_type, "'");
  // Every pipeline stage reads the micro-batch and computes the same layout, except that the later
  // stages of the multi-parameter pipeline take the document ids from the transfer instead.
  if (par.use_multiparameter_pipeline_model_parallel)
    return Unimplemented("--context-parallel-algo ", algo, " with --use-multiparameter-pipeline-model-parallel: "
                         "not supported yet (the later stages would plan without the document ids)");
  if (a.data.document_attention() && !par.adaptive_cp_dynamic_attn_mask)
    return InvalidArgument("--context-parallel-algo ", algo, " with ",
                           a.data.sft                                ? "--sft"
                           : a.data.dataloader_inter_document_masking ? "--dataloader-inter-document-masking"
                                                                      : "--reset-attention-mask",
                           ": the document mask "
                           "changes every micro-batch, so the layout must too: expected --adaptive-cp-dynamic-attn-mask "
                           "(a layout computed once would skip blocks that later micro-batches need)");
  return Status::Ok();
}

// --context-parallel-size with MindSpeed's --context-parallel-algo and Megatron's --cp-comm-type
// (already resolved by resolve_cp_comm_type).
Status validate_context_parallel(const Arguments& a, const std::string& requested_comm) {
  const ParallelArgs& par = a.parallel;
  const std::string& algo = par.context_parallel_algo;
  const bool ulysses = algo == "ulysses_cp_algo", hybrid = algo == "hybrid_cp_algo";
  const bool adaptive = algo == "adaptive_cp_algo";
  if (algo != "megatron_cp_algo" && algo != "kvallgather_cp_algo" && !ulysses && !hybrid && !adaptive) {
    return InvalidArgument("--context-parallel-algo: expected megatron_cp_algo, kvallgather_cp_algo, ulysses_cp_algo, "
                           "hybrid_cp_algo, adaptive_cp_algo or hybrid_adaptive_cp_algo, found '", algo, "'");
  }
  const int64_t cp = par.context_parallel_size, U = par.ulysses_degree_in_cp;
  if (!hybrid && U != 0)
    return InvalidArgument("--ulysses-degree-in-cp ", U, " needs --context-parallel-algo hybrid_cp_algo, found '",
                           algo, "'");
  // MindSpeed's rule: the hybrid needs both factors; U = 1 would be megatron_cp_algo's ring and
  // U = CP ulysses_cp_algo, which are selected by name instead.
  const std::string hybrid_name = par.adaptive_cp ? "hybrid_adaptive_cp_algo" : "hybrid_cp_algo";
  if (hybrid && (U < 2 || U >= cp || cp % U != 0))
    return InvalidArgument("--context-parallel-algo ", hybrid_name, ": expected --ulysses-degree-in-cp U with 1 < U < "
                           "--context-parallel-size ", cp, " and U dividing it (U = 1 is megatron_cp_algo, U = CP "
                           "ulysses_cp_algo), found ", U == 0 ? std::string("none") : std::to_string(U));
  if (hybrid && par.cp_comm_type != "p2p")
    return InvalidArgument("--context-parallel-algo ", hybrid_name, " runs ring attention across its Ulysses groups: "
                           "expected --cp-comm-type p2p, found '", par.cp_comm_type, "'");
  GALE_RETURN_IF_ERROR(validate_adaptive_cp(a));
  if (par.use_ulysses_allgather_kv && cp == 1)
    return InvalidArgument("--use-ulysses-allgather-kv needs --context-parallel-size > 1 with ulysses_cp_algo, found "
                           "--context-parallel-size 1");
  if (cp == 1) return Status::Ok();
  const int64_t S = a.model.seq_length;
  if (S % (2 * cp) != 0)
    return InvalidArgument("--seq-length ", S, " must be divisible by 2 x --context-parallel-size ", cp, " = ", 2 * cp,
                           " (each sequence is cut into 2 x CP equal chunks)");
  const int64_t tp = par.tensor_model_parallel_size;
  // Ulysses splits the heads over TP x CP, hybrid over TP x U; the query groups likewise, or, with
  // fewer groups per TP rank than the degree (KVl dividing it), each group's key and value go to the
  // D/KVl ranks holding its heads (MindSpeed's repeat all-to-all).
  const auto heads_divisible = [&](const std::string& what, const char* name, const char* flag,
                                   int64_t degree) -> Status {
    const int64_t NH = a.model.num_attention_heads, KV = a.model.num_kv_heads;
    if (NH % (tp * degree) != 0)
      return InvalidArgument(what, " splits the heads over TP x ", name, ": --num-attention-heads ", NH,
                             " must be divisible by --tensor-model-parallel-size ", tp, " x ", flag, " ", degree, " = ",
                             tp * degree);
    if (KV % tp == 0 && (KV / tp % degree == 0 || degree % (KV / tp) == 0)) return Status::Ok();
    return InvalidArgument(what, " splits the query groups over TP x ", name, ": --num-query-groups ", KV,
                           " must be divisible by --tensor-model-parallel-size ", tp, " x ", flag, " ", degree, " = ",
                           tp * degree, ", or by TP with ", flag, " a multiple of the ", KV % tp == 0 ? KV / tp : KV,
                           " groups per TP rank");
  };
  // Reached through Megatron's --cp-comm-type a2a / a2a+p2p, the messages name that flag.
  const bool from_comm = requested_comm == "a2a" || requested_comm == "a2a+p2p";
  if (ulysses)
    GALE_RETURN_IF_ERROR(heads_divisible(from_comm ? "--cp-comm-type " + requested_comm
                                                   : std::string("--context-parallel-algo ulysses_cp_algo"),
                                         "CP", "--context-parallel-size", cp));
  if (hybrid)
    GALE_RETURN_IF_ERROR(heads_divisible(from_comm ? "--cp-comm-type a2a+p2p"
                                                   : std::string("--context-parallel-algo hybrid_cp_algo"),
                                         "U", from_comm ? "the first --hierarchical-context-parallel-sizes"
                                                        : "--ulysses-degree-in-cp", U));
  if (par.use_ulysses_allgather_kv) {
    if (!ulysses)
      return InvalidArgument("--use-ulysses-allgather-kv needs --context-parallel-algo ulysses_cp_algo, found '", algo,
                             "'");
    if (a.model.num_kv_heads != tp)
      return InvalidArgument("--use-ulysses-allgather-kv all-gathers one key/value head per TP rank (as MindSpeed): "
                             "expected --num-query-groups = --tensor-model-parallel-size ", tp, ", found ",
                             a.model.num_kv_heads, " query groups");
  }
  if (par.sequence_parallel && (S / cp) % tp != 0)
    return InvalidArgument("--seq-length ", S, " / --context-parallel-size ", cp, " = ", S / cp,
                           " must be divisible by --tensor-model-parallel-size ", tp, " with --sequence-parallel");
  return Status::Ok();
}

// MindSpeed's options of ring attention: the double ring (--cp-window-size) and the key/value cache
// (--context-parallel-kv-cache-policy, --context-parallel-cache-interval), after
// validate_context_parallel. Both need a ring: megatron_cp_algo with --cp-comm-type p2p, or the
// ring sub-groups of hybrid_cp_algo.
Status validate_ring_options(const Arguments& a) {
  const ParallelArgs& par = a.parallel;
  const std::string& algo = par.context_parallel_algo;
  const int64_t cp = par.context_parallel_size, W = par.cp_window_size, k = par.context_parallel_cache_interval;
  const bool hybrid = algo == "hybrid_cp_algo";
  const bool ring = cp > 1 && (hybrid || ((algo == "megatron_cp_algo" || algo == "adaptive_cp_algo") &&
                                          par.cp_comm_type == "p2p"));
  const std::string needs = "ring attention (--context-parallel-size > 1 with megatron_cp_algo and --cp-comm-type "
                            "p2p, or hybrid_cp_algo)";
  const std::string found = cp == 1                     ? std::string("--context-parallel-size 1")
                            : algo == "megatron_cp_algo" ? "--cp-comm-type " + par.cp_comm_type
                                                         : "--context-parallel-algo " + algo;
  if (W < 1) return InvalidArgument("--cp-window-size: expected a positive integer, found ", W);
  if (W > 1) {
    if (!ring) return InvalidArgument("--cp-window-size ", W, " applies to ", needs, ", found ", found);
    const int64_t R = hybrid ? cp / par.ulysses_degree_in_cp : cp;
    if (W >= R || R % W != 0)
      return InvalidArgument("--cp-window-size ", W, ": expected W < ",
                             hybrid ? "the ring degree --context-parallel-size / --ulysses-degree-in-cp = "
                                    : "--context-parallel-size ",
                             R, " and dividing it (windows of W ranks), found ", W);
  }
  const std::string& policy = par.context_parallel_kv_cache_policy;
  if (!policy.empty() && !ring)
    return InvalidArgument("--context-parallel-kv-cache-policy ", policy, " keeps the key/value blocks of ", needs,
                           ", found ", found);
  if (k < 0) return InvalidArgument("--context-parallel-cache-interval: expected a non-negative integer, found ", k);
  if (k > 0 && policy.empty())
    return InvalidArgument("--context-parallel-cache-interval ", k,
                           " needs --context-parallel-kv-cache-policy full or half, found none");
  if (k > 0 && k >= a.model.num_layers)
    return InvalidArgument("--context-parallel-cache-interval ", k, ": expected less than --num-layers ",
                           a.model.num_layers);
  return Status::Ok();
}

// The TP split of the heads, query groups and FFN columns: divisible by TP (Megatron), or with
// MindSpeed's --unaligned-linear dealt out unevenly in whole query groups (model/layer_shares.h)
// for the model kinds that support it.
Status validate_tensor_parallel_split(const Arguments& a) {
  const ModelArgs& m = a.model;
  const int64_t tp = a.parallel.tensor_model_parallel_size;
  const char* groups_flag = m.num_kv_heads == m.num_attention_heads ? "--num-attention-heads " : "--num-query-groups ";
  if (!a.parallel.unaligned_linear) {
    const char* hint = " (or give --unaligned-linear)";
    if (m.num_attention_heads % tp != 0)
      return InvalidArgument("--num-attention-heads ", m.num_attention_heads,
                             " must be divisible by --tensor-model-parallel-size ", tp, hint);
    if (m.num_kv_heads % tp != 0)
      return InvalidArgument(groups_flag, m.num_kv_heads, " must be divisible by --tensor-model-parallel-size ", tp,
                             hint);
    if (m.ffn_hidden_size % tp != 0)
      return InvalidArgument("--ffn-hidden-size ", m.ffn_hidden_size,
                             " must be divisible by --tensor-model-parallel-size ", tp, hint);
    return Status::Ok();
  }
  // MindSpeed's rules (UnalignedLinearFeature: no MoE) and what Gale's uneven split does not cover.
  if (a.moe.num_experts > 0)
    return InvalidArgument("--unaligned-linear does not support MoE models: found --num-experts ", a.moe.num_experts);
  if (m.multi_latent_attention)
    return InvalidArgument("--unaligned-linear does not support --multi-latent-attention");
  if (a.lora.enabled())
    return InvalidArgument("--unaligned-linear does not support LoRA: found --lora-target-modules");
  if (m.mtp_num_layers > 0 && m.hidden_size % tp != 0)
    return InvalidArgument("--unaligned-linear with --mtp-num-layers needs --hidden-size ", m.hidden_size,
                           " divisible by --tensor-model-parallel-size ", tp, " (the MTP projection splits it evenly)");
  if (m.num_kv_heads < tp)
    return InvalidArgument("--unaligned-linear keeps every query group whole on one rank: ", groups_flag,
                           m.num_kv_heads, " must be at least --tensor-model-parallel-size ", tp,
                           " (a rank would hold no heads)");
  if (m.ffn_hidden_size < tp)
    return InvalidArgument("--unaligned-linear: --ffn-hidden-size ", m.ffn_hidden_size,
                           " must be at least --tensor-model-parallel-size ", tp);
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<std::vector<int64_t>>> parse_num_layer_list(const std::string& text, const char* flag) {
  std::vector<int64_t> counts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    const size_t digits = !item.empty() && item[0] == '-' ? 1 : 0;
    if (item.size() <= digits || item.size() > digits + 9 ||
        item.find_first_not_of("0123456789", digits) != std::string::npos)
      return InvalidArgument(flag, ": expected comma-separated layer counts such as 4,6,6,4, found \"", item,
                             "\" in \"", text, "\"");
    const int64_t n = std::strtoll(item.c_str(), nullptr, 10);
    counts.push_back(n);
    start = comma + 1;
  }
  std::vector<std::vector<int64_t>> rows;
  for (int64_t n : counts) rows.push_back({n});
  return rows;
}

namespace {

// Reads MindSpeed's nested lists: outer := '[' row {',' row} ']'; row := '[' count {',' count} ']'
// ['*' n]; count := integer ['*' n]. Blanks are ignored.
class NestedLayerLists {
 public:
  explicit NestedLayerLists(const std::string& text) : text_(text) {}

  StatusOr<std::vector<std::vector<int64_t>>> read() {
    std::vector<std::vector<int64_t>> rows;
    GALE_RETURN_IF_ERROR(expect('['));
    if (peek() == ']') return error("an empty list");
    while (true) {
      if (peek() != '[') return error(peek() == '\0' ? "the end" : "a count outside a row");
      ++pos_;
      std::vector<int64_t> row;
      if (peek() == ']') return error("an empty row");
      while (true) {
        if (peek() == '[') return error("a list nested inside a row");
        StatusOr<int64_t> count = integer();
        if (!count.ok()) return count.status();
        StatusOr<int64_t> times = repeat();
        if (!times.ok()) return times.status();
        row.insert(row.end(), static_cast<size_t>(*times), *count);
        if (static_cast<int64_t>(row.size()) > kMaxRepeat) return error("a row of more than " + std::to_string(kMaxRepeat) + " counts");
        if (peek() == ']') break;
        GALE_RETURN_IF_ERROR(expect(','));
      }
      ++pos_;
      StatusOr<int64_t> times = repeat();
      if (!times.ok()) return times.status();
      rows.insert(rows.end(), static_cast<size_t>(*times), row);
      if (static_cast<int64_t>(rows.size()) > kMaxRepeat) return error("more than " + std::to_string(kMaxRepeat) + " rows");
      if (peek() == ']') break;
      GALE_RETURN_IF_ERROR(expect(','));
    }
    ++pos_;
    if (peek() != '\0') return error("text after the closing ]");
    return rows;
  }

 private:
  char peek() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  Status error(const std::string& what) const {
    return InvalidArgument("--pipeline-num-transformer-layers: expected nested lists such as [[0,1],[1,1]*2,[3,0]] "
                           "(one row of counts per pipeline rank), found \"", text_, "\" (", what, " at character ",
                           std::min(pos_, text_.size()) + 1, ")");
  }
  Status expect(char c) {
    const char found = peek();
    if (found == c) {
      ++pos_;
      return Status::Ok();
    }
    return error(found == '\0' ? "the end" : std::string("'") + found + "'");
  }
  StatusOr<int64_t> integer() {
    peek();
    const size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    const size_t digits = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    if (pos_ == digits || pos_ - digits > 9) {
      pos_ = start;
      return error(peek() == '\0' ? "the end" : std::string("'") + peek() + "' where a count belongs");
    }
    return static_cast<int64_t>(std::strtoll(text_.c_str() + start, nullptr, 10));
  }
  // An optional '*' n (n >= 1): how many times the element before it stands.
  StatusOr<int64_t> repeat() {
    if (peek() != '*') return int64_t{1};
    ++pos_;
    StatusOr<int64_t> n = integer();
    if (!n.ok()) return n.status();
    if (*n < 1 || *n > kMaxRepeat)
      return error("repeat count " + std::to_string(*n) + " (expected 1 to " + std::to_string(kMaxRepeat) + ")");
    return n;
  }

  static constexpr int64_t kMaxRepeat = 65536;  // bounds rows, counts per row and repeats (sums stay in range)
  const std::string& text_;
  size_t pos_ = 0;
};

}  // namespace

StatusOr<std::vector<std::vector<int64_t>>> parse_pipeline_num_transformer_layers(const std::string& text) {
  return NestedLayerLists(text).read();
}

Status validate_parallel_args(Arguments& a, const ArgParser& p, int64_t world_size) {
  ParallelArgs& par = a.parallel;
  const ModelArgs& m = a.model;
  par.world_size = world_size;
  GALE_RETURN_IF_ERROR(positive(par.tensor_model_parallel_size, "--tensor-model-parallel-size"));
  GALE_RETURN_IF_ERROR(positive(par.pipeline_model_parallel_size, "--pipeline-model-parallel-size"));
  GALE_RETURN_IF_ERROR(positive(par.context_parallel_size, "--context-parallel-size"));
  GALE_RETURN_IF_ERROR(positive(par.expert_model_parallel_size, "--expert-model-parallel-size"));
  GALE_RETURN_IF_ERROR(positive(par.distributed_timeout_minutes, "--distributed-timeout-minutes"));
  if (par.ddp_bucket_size != kUnset) GALE_RETURN_IF_ERROR(positive(par.ddp_bucket_size, "--ddp-bucket-size"));
  if (par.ddp_num_buckets != kUnset) {  // Megatron's get_model
    if (par.ddp_bucket_size != kUnset)
      return InvalidArgument("--ddp-num-buckets and --ddp-bucket-size cannot both be given: expected one, found ",
                             "--ddp-num-buckets ", par.ddp_num_buckets, " and --ddp-bucket-size ",
                             par.ddp_bucket_size);
    GALE_RETURN_IF_ERROR(positive(par.ddp_num_buckets, "--ddp-num-buckets"));
  }
  int64_t model_parallel =
      par.tensor_model_parallel_size * par.pipeline_model_parallel_size * par.context_parallel_size;
  if (world_size % model_parallel != 0)
    return InvalidArgument("world size ", world_size, " is not divisible by --tensor-model-parallel-size ",
                           par.tensor_model_parallel_size, " x --pipeline-model-parallel-size ",
                           par.pipeline_model_parallel_size, " x --context-parallel-size ", par.context_parallel_size,
                           " = ", model_parallel);
  par.data_parallel_size = world_size / model_parallel;
  GALE_RETURN_IF_ERROR(resolve_custom_fsdp(a));
  GALE_RETURN_IF_ERROR(validate_distributed_optimizer_instances(par));
  const std::string requested_comm =
      par.cp_comm_type_list.empty() ? par.cp_comm_type : par.cp_comm_type_list.front();
  GALE_RETURN_IF_ERROR(resolve_cp_comm_type(a));
  resolve_adaptive_cp(par);
  GALE_RETURN_IF_ERROR(validate_context_parallel(a, requested_comm));
  GALE_RETURN_IF_ERROR(validate_ring_options(a));
  const int64_t ep = par.expert_model_parallel_size;
  if (ep > 1) {  // the expert generator: world = ETP·EP·expert-DP·PP (ETP: compute_rank_layout checks it)
    const int64_t epp = ep * par.pipeline_model_parallel_size;
    if (world_size % epp != 0)
      return InvalidArgument("world size ", world_size, " is not divisible by --expert-model-parallel-size ", ep,
                             " x --pipeline-model-parallel-size ", par.pipeline_model_parallel_size, " = ", epp);
  }
  int64_t tp = par.tensor_model_parallel_size;
  GALE_RETURN_IF_ERROR(validate_tp2d(a));
  GALE_RETURN_IF_ERROR(validate_tensor_parallel_split(a));
  if (par.sequence_parallel && tp == 1) {
    warn_rank0("--sequence-parallel has no effect with --tensor-model-parallel-size 1; disabled");  // as Megatron
    par.sequence_parallel = false;
  }
  // Kept with --unaligned-linear: Gale splits the sequence evenly (MindSpeed also deals it out
  // unevenly there, which Gale does not implement).
  if (par.sequence_parallel && m.seq_length % tp != 0)
    return InvalidArgument("--seq-length ", m.seq_length, " must be divisible by --tensor-model-parallel-size ", tp,
                           " with --sequence-parallel",
                           par.unaligned_linear ? " (--unaligned-linear splits heads and FFN unevenly, not the sequence)"
                                                : "");
  if (m.distribute_saved_activations) {  // Megatron's checks
    if (tp == 1)
      return InvalidArgument("--distribute-saved-activations distributes over tensor-parallel ranks: expected "
                             "--tensor-model-parallel-size > 1, found 1");
    if (m.recompute_granularity != "full")
      return InvalidArgument("--distribute-saved-activations applies to --recompute-granularity full, found ",
                             m.recompute_granularity.empty() ? "none" : m.recompute_granularity);
    if (par.sequence_parallel)
      return InvalidArgument("--distribute-saved-activations must be off with --sequence-parallel (the saved inputs "
                             "are already split)");
  }
  if (par.overlap_param_gather && !(par.use_distributed_optimizer && par.overlap_grad_reduce))
    return InvalidArgument("--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce");
  GALE_RETURN_IF_ERROR(validate_dualpipev(par, m, /*split_done=*/false));
  GALE_RETURN_IF_ERROR(validate_pipeline_split(par, m));
  GALE_RETURN_IF_ERROR(validate_dualpipev(par, m, /*split_done=*/true));
  if (par.overlap_param_gather_with_optimizer_step) {  // Megatron's validate_args
    if (!par.use_distributed_optimizer)
      return InvalidArgument("--overlap-param-gather-with-optimizer-step is only supported with the distributed "
                             "optimizer: expected --use-distributed-optimizer");
    if (!par.overlap_param_gather)
      return InvalidArgument("--overlap-param-gather-with-optimizer-step needs --overlap-param-gather");
    if (par.num_layers_per_virtual_pipeline_stage == kUnset && par.num_virtual_stages_per_pipeline_rank == kUnset)
      return InvalidArgument("--overlap-param-gather-with-optimizer-step is only supported with interleaved pipeline "
                             "parallelism: expected --num-layers-per-virtual-pipeline-stage or "
                             "--num-virtual-stages-per-pipeline-rank");
  }
  GALE_RETURN_IF_ERROR(validate_interleaved_microbatches(a));
  GALE_RETURN_IF_ERROR(validate_dualpipev_microbatches(a));
  GALE_RETURN_IF_ERROR(validate_dualpipev_dw_detach(a));
  (void)p;
  return Status::Ok();
}

}  // namespace gale
