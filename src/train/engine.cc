// Engine construction: rank layout, model chunks, optimizer and scheduler.
#include "train/engine.h"
#include "train/data_parallel_random_init.h"
#include "core/log.h"
#include "train/ddp_precision.h"
#include "train/expert_placer.h"
#include "train/fsdp2_config.h"

#include <algorithm>
#include <cmath>

#include "optim/layer_wise.h"
#include "train/model_setup.h"
#include "train/mup.h"

namespace gale {

std::vector<GPTModel*> Engine::chunk_pointers() const {
  std::vector<GPTModel*> out;
  for (const auto& c : chunks) out.push_back(c.get());
  return out;
}

std::vector<std::vector<int64_t>> pipeline_layer_counts(const Arguments& args) {
  const ParallelArgs& par = args.parallel;
  if (!par.pipeline_layers.empty()) return par.pipeline_layers;
  const int64_t L = args.model.num_layers, pp = par.pipeline_model_parallel_size;
  const int64_t vpp = std::max<int64_t>(1, par.virtual_pipeline_model_parallel_size);
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(pp), std::vector<int64_t>(static_cast<size_t>(vpp)));
  const int64_t embedding = par.account_for_embedding_in_pipeline_split ? 1 : 0;
  const int64_t loss = par.account_for_loss_in_pipeline_split ? 1 : 0;
  if (embedding + loss > 0) {
    // L + embedding + loss slots split evenly over the P·V virtual stages; the embedding takes a
    // slot of the very first (chunk 0 of rank 0), the loss one of the very last (chunk V-1 of the
    // last rank).
    const int64_t per_chunk = (L + embedding + loss) / pp / vpp;
    for (auto& row : counts) std::fill(row.begin(), row.end(), per_chunk);
    counts.front().front() -= embedding;
    counts.back().back() -= loss;
    return counts;
  }
  // Layers of each pipeline stage: the first/last flags, the rest even over the middle stages.
  const bool first = par.decoder_first_pipeline_num_layers != kUnset;
  const bool last = par.decoder_last_pipeline_num_layers != kUnset && pp > 1;
  const int64_t middle_stages = pp - (first ? 1 : 0) - (last ? 1 : 0);
  const int64_t middle_layers =
      L - (first ? par.decoder_first_pipeline_num_layers : 0) - (last ? par.decoder_last_pipeline_num_layers : 0);
  for (int64_t s = 0; s < pp; ++s) {
    int64_t stage = middle_stages > 0 ? middle_layers / middle_stages : 0;
    if (s == 0 && first) stage = par.decoder_first_pipeline_num_layers;
    if (s == pp - 1 && last) stage = par.decoder_last_pipeline_num_layers;
    std::fill(counts[static_cast<size_t>(s)].begin(), counts[static_cast<size_t>(s)].end(), stage / vpp);
  }
  return counts;
}

bool uses_dualpipev(const Arguments& args) { return args.parallel.schedules_method == "dualpipev"; }

int64_t virtual_stage_of(const Arguments& args, int64_t pp_rank, int64_t vp) {
  const int64_t pp = args.parallel.pipeline_model_parallel_size;
  if (uses_dualpipev(args)) return vp == 0 ? pp_rank : 2 * pp - 1 - pp_rank;
  return vp * pp + pp_rank;
}

std::pair<int64_t, int64_t> chunk_layers(const Arguments& args, int64_t pp_rank, int64_t vp) {
  const std::vector<std::vector<int64_t>> counts = pipeline_layer_counts(args);
  const int64_t stage = virtual_stage_of(args, pp_rank, vp);
  int64_t offset = 0;  // the layers of the virtual stages before (pp_rank, vp)
  for (size_t s = 0; s < counts.size(); ++s)
    for (size_t c = 0; c < counts[s].size(); ++c)
      if (virtual_stage_of(args, static_cast<int64_t>(s), static_cast<int64_t>(c)) < stage) offset += counts[s][c];
  return {offset, counts.at(static_cast<size_t>(pp_rank)).at(static_cast<size_t>(vp))};
}

int64_t configured_ddp_bucket_size(const ParallelArgs& par, int64_t num_parameters) {
  if (par.ddp_bucket_size != kUnset) return par.ddp_bucket_size;
  if (par.ddp_num_buckets != kUnset) return std::max<int64_t>(1, num_parameters / par.ddp_num_buckets);
  return 0;
}

