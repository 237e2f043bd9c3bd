// --config-logger-dir: the files Megatron's config logger writes, written by gale pretrain.
#include "train/config_logger.h"

#include <filesystem>
#include <fstream>

#include "ckpt/torch_file.h"
#include "core/tensor.h"
#include "model/gpt_model.h"
#include "train/engine.h"
#include "train/wandb_log.h"

namespace gale {

namespace {

// Megatron core_v0.12.1's ModelParallelConfig and TransformerConfig fields (in their order) that
// core_transformer_config_from_args can fill; callables, process groups and the CUDA-only
// internals without an argument are left out.
const std::vector<const char*>& transformer_config_fields() {
  static const std::vector<const char*> fields = {
      "tensor_model_parallel_size", "pipeline_model_parallel_comm_backend", "pipeline_model_parallel_size",
      "virtual_pipeline_model_parallel_size", "sequence_parallel", "context_parallel_size",
      "hierarchical_context_parallel_sizes", "expert_model_parallel_size", "expert_tensor_parallel_size",
      "moe_extended_tp", "perform_initialization", "use_cpu_initialization", "fp16", "bf16", "params_dtype",
      "deterministic_mode", "gradient_accumulation_fusion", "async_tensor_model_parallel_allreduce",
      "use_te_rng_tracker", "tp_comm_overlap", "tp_comm_bulk_wgrad", "tp_comm_bulk_dgrad", "tp_comm_overlap_ag",
      "tp_comm_overlap_rs", "tp_comm_overlap_rs_dgrad", "tp_comm_split_ag", "tp_comm_atomic_ag", "tp_comm_split_rs",
      "tp_comm_atomic_rs", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "tp_comm_bootstrap_backend",
      "pipeline_dtype", "overlap_p2p_comm", "batch_p2p_comm", "use_ring_exchange_p2p", "deallocate_pipeline_outputs",
      "defer_embedding_wgrad_compute", "wgrad_deferral_limit", "pipeline_model_parallel_split_rank",
      "overlap_p2p_comm_warmup_flush", "microbatch_group_size_per_vp_stage", "num_layers", "mtp_num_layers",
      "mtp_loss_scaling_factor", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
      "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "hidden_size",
      "num_attention_heads", "attention_backend", "softmax_scale", "num_query_groups", "ffn_hidden_size",
      "kv_channels", "hidden_dropout", "attention_dropout", "fp32_residual_connection",
      "apply_residual_connection_post_layernorm", "layernorm_epsilon", "layernorm_zero_centered_gamma",
      "add_bias_linear", "add_qkv_bias", "gated_linear_unit", "activation_func", "num_moe_experts",
      "rotary_interleaved", "window_size", "normalization", "qk_layernorm", "test_mode", "calculate_per_token_loss",
      "multi_latent_attention", "init_method_std", "init_model_with_meta_device", "apply_query_key_layer_scaling",
      "attention_softmax_in_fp32", "disable_bf16_reduced_precision_matmul", "bias_activation_fusion",
      "masked_softmax_fusion", "persist_layer_norm", "memory_efficient_layer_norm", "bias_dropout_fusion",
      "apply_rope_fusion", "recompute_granularity", "recompute_method", "recompute_num_layers",
      "distribute_saved_activations", "recompute_modules", "fp8", "fp8_recipe", "fp8_param", "fp8_margin",
      "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_wgrad", "fp8_dot_product_attention",
      "fp8_multi_head_attention", "tp_only_amax_red", "first_last_layers_bf16", "num_layers_at_start_in_bf16",
      "num_layers_at_end_in_bf16", "moe_shared_expert_intermediate_size", "moe_shared_expert_overlap",
      "moe_layer_freq", "moe_ffn_hidden_size", "moe_router_load_balancing_type", "moe_router_topk",
      "moe_router_topk_limited_devices", "moe_router_num_groups", "moe_router_group_topk", "moe_router_pre_softmax",
      "moe_router_topk_scaling_factor", "moe_router_score_function", "moe_router_dtype",
      "moe_router_enable_expert_bias", "moe_router_bias_update_rate", "moe_grouped_gemm",
      "moe_use_legacy_grouped_gemm", "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_input_jitter_eps",
      "moe_token_dropping", "moe_token_dispatcher_type", "moe_enable_deepep", "moe_per_layer_logging",
      "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity", "moe_token_drop_policy",
      "moe_layer_recompute", "moe_permute_fusion", "moe_apply_probs_on_input", "cp_comm_type", "enable_cuda_graph",
      "cuda_graph_use_single_mempool", "cuda_graph_retain_backward_graph", "cuda_graph_warmup_steps",
      "external_cuda_graph", "cuda_graph_scope", "clone_scatter_output_in_embedding",
      "disable_parameter_transpose_cache", "config_logger_dir", "flash_decode", "inference_rng_tracker",
      "mrope_section", "is_hybrid_model", "mamba_state_dim", "mamba_head_dim", "mamba_num_groups",
      "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "rope_type", "rotary_base",
      "rotary_percent", "rotary_scaling_factor", "max_position_embeddings", "beta_fast", "beta_slow", "mscale",
      "mscale_all_dim"};
  return fields;
}

const std::vector<const char*>& ddp_config_fields() {
  static const std::vector<const char*> fields = {
      "grad_reduce_in_fp32", "overlap_grad_reduce", "overlap_param_gather", "align_param_gather",
      "use_distributed_optimizer", "num_distributed_optimizer_instances", "check_for_nan_in_grad",
      "check_for_large_grads", "bucket_size", "pad_buckets_for_high_nccl_busbw", "average_in_collective",
      "fp8_param_gather", "use_custom_fsdp", "data_parallel_sharding_strategy", "gradient_reduce_div_fusion",
      "suggested_communication_unit_size", "preserve_fp32_weights", "keep_fp8_transpose_cache_when_using_custom_fsdp"};
  return fields;
}

const std::vector<const char*>& optimizer_config_fields() {
  static const std::vector<const char*> fields = {
      "optimizer", "lr", "min_lr", "decoupled_lr", "decoupled_min_lr", "weight_decay", "fp16", "bf16",
      "params_dtype", "use_precision_aware_optimizer", "main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
      "exp_avg_sq_dtype", "loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis",
      "adam_beta1", "adam_beta2", "adam_eps", "sgd_momentum", "use_distributed_optimizer",
      "overlap_param_gather_with_optimizer_step", "optimizer_cpu_offload", "optimizer_offload_fraction",
      "use_torch_optimizer_for_cpu_offload", "overlap_cpu_optimizer_d2h_h2d", "pin_cpu_grads", "pin_cpu_params",
      "clip_grad", "log_num_zeros_in_grad", "barrier_with_L1_time", "config_logger_dir"};
  return fields;
}

// Megatron's vars(args) before validation, by dest (JSON values), from the command line.
nlohmann::ordered_json megatron_args(const std::vector<std::string>& argv) {
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  for (const auto& [dest, text] : wandb_config_items(argv)) {
    nlohmann::ordered_json v = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    args[dest] = v.is_discarded() ? nlohmann::ordered_json(text) : v;
  }
  return args;
}

// The dataclass of `fields` filled as Megatron fills it: `overrides` first, then the args of the
// same name; fields in neither are left out.
nlohmann::ordered_json fill(const std::vector<const char*>& fields, const nlohmann::ordered_json& args, const nlohmann::ordered_json& overrides) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const char* f : fields) {
    if (overrides.contains(f))
      out[f] = overrides[f];
    else if (args.contains(f))
      out[f] = args[f];
  }
  return out;
}

bool arg_true(const nlohmann::ordered_json& args, const char* dest) {
  return args.contains(dest) && args[dest].is_boolean() && args[dest].get<bool>();
}

nlohmann::ordered_json arg_or_null(const nlohmann::ordered_json& args, const char* dest) {
  return args.contains(dest) ? args[dest] : nlohmann::ordered_json(nullptr);
}

const char* params_dtype(const TrainingArgs& t) {
  return t.bf16 ? "torch.bfloat16" : t.fp16 ? "torch.float16" : "torch.float32";
}

// Megatron's torch dtype of a --main-grads-dtype / --exp-avg-dtype choice.
std::string torch_dtype_of(const std::string& choice) {
  if (choice == "bf16") return "torch.bfloat16";
  if (choice == "fp16") return "torch.float16";
  if (choice == "fp8") return "torch.uint8";
  return "torch.float32";
}

nlohmann::ordered_json optimizer_config(const Arguments& a, const nlohmann::ordered_json& args) {
  const TrainingArgs& t = a.training;
  nlohmann::ordered_json o = {{"optimizer", t.optimizer},
                      {"params_dtype", params_dtype(t)},
                      {"main_grads_dtype", torch_dtype_of(t.main_grads_dtype)},
                      {"main_params_dtype", torch_dtype_of(t.main_params_dtype)},
                      {"exp_avg_dtype", torch_dtype_of(t.exp_avg_dtype)},
                      {"exp_avg_sq_dtype", torch_dtype_of(t.exp_avg_sq_dtype)},
                      {"use_distributed_optimizer", a.parallel.use_distributed_optimizer}};
  return fill(optimizer_config_fields(), args, o);
}