ModelPartition chunk_partition(const Arguments& args, const ParallelState& ps, int64_t vp,
                               const HybridCpGroups& hybrid, const Tp2dGroups& tp2d) {
  const int64_t vpp = std::max<int64_t>(1, args.parallel.virtual_pipeline_model_parallel_size);
  ModelPartition p;
  p.tp = ps.tp();
  p.sequence_parallel = args.parallel.sequence_parallel;
  p.cp = ps.cp();
  p.cp_ulysses = args.parallel.context_parallel_algo == "ulysses_cp_algo";
  p.cp_ulysses_allgather_kv = p.cp_ulysses && args.parallel.use_ulysses_allgather_kv;
  p.cp_hybrid = hybrid;
  p.tp_x = tp2d.x;
  p.tp_y = tp2d.y;
  p.cp_ring = !p.cp_ulysses && !p.hybrid_cp() && args.parallel.cp_comm_type == "p2p";
  p.cp_adaptive = (p.cp_ring || p.hybrid_cp()) && args.parallel.adaptive_cp;
  p.cp_window = args.parallel.cp_window_size;
  const std::string& policy = args.parallel.context_parallel_kv_cache_policy;
  p.cp_kv_cache = policy == "full" ? RingKvCache::kFull : policy == "half" ? RingKvCache::kHalf : RingKvCache::kNone;
  p.cp_cache_interval = args.parallel.context_parallel_cache_interval;
  if (ps.layout().sizes.ep > 1) {
    p.ep = ps.expert();
    p.ep_allgather = args.moe.moe_token_dispatcher_type == "allgather";
  }
  if (args.moe.num_experts > 0) {
    if (ps.layout().sizes.etp > 1) p.etp = ps.expert_tp();
    if (ps.tp_size() * ps.cp_size() > 1) p.moe_seq = ps.group(Group::kTensorContext);
    if (args.moe.uses_load_balancing_type("global_aux_loss") && ps.group(Group::kTensorDataContext) &&
        ps.group(Group::kTensorDataContext)->size() > 1)
      p.moe_global_aux = ps.group(Group::kTensorDataContext);
  }
  auto [first, count] = chunk_layers(args, ps.coords().pp, vp);
  p.first_layer = first;
  p.num_layers = count;
  p.pre_process = ps.is_pipeline_first_stage() && vp == 0;
  p.post_process = ps.is_pipeline_last_stage() && vp == vpp - 1;
  if (uses_dualpipev(args)) {  // the V: rank 0 holds the first stage (chunk 0) and the last (chunk 1)
    p.pre_process = ps.is_pipeline_first_stage() && vp == 0;
    p.post_process = ps.is_pipeline_first_stage() && vp == 1;
  }
  return p;
}

// --quant-grads (optim/quant_grads.h): the parameters whose f32 gradient must outlive their drain
// unit: the tied word embedding (the LM head adds its weight gradient before the layers, the
// embedding after them), the embedding group's copies and the sequence-parallel parameters (summed
// in f32 after the data-parallel reduction), and with MTP layers the embedding (they read it in
// the head's backward).
std::vector<int> quant_grads_resident(const GPTModel& model) {
  std::vector<int> ids;
  // A chunk holding both ends (one pipeline stage) sums nothing over the embedding group.
  if (!(model.partition().pre_process && model.partition().post_process)) ids = model.embedding_group_param_ids();
  if (model.output_weight_id() >= 0 && model.output_weight_id() == model.word_embedding_id())
    ids.push_back(model.output_weight_id());
  // The MTP layers (run with the head) embed the rolled ids with the embedding's weights.
  if (model.config().mtp_num_layers > 0)
    for (int id : {model.word_embedding_id(), model.position_embedding_id()})
      if (id >= 0) ids.push_back(id);
  for (int id = 0; id < model.params().size(); ++id)
    if (model.params().spec(id).sequence_parallel) ids.push_back(id);
  return ids;
}

std::vector<bool> norm_counting(const GPTModel& model) {
  const ParamBuffer& pb = model.params();
  std::vector<bool> counts(static_cast<size_t>(pb.size()), true);
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    // A parameter whole on every rank of its tensor-parallel group counts on that group's rank 0;
    // for expert-parallel experts the group is expert-TP (under --expert-tensor-parallel-size 1
    // with EP the TP ranks hold different experts, all counted).
    const ModelPartition& part = model.partition();
    const int64_t tp_rank = s.expert_parallel ? (part.etp ? part.etp->rank() : 0) : part.tp_rank();
    const bool tp_replica = s.split_dim < 0 && tp_rank != 0;
    counts[static_cast<size_t>(id)] = !tp_replica;
  }
  // The last stage's copies of the first stage's embedding (tied output weight, MTP) do not count:
  // the first stage's do.
  if (!model.partition().pre_process)
    for (int id : model.embedding_group_param_ids()) counts[static_cast<size_t>(id)] = false;
  return counts;
}