nlohmann::ordered_json ddp_config(const Arguments& a, const nlohmann::ordered_json& args, int64_t dp_cp_size) {
  const ParallelArgs& par = a.parallel;
  nlohmann::ordered_json o = {{"grad_reduce_in_fp32", arg_or_null(args, "accumulate_allreduce_grads_in_fp32")},
                      {"check_for_nan_in_grad", arg_or_null(args, "check_for_nan_in_loss_and_grad")},
                      {"check_for_large_grads", arg_or_null(args, "check_for_large_grads")},
                      {"pad_buckets_for_high_nccl_busbw", arg_or_null(args, "ddp_pad_buckets_for_high_nccl_busbw")},
                      {"average_in_collective", arg_or_null(args, "ddp_average_in_collective")},
                      {"use_distributed_optimizer", par.use_distributed_optimizer}};
  // Megatron's bucket size: --ddp-bucket-size, else max(40M, 1M x dp-cp); None without overlap.
  if (!par.overlap_grad_reduce)
    o["bucket_size"] = nullptr;
  else if (par.ddp_bucket_size != kUnset)
    o["bucket_size"] = par.ddp_bucket_size;
  else
    o["bucket_size"] = std::max<int64_t>(40000000, 1000000 * dp_cp_size);
  return fill(ddp_config_fields(), args, o);
}

// The model's flags of GPTModel's constructor (megatron/training's model_provider for GPT).
nlohmann::ordered_json gpt_model_locals(const Arguments& a, const nlohmann::ordered_json& config, const GPTModel& model) {
  const ModelArgs& m = a.model;
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["config"] = config;
  j["transformer_layer_spec"] =
      "gale: the Megatron-Core GPT layer (docs/model.md); Megatron writes its ModuleSpec here";
  j["vocab_size"] = m.padded_vocab_size;
  j["max_sequence_length"] = m.max_position_embeddings;
  j["pre_process"] = model.partition().pre_process;
  j["post_process"] = model.partition().post_process;
  j["fp16_lm_cross_entropy"] = false;
  j["parallel_output"] = true;
  j["share_embeddings_and_output_weights"] = !m.untie_embeddings_and_output_weights;
  j["position_embedding_type"] = m.position_embedding_type;
  j["rotary_percent"] = m.rotary_percent;
  j["rotary_base"] = m.rotary_base;
  j["rope_scaling"] = m.use_rope_scaling;
  j["rope_scaling_factor"] = m.rope_scaling_factor;
  j["scatter_embedding_sequence_parallel"] = true;
  if (std::isnan(m.rotary_seq_len_interpolation_factor))
    j["seq_len_interpolation_factor"] = nullptr;
  else
    j["seq_len_interpolation_factor"] = m.rotary_seq_len_interpolation_factor;
  j["mtp_block_spec"] = m.mtp_num_layers != kUnset && m.mtp_num_layers > 0
                            ? nlohmann::ordered_json("gale: the Megatron-Core MTP block")
                            : nlohmann::ordered_json(nullptr);
  j["__class__"] = "<class 'megatron.core.models.gpt.gpt_model.GPTModel'>";
  return j;
}

// A [B, S] int32 array as a [B, S] int64 tensor.
Tensor int64_tensor(const std::vector<int32_t>& v, int64_t B, int64_t S) {
  Tensor t = Tensor::empty({B, S}, DType::kI64);
  for (int64_t i = 0; i < B * S; ++i) t.data<int64_t>()[i] = v.at(static_cast<size_t>(i));
  return t;
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& j) {
  if (j.is_object()) {
    std::string out = "{";
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (out.size() > 1) out += ", ";
      out += nlohmann::ordered_json(it.key()).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
      out += ": " + python_json_dumps(it.value());
    }
    return out + "}";
  }
  if (j.is_array()) {
    std::string out = "[";
    for (const nlohmann::ordered_json& x : j) out += (out.size() > 1 ? ", " : "") + python_json_dumps(x);
    return out + "]";
  }
  if (j.is_number_float()) {  // Python's repr: integral floats keep ".0"
    const std::string s = j.dump();
    return s.find_first_of(".eEn") == std::string::npos ? s + ".0" : s;
  }
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string ConfigLogger::next_path(const std::string& prefix, const char* extension) {
  const std::string stem = str_cat(prefix, ".rank_", rank_);
  const int64_t n = counts_[stem]++;
  return str_cat(dir_, "/", stem, ".iter", n, extension);
}

Status ConfigLogger::write_json(const std::string& prefix, const nlohmann::ordered_json& value) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  const std::string path = next_path(prefix, ".json");
  std::ofstream out(path, std::ios::binary);
  out << python_json_dumps(value);
  out.close();
  if (!out) return InvalidArgument("--config-logger-dir: cannot write ", path);
  return Status::Ok();
}

Status ConfigLogger::write_torch(const std::string& prefix, const PyValue& value) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  const std::string path = next_path(prefix, ".pth");
  Status st = write_torch_file(path, value);
  if (!st.ok()) return InvalidArgument("--config-logger-dir: cannot write ", path, ": ", st.message());
  return Status::Ok();
}

namespace {

// TransformerConfig from Megatron's args (megatron_args) and the sizes Gale derived.
nlohmann::ordered_json transformer_config(const Arguments& a, const nlohmann::ordered_json& args) {
  const ModelArgs& m = a.model;
  const ParallelArgs& par = a.parallel;
  const int64_t heads = m.num_attention_heads;
  nlohmann::ordered_json o = {
      {"tensor_model_parallel_size", par.tensor_model_parallel_size},
      {"pipeline_model_parallel_size", par.pipeline_model_parallel_size},
      {"sequence_parallel", par.sequence_parallel},
      {"context_parallel_size", par.context_parallel_size},
      {"expert_model_parallel_size", par.expert_model_parallel_size},
      {"fp16", a.training.fp16},
      {"bf16", a.training.bf16},
      {"params_dtype", params_dtype(a.training)},
      {"pipeline_dtype", params_dtype(a.training)},
      {"deallocate_pipeline_outputs", true},
      {"batch_p2p_comm", !arg_true(args, "overlap_p2p_comm")},
      {"persist_layer_norm", !arg_true(args, "no_persist_layer_norm")},
      {"layernorm_zero_centered_gamma", m.apply_layernorm_1p},
      {"layernorm_epsilon", m.norm_epsilon},
      {"num_layers", m.num_layers},
      {"hidden_size", m.hidden_size},
      {"num_attention_heads", heads},
      // TransformerConfig.__post_init__: None becomes the heads
      {"num_query_groups", m.group_query_attention ? m.num_query_groups : heads},
      {"ffn_hidden_size", m.ffn_hidden_size},
      {"kv_channels", m.kv_channels != kUnset ? m.kv_channels : m.hidden_size / heads},
      {"num_moe_experts", a.moe.enabled() ? nlohmann::ordered_json(a.moe.num_experts) : nlohmann::ordered_json(nullptr)},
      {"rotary_interleaved", m.rotary_interleaved},
      {"num_layers_in_first_pipeline_stage", arg_or_null(args, "decoder_first_pipeline_num_layers")},
      {"num_layers_in_last_pipeline_stage", arg_or_null(args, "decoder_last_pipeline_num_layers")},
      {"fp8_param", arg_or_null(args, "fp8_param_gather")},
      {"gated_linear_unit", m.gated_mlp()},
      // Megatron's callables as its JSON encoder writes a function: str(function)
      {"activation_func", m.swiglu        ? "<function silu>"
                          : m.quick_geglu ? "<function quick_gelu>"
                          : m.squared_relu ? "<function squared_relu>" : "<function gelu>"},
      {"bias_activation_fusion", m.swiglu ? !arg_true(args, "no_bias_swiglu_fusion") : !arg_true(args, "no_bias_gelu_fusion")},
      {"is_hybrid_model", m.is_hybrid_model},
      {"config_logger_dir", a.logging.config_logger_dir}};
  if (a.moe.expert_tensor_parallel_size != kUnset) o["expert_tensor_parallel_size"] = a.moe.expert_tensor_parallel_size;
  if (StatusOr<WindowSize> w = parse_window_size(m.window_size); !m.window_size.empty() && w.ok())
    o["window_size"] = {w->left, w->right};  // --window-size: the pair as given (Transformer Engine applies the causal mask)
  if (args.contains("cp_comm_type") && args["cp_comm_type"].is_array() && args["cp_comm_type"].size() == 1)
    o["cp_comm_type"] = args["cp_comm_type"][0];
  return fill(transformer_config_fields(), args, o);
}

}  // namespace