ParallelSizes parallel_sizes_from_args(const Arguments& args, int64_t world_size) {
  ParallelSizes sizes;
  sizes.world_size = static_cast<int>(world_size);
  sizes.tp = static_cast<int>(args.parallel.tensor_model_parallel_size);
  sizes.pp = static_cast<int>(args.parallel.pipeline_model_parallel_size);
  sizes.cp = static_cast<int>(args.parallel.context_parallel_size);
  sizes.ep = static_cast<int>(expert_grid_ep_size(args));  // TP x EP under --moe-tp-extend-ep
  if (args.moe.num_experts > 0 && args.moe.expert_tensor_parallel_size > 0)
    sizes.etp = static_cast<int>(args.moe.expert_tensor_parallel_size);
  sizes.use_tp_pp_dp_mapping = args.parallel.use_tp_pp_dp_mapping;
  return sizes;
}

std::vector<bool> qk_layernorm_weight_decay(const GPTModel& model) {
  const ParamBuffer& pb = model.params();
  std::vector<bool> out;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    const bool qk_norm =
        s.name.find("q_layernorm.") != std::string::npos || s.name.find("k_layernorm.") != std::string::npos;
    out.push_back(s.weight_decay || qk_norm);
  }
  return out;
}

// Megatron's _is_muon_excluded: is_embedding_or_output_parameter or not 2-D; it tags every 2-D
// `linear_qkv.weight` for the QKV split, and the MoE experts' weights (`.mlp.experts.`, each expert a
// matrix of its own) as split over the expert-tensor-parallel group.
void set_muon_params(const GPTModel& model, OptimizedBuffer* buffer) {
  const ParamBuffer& pb = model.params();
  const size_t n = static_cast<size_t>(pb.size());
  buffer->muon.assign(n, false);
  buffer->qkv_split.assign(n, {});
  buffer->expert_tp.assign(n, false);
  const ModelConfig& c = model.config();
  const std::string qkv = "linear_qkv.weight";
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    if (!s.trainable || s.global_shape.size() != 2 || id == model.word_embedding_id() ||
        id == model.output_weight_id())
      continue;
    buffer->muon[static_cast<size_t>(id)] = true;
    buffer->expert_tp[static_cast<size_t>(id)] = s.name.find(".mlp.experts.") != std::string::npos;
    const bool is_qkv = s.name.size() >= qkv.size() && s.name.compare(s.name.size() - qkv.size(), qkv.size(), qkv) == 0;
    // The layer's query groups from its rows (NH + 2·KV)·HD: heterogeneous layers have their own.
    const int64_t kv = c.head_dim > 0 ? (s.global_shape[0] / c.head_dim - c.heads) / 2 : 0;
    if (is_qkv && kv > 0 && c.heads % kv == 0)
      buffer->qkv_split[static_cast<size_t>(id)] = {c.heads / kv * c.head_dim, c.head_dim, c.head_dim};
  }
}

// Megatron's µP embedding class: the embedding module's parameters and the output layer's weight.
void set_mup_params(const GPTModel& model, const Arguments& args, OptimizedBuffer* buffer) {
  if (!args.model.use_mup) return;
  const ParamBuffer& pb = model.params();
  std::vector<bool> embedding(static_cast<size_t>(pb.size()), false);
  for (int id = 0; id < pb.size(); ++id)
    embedding[static_cast<size_t>(id)] = pb.spec(id).name.rfind("embedding.", 0) == 0 || id == model.output_weight_id();
  const bool muon = args.training.optimizer.find("muon") != std::string::npos;
  MupParamOverrides o = mup_param_overrides(pb, args.training.optimizer, model.config().mup.width_mult, embedding,
                                            muon ? buffer->muon : std::vector<bool>{}, buffer->decoupled_lr);
  buffer->mup_lr = std::move(o.lr);
  buffer->mup_eps = std::move(o.eps);
}