nlohmann::ordered_json megatron_transformer_config(const Arguments& a, const std::vector<std::string>& argv) {
  return transformer_config(a, megatron_args(argv));
}

StatusOr<PyRef> megatron_state_dict(const GPTModel& model, int64_t num_local_experts, int64_t ep_rank) {
  const ParamBuffer& pb = model.params();
  if (pb.values_sharded())
    return Unimplemented("--config-logger-dir with ZeRO-3 sharded parameters (--use-torch-fsdp2, --layerzero, "
                         "--data-parallel-sharding-strategy optim_grads_params): not supported yet");
  const ModelPartition& part = model.partition();
  const bool tied_copy_is_output = !part.pre_process && model.config().tied_embeddings && model.config().mtp_num_layers <= 0;
  PyRef sd = PyValue::ordered_dict();
  const std::string layers = "decoder.layers.";
  int64_t local_layers = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    if (s.fp8_state_buffer) continue;  // Transformer Engine keeps these in `_extra_state`
    std::string name = s.name;
    if (name.rfind(layers, 0) == 0) {  // the stage's (chunk's) own layer numbers
      const size_t dot = name.find('.', layers.size());
      const int64_t layer = std::stoll(name.substr(layers.size(), dot - layers.size())) - part.first_layer;
      local_layers = std::max(local_layers, layer + 1);
      std::string rest = name.substr(dot + 1);
      const std::string experts = "mlp.experts.local_experts.";
      if (s.expert_parallel && rest.rfind(experts, 0) == 0 && num_local_experts > 0) {  // global → local expert
        const size_t edot = rest.find('.', experts.size());
        const int64_t e = std::stoll(rest.substr(experts.size(), edot - experts.size())) - ep_rank * num_local_experts;
        rest = str_cat(experts, e, rest.substr(edot));
      }
      name = str_cat(layers, layer, ".", rest);
    } else if (tied_copy_is_output && name == "embedding.word_embeddings.weight") {
      name = "output_layer.weight";  // the last stage's copy of the tied embedding
    }
    sd->set(name, PyValue::tensor(pb.param(id).clone()));
  }
  // Megatron's parallel linear layers save an `_extra_state` of None.
  for (int64_t i = 0; i < local_layers; ++i)
    for (const char* linear :
         {"self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"}) {
      const std::string w = str_cat(layers, i, ".", linear, ".weight");
      if (sd->get(w)) sd->set(str_cat(layers, i, ".", linear, "._extra_state"), PyValue::none());
    }
  if (sd->get("output_layer.weight")) sd->set("output_layer._extra_state", PyValue::none());
  return sd;
}

PyRef input_and_logits_payload(const MicroBatch& mb, const Tensor& decoder_input, const Tensor& logits,
                               bool first_stage) {
  PyRef p = PyValue::ordered_dict();
  const int64_t B = mb.B, S = mb.S;
  p->set("input_ids", first_stage ? PyValue::tensor(int64_tensor(mb.tokens, B, S)) : PyValue::none());
  if (first_stage) {  // the data's position ids, else each token's position in its sequence
    std::vector<int32_t> positions = mb.position_ids;
    if (positions.empty())
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s) positions.push_back(mb.seq_position(s));
    p->set("position_ids", PyValue::tensor(int64_tensor(positions, B, S)));
  } else {
    p->set("position_ids", PyValue::none());
  }
  p->set("attention_mask", PyValue::none());
  if (decoder_input.defined()) {  // written before the caller lets go of it: a view, no copy
    const int64_t H = decoder_input.shape()[1];
    p->set("decoder_input", PyValue::tensor(decoder_input.view({decoder_input.shape()[0] / B, B, H})));
  } else {
    p->set("decoder_input", PyValue::none());
  }
  const int64_t Vl = logits.shape()[1];
  p->set("logits", PyValue::tensor(logits.view({logits.shape()[0] / B, B, Vl})));
  return p;
}

Status start_config_logger(const Arguments& a, const std::vector<std::string>& argv, Engine& engine,
                           ConfigLogger* logger) {
  const nlohmann::ordered_json args = megatron_args(argv);
  const nlohmann::ordered_json config = transformer_config(a, args);
  const int64_t ep = std::max<int64_t>(1, a.parallel.expert_model_parallel_size);
  const int64_t local_experts = a.moe.enabled() ? a.moe.num_experts / ep : 0;
  const std::string model_prefix = a.model.is_hybrid_model ? "MambaModel" : "GPTModel";
  for (const auto& chunk : engine.chunks) {
    nlohmann::ordered_json locals = gpt_model_locals(a, config, *chunk);
    if (a.model.is_hybrid_model)
      locals["__class__"] = "<class 'megatron.core.models.mamba.mamba_model.MambaModel'>";
    GALE_RETURN_IF_ERROR(logger->write_json(model_prefix, locals));
    GALE_ASSIGN_OR_RETURN(PyRef sd, megatron_state_dict(*chunk, local_experts, engine.ps.coords().ep));
    GALE_RETURN_IF_ERROR(logger->write_torch(model_prefix + "_init_ckpt", *sd));
  }
  // The data-parallel wrappers (none with --use-torch-fsdp2, whose wrapper logs nothing).
  if (!a.parallel.use_torch_fsdp2) {
    const bool fsdp = a.parallel.use_custom_fsdp;
    const nlohmann::ordered_json ddp = ddp_config(a, args, engine.ps.dp_cp()->size());
    for (size_t c = 0; c < engine.chunks.size(); ++c) {
      nlohmann::ordered_json locals = {{"config", config},
                               {"ddp_config", ddp},
                               {"module", model_prefix},
                               {"disable_bucketing", c > 0 || a.parallel.overlap_param_gather_with_optimizer_step}};
      if (fsdp)
        locals["__class__"] =
            "<class 'megatron.core.distributed.custom_fsdp.fully_sharded_data_parallel.FullyShardedDataParallel'>";
      else
        locals["__class__"] =
            "<class 'megatron.core.distributed.distributed_data_parallel.DistributedDataParallel'>";
      GALE_RETURN_IF_ERROR(logger->write_json(fsdp ? "FullyShardedDataParallel" : "DistributedDataParallel", locals));
    }
  }
  // The optimizer: one per parameter group Megatron builds (the dense parameters; the experts').
  // DistributedOptimizer logs in its own constructor and again in MixedPrecisionOptimizer's.
  const nlohmann::ordered_json opt = optimizer_config(a, args);
  const bool distributed = a.parallel.use_distributed_optimizer;
  const bool mixed = a.training.bf16 || a.training.fp16;
  const int groups = a.moe.enabled() ? 2 : 1;
  for (int g = 0; g < groups; ++g) {
    if (distributed) {
      GALE_RETURN_IF_ERROR(logger->write_json("DistributedOptimizer", {{"config", opt}}));
      GALE_RETURN_IF_ERROR(logger->write_json(
          "DistributedOptimizer",
          {{"config", opt}, {"__class__", "<class 'megatron.core.optimizer.optimizer.MixedPrecisionOptimizer'>"}}));
    } else if (mixed) {
      GALE_RETURN_IF_ERROR(logger->write_json(
          "Float16OptimizerWithFloat16Params",
          {{"config", opt}, {"__class__", "<class 'megatron.core.optimizer.optimizer.MixedPrecisionOptimizer'>"}}));
    } else {
      GALE_RETURN_IF_ERROR(logger->write_json("FP32Optimizer", {{"config", opt}}));
    }
  }
  for (const auto& chunk : engine.chunks) {
    const bool first_stage = chunk->partition().pre_process;
    chunk->set_forward_observer([logger, first_stage](const MicroBatch& mb, const Tensor& decoder_input,
                                                       const Tensor& logits) {
      const Status st = logger->write_torch("input_and_logits",
                                            *input_and_logits_payload(mb, decoder_input, logits, first_stage));
      GALE_CHECK(st.ok()) << st.message();
    });
  }
  return Status::Ok();
}

}  // namespace gale