StatusOr<std::unique_ptr<Engine>> build_engine(const Arguments& args, const Comm& world, const OpTable& ops,
                                               const EngineOptions& options) {
  auto engine = std::make_unique<Engine>();
  if (args.parallel.dist_train) {
    // --dist-train: this rank's sub-world grid, with the pipeline across the sub-worlds (collective
    // over the job); validated arguments refused what it does not support.
    if (args.parallel.optimize_send_recv_comm || args.parallel.use_multiparameter_pipeline_model_parallel)
      return Unimplemented("--dist-train with ",
                           args.parallel.optimize_send_recv_comm ? "--optimize-send-recv-comm"
                                                                 : "--use-multiparameter-pipeline-model-parallel",
                           ": not supported yet");
    GALE_CHECK_EQ(args.parallel.dist_train_layout.subworld_of(world->rank()), args.parallel.dist_train_subworld)
        << "dist-train arguments validated for another rank";
    engine->ps = ParallelState::create_dist_train(world, args.parallel.dist_train_layout, args.model.hidden_size,
                                                  args.training.micro_batch_size);
  } else {
    GALE_ASSIGN_OR_RETURN(RankLayout layout, compute_rank_layout(parallel_sizes_from_args(args, world->size())));
    engine->ps = world->size() == 1 ? ParallelState() : ParallelState::create(world, layout);
  }
  engine->ops = ops;
  engine->dualpipev = uses_dualpipev(args);
  engine->dualpipev_dw_detach = engine->dualpipev && args.parallel.dualpipev_dw_detach;
  engine->ripipe = args.model.recompute_in_advance  ? RiPipe::kAdvance
                   : args.model.recompute_in_bubble ? RiPipe::kBubble
                                                    : RiPipe::kNone;
  ModelConfig config = model_config_from_args(args);
  config.recompute = options.recompute;
  config.frozen_layers = args.parallel.dist_train ? args.parallel.dist_train_layout.frozen_layers() : options.frozen_layers;
  const int64_t vpp = std::max<int64_t>(1, args.parallel.virtual_pipeline_model_parallel_size);
  if (args.parallel.optimize_send_recv_comm && engine->ps.pp_size() > 1) {
    if (vpp > 1 || engine->dualpipev)
      return InvalidArgument("--optimize-send-recv-comm applies to the 1F1B schedule without interleaving (as "
                             "MindSpeed's), found ",
                             engine->dualpipev ? "--schedules-method dualpipev" : str_cat(vpp, " model chunks per rank"));
    // Every member passes the whole group: a duplicate of the pipeline group (collective over it).
    engine->pp_backward = engine->ps.pp()->make_group(engine->ps.pp()->world_ranks(), "pp-backward");
  }
  if (args.parallel.use_multiparameter_pipeline_model_parallel && engine->ps.pp_size() > 1) {
    if (engine->dualpipev)
      return InvalidArgument("--use-multiparameter-pipeline-model-parallel applies to the 1F1B and interleaved 1F1B "
                             "schedules (as MindSpeed's), found --schedules-method dualpipev");
    if (engine->ps.cp_size() > 1 && args.data.document_attention())
      return Unimplemented("--use-multiparameter-pipeline-model-parallel with --context-parallel-size ",
                           engine->ps.cp_size(),
                           " and ",
                           args.data.sft                                ? "--sft"
                           : args.data.dataloader_inter_document_masking ? "--dataloader-inter-document-masking"
                                                                       : "--reset-attention-mask",
                           ": not supported yet (the keys' document ids of the whole "
                           "sequences would have to travel with the hidden states)");
    engine->stage_tensors = std::make_unique<StageTensors>();
    engine->stage_tensors->document_ids = args.data.document_attention();
  }
  const ParallelArgs& par = args.parallel;
  const Comm& dp = engine->ps.dp_cp();
  // Megatron's partial distributed optimizer: shards inside an instance, replicas across them.
  const int64_t instances = par.num_distributed_optimizer_instances;
  if (instances > 1) {
    if (!par.use_distributed_optimizer || dp->size() % instances != 0)
      return InvalidArgument("--num-distributed-optimizer-instances ", instances,
                             ": expected --use-distributed-optimizer and a divisor of the dp-cp size ", dp->size());
    engine->distopt_instances = make_distopt_instance_groups(dp, instances);
  }
  const Comm& shard_dp = instances > 1 ? engine->distopt_instances.intra : dp;
  // --optimizer muon (or lion) --use-distributed-optimizer: Megatron's layer-wise distributed
  // optimizer for its emerging optimizers (optim/layer_wise.h): gradients all-reduced, whole
  // parameters owned, gathered by the optimizer.
  const bool emerging = args.training.optimizer == "muon" || args.training.optimizer == "lion";
  const bool layer_wise = par.use_distributed_optimizer && emerging;
  const bool element_wise = par.use_distributed_optimizer && !layer_wise;
  std::vector<OptimizedBuffer> buffers;
  // hybrid_cp_algo: the Ulysses and ring sub-groups of the cp group, shared by every chunk.
  if (par.context_parallel_algo == "hybrid_cp_algo" && engine->ps.cp_size() > 1)
    engine->cp_hybrid = make_hybrid_cp_groups(engine->ps.cp(), par.ulysses_degree_in_cp);
  // adaptive_cp_algo (hybrid_adaptive_cp_algo): the layouts of the ring (of the ring sub-groups).
  if (par.adaptive_cp && engine->ps.cp_size() > 1)
    engine->adaptive_cp = std::make_unique<AdaptiveCpPlanner>(
        engine->cp_hybrid.ring ? engine->cp_hybrid.ring_degree() : engine->ps.cp_size(),
        AdaptiveCpOptions{!par.adaptive_cp_only_reschedule, !par.adaptive_cp_without_coarse},
        par.adaptive_cp_dynamic_attn_mask);
  if (par.tp_2d) engine->tp2d = make_tp2d_groups(engine->ps.tp(), par.tp_x);  // collective over TP
  // Every chunk first: --ddp-num-buckets divides the parameters of all of them.
  std::vector<std::unique_ptr<GPTModel>> models;
  int64_t num_parameters = 0;
  // --balanced-moe-experts: M duplicates of the EP group for the hot experts' transfers (collective over EP)
  std::vector<Comm> ep_hot_groups;
  if (engine->ops.moe_hot_experts > 0 && engine->ps.layout().sizes.ep > 1) {
    const Comm& ep = engine->ps.expert();
    for (int64_t i = 0; i < std::max<int64_t>(1, engine->ops.moe_hot_expert_groups); ++i)
      ep_hot_groups.push_back(ep->make_group(ep->world_ranks(), str_cat(ep->name(), "-hot", i)));
  }
  for (int64_t vp = 0; vp < vpp; ++vp) {
    config.full_recompute.chunk = vp;  // --enable-recompute-layers-per-pp-rank
    config.full_recompute.rank_chunks = vpp;
    if (!par.recompute_layers_per_stage.empty()) {  // --automated-pipeline's policy: this stage's first k layers
      config.full_recompute.method = FullRecompute::Method::kBlock;
      config.full_recompute.num_layers = par.recompute_layers_per_stage.at(static_cast<size_t>(engine->ps.coords().pp));
      config.full_recompute.per_pp_rank = false;
    }
    ModelPartition part = chunk_partition(args, engine->ps, vp, engine->cp_hybrid, engine->tp2d);
    part.ep_hot_groups = ep_hot_groups;
    models.push_back(std::make_unique<GPTModel>(config, std::move(part), &engine->ops));
    if (args.training.data_parallel_random_init) {  // --data-parallel-random-init (train/data_parallel_random_init.h)
      models.back()->params().initialize(data_parallel_init_seed(config.seed, engine->ps.coords().dp));
      broadcast_params_from_data_parallel_rank0(models.back()->params(), engine->ps.dp_cp(), engine->ps.expert_dp());
    } else {
      models.back()->params().initialize(config.seed);
    }
    models.back()->set_per_token_loss(args.training.calculate_per_token_loss);
    if (args.training.swap_attention || args.training.swap_layer_input)
      models.back()->set_swap_attention(swap_attention_config_from_args(args));
    if (!args.training.compress_activation.empty() || args.training.compress_dense != "disable")
      models.back()->set_activation_compress(activation_compress_config_from_args(args));
    num_parameters += models.back()->params().numel();
  }
  const int64_t configured_bucket_size = configured_ddp_bucket_size(par, num_parameters);
  // --create-all-gather-group: duplicates of the (instance's) dp-cp group and of the expert-dp group
  // for the parameter all-gathers (Megatron's dp_cp_ag, expt_dp_ag); collective over each group.
  Comm all_gather_group, expert_all_gather_group;
  if (par.create_all_gather_group && element_wise && !par.zero2() && !par.zero3()) {
    all_gather_group = shard_dp->make_group(shard_dp->world_ranks(), str_cat(shard_dp->name(), "-ag"));
    if (engine->ps.layout().sizes.ep > 1) {
      const Comm& edp = engine->ps.expert_dp();
      expert_all_gather_group = edp->make_group(edp->world_ranks(), str_cat(edp->name(), "-ag"));
    }
  }
  for (int64_t vp = 0; vp < vpp; ++vp) {
    std::unique_ptr<GPTModel> model = std::move(models[static_cast<size_t>(vp)]);
    DataParallelConfig dc;
    // --calculate-per-token-loss: summed over DP, divided by the tokens after (finalize_model_grads).
    if (args.training.calculate_per_token_loss) dc.grad_scale = 1.0;
    // --dist-train: every sub-world averages over the loss sub-world's replicas (a sub-world of k
    // times the replicas holds slices of its micro-batches, whose gradients add up).
    if (par.dist_train && !args.training.calculate_per_token_loss)
      dc.grad_scale = 1.0 / par.dist_train_layout.subworlds.back().dp;
    dc.overlap_grad_reduce = par.overlap_grad_reduce;
    dc.use_distributed_optimizer = element_wise;
    dc.overlap_param_gather = par.overlap_param_gather;
    dc.reset_bucket_group_order = par.reset_bucket_group_order;
    dc.reduce_in_bf16 = args.training.bf16_grad_reduce();  // --grad-reduce-in-bf16, --main-grads-dtype bf16
    // Megatron's DDP precision flags (train/ddp_precision.h) and --create-all-gather-group.
    dc.reduce_scatter_with_fp32_accumulation = element_wise && reduce_scatter_with_fp32_accumulation(args);
    if (dc.reduce_in_bf16) {
      std::vector<std::string> matched;
      dc.fp32_local_accumulation = fp32_local_accumulation_params(
          model->params(), par.ddp_param_name_patterns_for_fp32_local_accumulation, &matched);
      // Megatron's log_on_each_pipeline_stage: the first tensor- and data-parallel rank of each stage.
      const RankCoords& at = engine->ps.coords();
      if (at.tp == 0 && at.dp == 0 && at.cp == 0)
        for (size_t i = 0; i < matched.size(); ++i)
          print_all(str_cat("Matched ", model->params().spec(dc.fp32_local_accumulation[i]).name, " with '",
                            matched[i], "'; promoting main_grad.type from torch.bfloat16 to torch.float32!"));
    }
    dc.all_gather_group = all_gather_group;
    if (par.param_and_grad_buffer_pad > 0)  // bytes of the f32 buffers, in elements
      dc.buffer_pad = par.param_and_grad_buffer_pad / static_cast<int64_t>(sizeof(float));
    dc.context_parallel_size = engine->ps.cp_size();
    if (instances > 1) {  // reduce-scatter over the instance, then all-reduce the shard across instances
      dc.inter_instance = engine->distopt_instances.inter;
      dc.context_parallel_size = 1;  // an instance need not hold whole cp groups; grad_scale says the factor
      if (dc.grad_scale == 0.0) dc.grad_scale = 1.0 / static_cast<double>(engine->ps.dp_size());  // CP/(DP·CP)
    }
    dc.bucket_size = chunk_bucket_size(par.overlap_grad_reduce, engine->ps.coords().pp, vp, dp->size(),
                                       options.ddp_bucket_size, configured_bucket_size);
    // Megatron: the first chunk, whose all-gather starts right after its update, gets one bucket.
    if (par.overlap_param_gather_with_optimizer_step && vp == 0) {
      dc.bucket_size = 0;
      dc.gather_right_after_step = true;
    }
    // Megatron: with the distributed optimizer the embedding shared by the first and last pipeline
    // stage gets a bucket of its own, so both stages shard it alike before its all-reduce.
    if (element_wise && engine->ps.pp_size() > 1)
      for (int shared : model->embedding_group_param_ids()) dc.separate_params.push_back(shared);
    const bool ep = engine->ps.layout().sizes.ep > 1;
    const ParamBuffer& pb = model->params();
    if (ep) dc.region = FlatRange{0, pb.dense_numel()};
    if (par.zero3() || par.zero2()) {  // no buckets: the model's hooks gather and reduce-scatter per layer
      std::vector<std::vector<int>> groups = model->backward_param_groups();
      const bool tied = model->word_embedding_id() >= 0 && model->word_embedding_id() == model->output_weight_id();
      Zero3Options zo;
      zo.shard_params = par.zero3();
      Comm shard_group = dp;
      if (par.layerzero && par.layerzero_zero3_size < dp->size()) {  // ZeRO-3 in sub-groups, ZeRO-1 over DP
        engine->layerzero_groups = make_distopt_instance_groups(dp, dp->size() / par.layerzero_zero3_size);
        shard_group = engine->layerzero_groups.intra;
        zo.replicas = engine->layerzero_groups.inter;
      }
      if (par.use_torch_fsdp2) {  // FSDP2 (train/fsdp2_config.h)
        if (par.fsdp2_sharding_size < dp->size()) {  // HSDP: ZeRO-3 in sub-groups, replicated across them
          engine->layerzero_groups = make_distopt_instance_groups(dp, dp->size() / par.fsdp2_sharding_size);
          shard_group = engine->layerzero_groups.intra;
          zo.replicas = engine->layerzero_groups.inter;
          zo.shard_optimizer_over_replicas = false;
          engine->zero3_optimizer_group = shard_group;
        }
        zo.reshard_after_forward = par.fsdp2_reshard_after_forward;
        zo.forward_prefetch = static_cast<int>(par.fsdp2_forward_prefetch);
        // Mixed precision (validated at start-up): param_dtype bf16 is the model's bf16 GEMM copy,
        // gathered per unit (model/params.h gathers_bf16); reduce_dtype here.
        StatusOr<Fsdp2Precision> precision = resolve_fsdp2_precision(args);
        GALE_CHECK(precision.ok()) << precision.status().message();
        zo.reduce_bf16 = precision.value().reduce_bf16;
        for (const std::vector<int>& g : groups) {  // the units not wrapped on their own: the root
          if (g.empty()) continue;
          const bool embedding = std::find(g.begin(), g.end(), model->word_embedding_id()) != g.end();
          const bool head = std::find(g.begin(), g.end(), model->output_weight_id()) != g.end();
          const bool wrapped = embedding ? par.fsdp2_wrap_embedding : head ? par.fsdp2_wrap_head : par.fsdp2_wrap_layers;
          if (!wrapped) zo.root_params.push_back(g.front());
        }
      }
      auto z = std::make_unique<Zero3Sync>(&model->params(), shard_group, groups,
                                           tied ? model->word_embedding_id() : -1, zo);
      Zero3Sync* zs = z.get();
      model->set_params_needed_fn([zs](const std::vector<int>& ids) { zs->on_params_needed(ids); });
      model->set_grad_ready_fn([zs](const std::vector<int>& ids) { zs->on_grads_ready(ids); });
      OptimizedBuffer buffer{&model->params(), norm_counting(*model), std::nullopt};
      if (!std::isnan(args.training.decoupled_lr)) {
        buffer.decoupled_lr.assign(static_cast<size_t>(model->params().size()), false);
        for (int id : {model->word_embedding_id(), model->output_weight_id()})
          if (id >= 0) buffer.decoupled_lr[static_cast<size_t>(id)] = true;
      }
      set_mup_params(*model, args, &buffer);
      buffer.owned = z->owned_ranges();
      buffers.push_back(std::move(buffer));
      engine->chunks.push_back(std::move(model));
      engine->zero3.push_back(std::move(z));
      continue;
    }
    auto sync = std::make_unique<DataParallelSync>(&model->params(), shard_dp, dc);
    std::unique_ptr<DataParallelSync> expert_sync;
    if (ep) {  // Megatron's expert-parallel buffers: reduced over expert-DP, scaled by 1/DP
      DataParallelConfig ec = dc;
      ec.region = FlatRange{pb.dense_numel(), pb.trainable_numel()};
      ec.separate_params.clear();
      ec.context_parallel_size = 1;  // CP is folded into expert-DP's ranks; grad_scale says the factor
      // Megatron: 1/(DP·CP) with the loss scaled by CP; Gale does not scale the loss by CP, so
      // 1/DP: each expert's gradient sums the EP group's tokens (CP ranks' chunks included), the
      // expert-DP sum covers the remaining replicas.
      // --calculate-per-token-loss: summed, divided by the tokens after (Megatron's factor 1).
      ec.grad_scale = args.training.calculate_per_token_loss ? 1.0 : 1.0 / static_cast<double>(engine->ps.dp_size());
      ec.all_gather_group = expert_all_gather_group;
      ec.bucket_size = chunk_bucket_size(par.overlap_grad_reduce, engine->ps.coords().pp, vp,
                                         engine->ps.expert_dp()->size(), options.ddp_bucket_size,
                                         configured_bucket_size);
      expert_sync = std::make_unique<DataParallelSync>(&model->params(), engine->ps.expert_dp(), ec);
    }
    DataParallelSync* s = sync.get();
    DataParallelSync* es = expert_sync.get();
    if (args.training.quant_grads) {  // validated: no overlap, no EP, one distributed-optimizer instance
      const double factor = dc.grad_scale > 0.0 ? dc.grad_scale
                                                 : static_cast<double>(dc.context_parallel_size) /
                                                       static_cast<double>(shard_dp ? shard_dp->size() : 1);
      auto store = std::make_unique<QuantGradStore>(&model->params(), s, model->backward_param_groups(),
                                                    quant_grads_resident(*model), factor);
      QuantGradStore* q = store.get();
      model->set_grad_ready_fn([q](const std::vector<int>& ids) { q->accumulate(ids); });
      engine->quant_grads.push_back(std::move(store));
    }
    if (par.overlap_grad_reduce || dc.reduce_in_bf16)
      model->set_grad_ready_fn([s, es, overlap = par.overlap_grad_reduce, bf16 = dc.reduce_in_bf16](
                                   const std::vector<int>& ids) {
        if (bf16) {  // --grad-reduce-in-bf16: each accumulation rounded, as Megatron's bf16 buffer
          s->round_grads_to_bf16(ids);
          if (es) es->round_grads_to_bf16(ids);
        }
        if (!overlap) return;
        s->on_grads_ready(ids);
        if (es) es->on_grads_ready(ids);
      });
    if (par.overlap_param_gather)
      model->set_params_needed_fn([s, es](const std::vector<int>& ids) {
        s->on_params_needed(ids);
        if (es) es->on_params_needed(ids);
      });
    OptimizedBuffer buffer{&model->params(), norm_counting(*model), std::nullopt};
    if (!std::isnan(args.training.decoupled_lr)) {  // Megatron's is_embedding_or_output_parameter
      buffer.decoupled_lr.assign(static_cast<size_t>(model->params().size()), false);
      for (int id : {model->word_embedding_id(), model->output_weight_id()})
        if (id >= 0) buffer.decoupled_lr[static_cast<size_t>(id)] = true;
    }
    if (emerging) set_muon_params(*model, &buffer);  // Lion's parameters are Muon's
    set_mup_params(*model, args, &buffer);
    if (args.training.apply_wd_to_qk_layernorm) buffer.weight_decay = qk_layernorm_weight_decay(*model);
    if (args.training.quant_grads) buffer.quant_grads = engine->quant_grads.back().get();
    if (layer_wise) {
      const Comm& edp = engine->ps.expert_dp();
      buffer.layer_wise_owner = layer_wise_owners(pb, dp->size(), ep ? edp->size() : 1);
      buffer.owned = layer_wise_ranges(pb, buffer.layer_wise_owner, dp->rank(), ep ? edp->rank() : 0);
    } else if (par.use_distributed_optimizer) {
      buffer.owned = s->owned_ranges();
      if (es)
        for (const FlatRange& r : es->owned_ranges()) buffer.owned->push_back(r);
    }
    buffers.push_back(std::move(buffer));
    if (expert_sync) engine->expert_dp_sync.push_back(std::move(expert_sync));
    engine->chunks.push_back(std::move(model));
    engine->dp_sync.push_back(std::move(sync));
  }
  // Expert parameters count in the norms over the expert model-parallel group (tp-ep-pp), their
  // shards over expert-DP (Megatron's separate expert-parallel optimizer, chained).
  const bool ep = engine->ps.layout().sizes.ep > 1;
  ExpertNormGroups expert_groups;
  if (ep) {
    expert_groups.norm_group = engine->ps.group(Group::kExpertTensorExpertPipeline);
    if (par.use_distributed_optimizer) expert_groups.shard_group = engine->ps.expert_dp();
  }
  if (args.moe.num_experts > 0) expert_groups.tp_group = engine->ps.expert_tp();  // Muon's split experts
  engine->optimizer = std::make_unique<Optimizer>(optimizer_config_from_args(args), std::move(buffers), &engine->ops,
                                                  engine->ps.model(),
                                                  par.use_distributed_optimizer ? shard_dp
                                                  : engine->zero3_optimizer_group ? engine->zero3_optimizer_group
                                                  : par.zero3() || par.zero2()     ? dp
                                                                                : nullptr,
                                                  expert_groups, engine->ps.tp());
  if (args.training.swap_optimizer) GALE_RETURN_IF_ERROR(engine->optimizer->open_swap());
  if (args.training.swap_attention || args.training.swap_layer_input) {  // an unusable directory: a start-up error
    GALE_ASSIGN_OR_RETURN(std::unique_ptr<ActivationSwap> probe,
                          ActivationSwap::create(swap_attention_config_from_args(args)));
  }
  if (args.training.smart_swap) {  // one chunk (no pipeline parallelism: features/feature_smart_swap.cc)
    GALE_CHECK_EQ(engine->chunks.size(), size_t{1}) << "--smart-swap needs one model chunk";
    engine->smart_swap = std::make_unique<SmartSwap>(smart_swap_config_from_args(args),
                                                     engine->chunks.front()->num_layers());
    engine->chunks.front()->set_smart_swap(engine->smart_swap.get());
    GALE_ASSIGN_OR_RETURN(std::unique_ptr<ActivationSwap> probe,  // an unusable directory: a start-up error
                          ActivationSwap::create(engine->smart_swap->swap_config()));
  }
  // --overlap-param-gather-with-optimizer-step: chunk 0's dense all-gather starts once the
  // optimizer has updated chunk 0 (buffer 0), while it updates the other chunks. Its expert part
  // waits for the whole step (Megatron's expert-parallel optimizer steps after the dense ones).
  if (par.overlap_param_gather_with_optimizer_step) {
    DataParallelSync* first = engine->dp_sync.front().get();
    engine->optimizer->set_after_buffer_step([first](size_t b) {
      if (b == 0) first->after_optimizer_step();
    });
  }
  engine->scheduler = std::make_unique<LrScheduler>(lr_schedule_from_args(args));
  if (ops.expert_placement_freq > 0) {
    ExpertPlacementConfig pc;
    pc.freq = ops.expert_placement_freq;
    pc.fine_grained = ops.expert_placement_fine_grained_thre >= 0.0;
    pc.fine_grained_thre = ops.expert_placement_fine_grained_thre;
    pc.print_load = ops.print_expert_load;
    engine->expert_placer = std::make_shared<ExpertPlacer>(pc, *engine);
  }
  if (args.training.fp16) engine->grad_scaler = std::make_unique<GradScaler>(grad_scaler_config_from_args(args));
  return engine;
}

}  // namespace gale
