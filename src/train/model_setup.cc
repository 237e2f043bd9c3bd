// Flag-to-config translation for the model, optimizer and LR schedule.
#include "train/model_setup.h"

#include <cmath>

#include "model/hybrid_layers.h"
#include "model/hybrid_pattern.h"
#include "model/longrope_rope.h"
#include "train/heterogeneous_config.h"
#include "train/mup.h"
#include "train/batch_size_rampup.h"

namespace gale {

namespace {

// A hybrid model's layer symbols, the MTP depths' after the decoder's (global layer order).
std::string hybrid_all_layers(const ModelConfig& c) {
  std::string all = c.hybrid.layers;
  if (!c.hybrid.mtp.empty())
    for (int64_t k = 0; k < c.mtp_num_layers; ++k) all += c.hybrid.mtp;
  return all;
}

}  // namespace

ModelConfig model_config_from_args(const Arguments& a) {
  const ModelArgs& m = a.model;
  GALE_CHECK_GT(m.padded_vocab_size, 0) << "padded vocabulary size not set";
  ModelConfig c;
  c.num_layers = m.num_layers;
  c.noop_layers = m.noop_layers;
  c.mtp_num_layers = m.mtp_num_layers == kUnset ? 0 : m.mtp_num_layers;
  c.mtp_loss_scaling_factor = m.mtp_loss_scaling_factor;
  c.hidden = m.hidden_size;
  c.ffn = m.ffn_hidden_size;
  c.heads = m.num_attention_heads;
  c.kv_heads = m.num_kv_heads;
  c.head_dim = m.kv_channels;
  c.vocab = m.padded_vocab_size;
  c.seq_length = m.seq_length;
  c.max_positions = m.max_position_embeddings;
  c.rms_norm = m.normalization == "RMSNorm";
  c.norm_eps = static_cast<float>(m.norm_epsilon);
  c.swiglu = m.swiglu;
  c.quick_geglu = m.quick_geglu;
  c.glu_linear_offset = static_cast<float>(m.glu_linear_offset);
  c.activation_clamp = unset(m.activation_func_clamp_value) ? 0.0f : static_cast<float>(m.activation_func_clamp_value);
  c.openai_gelu = m.openai_gelu;
  c.embed_layernorm = m.embed_layernorm;
  c.squared_relu = m.squared_relu;
  c.norm_weight_1p = m.apply_layernorm_1p;
  apply_gemma_args(a, &c);  // --geglu, --gelu-tanh, --add-rmsnorm-offset, --input-embeds-norm
  c.add_bias_linear = m.add_bias_linear;
  c.add_qkv_bias = m.add_qkv_bias;
  // MLA's norms are c.mla.qk_layernorm; --qk-l2-norm replaces the learned norms (Megatron's spec
  // picks L2Norm for q_layernorm/k_layernorm when both are given).
  c.qk_layernorm = m.qk_layernorm && !m.multi_latent_attention && !m.qk_l2_norm;
  c.qk_l2_norm = m.qk_l2_norm;
  c.attention_output_gate = m.attention_output_gate;
  c.mhc.enabled = m.enable_mhc_connections;  // validated (train/arguments_mhc.cc)
  c.mhc.streams = m.mhc_num_residual_streams;
  c.mhc.sinkhorn_iterations = m.mhc_sinkhorn_iterations;
  c.mhc.init_gating_factor = static_cast<float>(m.mhc_init_gating_factor);
  c.softmax_type = m.softmax_type == "learnable"    ? SoftmaxType::kLearnable
                   : m.softmax_type == "off-by-one" ? SoftmaxType::kOffByOne
                                                    : SoftmaxType::kVanilla;  // validated choices
  c.track_max_attention_logit = m.qk_clip || m.log_max_attention_logit;  // model/qk_clip.h
  c.tied_embeddings = !m.untie_embeddings_and_output_weights;
  if (m.is_hybrid_model) {  // validated (train/arguments_hybrid.cc)
    c.hybrid.enabled = true;
    GALE_CHECK(allocate_hybrid_layers(m.num_layers, m.hybrid_attention_ratio, m.hybrid_mlp_ratio,
                                      m.hybrid_override_pattern, &c.hybrid.layers)
                   .ok());
    // The MTP depths' layers (the pattern's block after '/'; validated): only with --mtp-num-layers,
    // which inference without the MTP layers unsets.
    if (m.mtp_num_layers != kUnset && m.mtp_num_layers > 0 && has_hybrid_separators(m.hybrid_override_pattern)) {
      StatusOr<HybridLayerPattern> parsed = parse_hybrid_layer_pattern(m.hybrid_override_pattern, "--hybrid-layer-pattern");
      GALE_CHECK(parsed.ok()) << parsed.status().message();
      c.hybrid.mtp = parsed->mtp;
    }
    c.hybrid.d_state = m.mamba_state_dim;
    c.hybrid.headdim = m.mamba_head_dim;
    c.hybrid.ngroups = m.mamba_num_groups;
    // Megatron's MambaMixer: --mamba-training-ssm-states-dtype, else the parameters' dtype.
    const std::string& states = m.mamba_training_ssm_states_dtype;
    c.hybrid.training_ssm_states = states == "bf16"   ? DType::kBF16
                                   : states == "fp32" ? DType::kF32
                                   : a.training.bf16  ? DType::kBF16
                                   : a.training.fp16  ? DType::kF16
                                                      : DType::kF32;
  }
  if (!m.heterogeneous_layers_config_encoded_json.empty()) {  // validated (train/arguments_heterogeneous.cc)
    StatusOr<std::vector<HeteroLayer>> layers = parse_heterogeneous_layers(
        m.heterogeneous_layers_config_encoded_json,
        HeteroModelShape{m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size},
        "--heterogeneous-layers-config-encoded-json");
    GALE_CHECK(layers.ok()) << layers.status().message();
    c.hetero = layers.value();
  }
  c.position = m.position_embedding_type == "rope" || m.position_embedding_type == "yarn" ? PositionEmbedding::kRope
               : m.position_embedding_type == "none" ? PositionEmbedding::kNone
               : m.position_embedding_type == "alibi" ? PositionEmbedding::kAlibi
                                                     : PositionEmbedding::kLearnedAbsolute;
  c.rotary_base = static_cast<double>(m.rotary_base);
  c.rotary_percent = m.rotary_percent;
  c.rope_scaling_factor = m.use_rope_scaling ? m.rope_scaling_factor : 0.0;
  c.rope_interleaved = m.rotary_interleaved;
  c.no_rope_layers = m.no_rope_pattern;  // --no-rope-freq (validated: train/arguments_no_rope.cc)
  if (m.position_embedding_type == "yarn") {  // validated: train/arguments_yarn.cc
    c.yarn.enabled = true;
    c.yarn.scaling_factor = m.rotary_scaling_factor;
    c.yarn.mscale = m.mscale;
    c.yarn.mscale_all_dim = m.mscale_all_dim;
    if (m.yarn_original_max_position_embeddings != kUnset)
      c.yarn.original_max_positions = m.yarn_original_max_position_embeddings;
    if (!unset(m.yarn_beta_fast)) c.yarn.beta_fast = m.yarn_beta_fast;
    if (!unset(m.yarn_beta_slow)) c.yarn.beta_slow = m.yarn_beta_slow;
    c.yarn.round_to_int = m.yarn_correction_range_round_to_int;
  }
  if (m.rope_scaling_type == "longrope") {  // validated: train/arguments_longrope.cc
    c.longrope.enabled = true;
    c.longrope.original_max_positions = m.rope_scaling_original_max_position_embeddings;
    c.longrope.short_factor = m.short_factors;
    c.longrope.long_factor = m.long_factors;
    const bool given = !unset(m.long_mscale);  // both or neither
    const double fallback = longrope_default_mscale(m.max_position_embeddings, c.longrope.original_max_positions);
    c.longrope.short_mscale = given ? m.short_mscale : fallback;
    c.longrope.long_mscale = given ? m.long_mscale : fallback;
    c.longrope.long_without_cache = m.seq_length > c.longrope.original_max_positions;
  }
  c.rope_position_scale = unset(m.rotary_seq_len_interpolation_factor) ? 1.0 : 1.0 / m.rotary_seq_len_interpolation_factor;
  c.sliding_window = m.sliding_window == kUnset ? 0 : m.sliding_window;
  c.window_layers = m.window_attn_pattern;  // --window-attn-skip-freq (validated: train/arguments_window.cc)
  // Gemma-2's flags (train/arguments_gemma2.cc; --interleave-sliding-window is the window above)
  c.attn_logit_softcapping = unset(m.attn_logit_softcapping) ? 0.0f : static_cast<float>(m.attn_logit_softcapping);
  c.output_logit_softcapping =
      unset(m.output_logit_softcapping) ? 0.0f : static_cast<float>(m.output_logit_softcapping);
  c.query_pre_attn_scalar = m.query_pre_attn_scalar == kUnset ? 0 : m.query_pre_attn_scalar;
  c.post_norm = m.post_norm;
  c.attention_dropout = static_cast<float>(m.attention_dropout);
  c.hidden_dropout = static_cast<float>(m.hidden_dropout);
  c.init_std = static_cast<float>(m.init_method_std);
  c.init_xavier_uniform = m.init_method_xavier_uniform;
  c.seed = static_cast<uint64_t>(a.training.seed);
  c.bf16 = a.training.bf16;
  c.reuse_fp32_param = a.training.reuse_fp32_param;
  c.fp16 = a.training.fp16;
  c.bf16_logits = a.megatron_compat.output_logit_dtype == "bf16";  // --output-logit-dtype (validated choices)
  // --qat-scheme (validated by features/feature_qat.cc; pretrain clears it below level 2).
  StatusOr<QatConfig> qat = parse_qat_scheme(m.qat_scheme, m.qat_quant_block_size);
  GALE_CHECK(qat.ok()) << qat.status().message();
  c.qat = qat.value();
  // --fp8-format (validated by features/feature_fp8.cc).
  StatusOr<Fp8Config> fp8 = parse_fp8_config(m.fp8_format, m.fp8_recipe, m.fp8_margin, m.fp8_amax_history_len,
                                             m.fp8_amax_compute_algo, m.fp8_wgrad);
  GALE_CHECK(fp8.ok()) << fp8.status().message();
  c.fp8 = fp8.value();
  if (m.first_last_layers_bf16) {
    c.fp8.bf16_layers_at_start = m.num_layers_at_start_in_bf16;
    c.fp8.bf16_layers_at_end = m.num_layers_at_end_in_bf16;
  }
  // A GDN model's pattern (train/arguments_gdn.cc), or a hybrid model's 'G' layers (model/hybrid_layers.h).
  const bool hybrid_gdn = c.hybrid.enabled && hybrid_all_layers(c).find(kHybridGatedDeltaNet) != std::string::npos;
  const bool gdn2 = m.experimental_attention_variant == "gdn2";  // GatedDeltaNet2 mixers (GPT layers or 'G')
  if (m.experimental_attention_variant == "gdn" || (gdn2 && !m.is_hybrid_model) || hybrid_gdn) {
    c.gdn.enabled = true;
    c.gdn.pattern = hybrid_gdn ? hybrid_gdn_layer_flags(hybrid_all_layers(c)) : m.linear_attention_pattern;
    if (gdn2)  // GdnConfig::pattern: 2 marks a GDN2 layer
      for (int& k : c.gdn.pattern) k = k != 0 ? 2 : 0;
    c.gdn.conv_kernel = m.linear_conv_kernel_dim;
    c.gdn.key_head_dim = m.linear_key_head_dim;
    c.gdn.value_head_dim = m.linear_value_head_dim;
    c.gdn.num_key_heads = m.linear_num_key_heads;
    c.gdn.num_value_heads = m.linear_num_value_heads;
  }
  if (m.multi_latent_attention) {
    if (m.experimental_attention_variant == "dsa") {
      c.dsa.enabled = true;
      c.dsa.n_heads = m.dsa_indexer_n_heads;
      c.dsa.head_dim = m.dsa_indexer_head_dim;
      c.dsa.topk = m.dsa_indexer_topk;
      c.dsa.loss_coeff = m.dsa_indexer_loss_coeff;
      c.dsa.sparse_loss = m.dsa_indexer_use_sparse_loss;
    }
    c.mla.enabled = true;
    c.mla.q_lora_rank = m.q_lora_rank == kUnset ? 0 : m.q_lora_rank;
    c.mla.kv_lora_rank = m.kv_lora_rank;
    c.mla.qk_head_dim = m.qk_head_dim;
    c.mla.qk_pos_emb_head_dim = m.qk_pos_emb_head_dim;
    c.mla.v_head_dim = m.v_head_dim;
    c.mla.qk_layernorm = m.qk_layernorm;
    c.mla.down_proj_fusion = m.mla_down_proj_fusion;
    c.mla.yarn = m.rope_type != "rope";  // Megatron's MLA default is yarn
    c.mla.rotary_scaling_factor = m.rotary_scaling_factor;
    c.mla.mscale = m.mscale;
    c.mla.mscale_all_dim = m.mscale_all_dim;
  }
  const MoeArgs& moe = a.moe;
  if (moe.enabled()) {
    c.moe.num_experts = moe.num_experts;
    c.moe.topk = moe.moe_router_topk;
    c.moe.ffn = moe.moe_ffn_hidden_size;
    c.moe.pre_softmax = moe.moe_router_pre_softmax;
    c.moe.fix_router = moe.fix_router;
    c.moe.aux_loss_coeff = moe.aux_loss_coeff("aux_loss");
    c.moe.seq_aux_loss_coeff = moe.aux_loss_coeff("seq_aux_loss");
    c.moe.global_aux_loss_coeff = moe.aux_loss_coeff("global_aux_loss");
    c.moe.force_load_balancing = moe.moe_router_force_load_balancing;
    c.moe.sinkhorn = moe.moe_router_load_balancing_types.empty() && moe.moe_router_load_balancing_type == "sinkhorn";
    c.moe.quantile_balancing =
        moe.moe_router_load_balancing_types.empty() && moe.moe_router_load_balancing_type == "quantile_balancing";
    c.moe.qb_ema = moe.moe_router_quantile_balancing_ema;
    c.moe.sigmoid = moe.moe_router_score_function == "sigmoid";
    c.moe.topk_scaling_factor = unset(moe.moe_router_topk_scaling_factor) ? 1.0 : moe.moe_router_topk_scaling_factor;
    if (moe.moe_router_group_topk != kUnset) {
      c.moe.num_groups = moe.moe_router_num_groups;
      c.moe.group_topk = moe.moe_router_group_topk;
    }
    c.moe.expert_bias = moe.moe_router_enable_expert_bias;
    c.moe.bias_update_rate = moe.moe_router_bias_update_rate;
    c.moe.capacity_factor = unset(moe.moe_expert_capacity_factor) ? 0.0 : moe.moe_expert_capacity_factor;
    c.moe.drop_by_position = moe.moe_token_drop_policy == "position";
    c.moe.pad_to_capacity = moe.moe_pad_expert_input_to_capacity;
    c.moe.z_loss_coeff = unset(moe.moe_z_loss_coeff) ? 0.0 : moe.moe_z_loss_coeff;
    // A hybrid model's MoE layers are its pattern's 'E' layers (also when the flags come from a
    // checkpoint, whose moe_layer_freq does not say so).
    c.moe.pattern = c.hybrid.enabled ? hybrid_moe_layer_flags(hybrid_all_layers(c)) : moe.layer_pattern;
    c.moe.shared_ffn = moe.moe_shared_expert_intermediate_size == kUnset ? 0 : moe.moe_shared_expert_intermediate_size;
    c.moe.shared_gate = moe.moe_shared_expert_gate;
    c.moe.shared_overlap = moe.moe_shared_expert_overlap;
    c.moe.input_jitter_eps = unset(moe.moe_input_jitter_eps) ? 0.0 : moe.moe_input_jitter_eps;
  }
  if (a.lora.enabled()) {
    c.lora.r = a.lora.lora_r;
    c.lora.alpha = static_cast<double>(a.lora.lora_alpha);
    for (const std::string& t : a.lora.lora_target_modules) {
      c.lora.qkv = c.lora.qkv || t == "linear_qkv";
      c.lora.proj = c.lora.proj || t == "linear_proj";
      c.lora.fc1 = c.lora.fc1 || t == "linear_fc1";
      c.lora.fc2 = c.lora.fc2 || t == "linear_fc2";
      c.lora.in_proj = c.lora.in_proj || t == "in_proj";  // a Gated DeltaNet mixer's projections
      c.lora.out_proj = c.lora.out_proj || t == "out_proj";
    }
    c.lora.modules_to_save = a.lora.lora_modules_to_save;
  }
  if (m.recompute_granularity == "full") {
    c.full_recompute.method =
        m.recompute_method == "uniform" ? FullRecompute::Method::kUniform : FullRecompute::Method::kBlock;
    c.full_recompute.num_layers = m.recompute_num_layers;
    c.full_recompute.distribute = m.distribute_saved_activations;
    c.full_recompute.per_pp_rank = m.enable_recompute_layers_per_pp_rank;
  }
  apply_mup_to_model(m, &c);  // --use-mup: multipliers, softmax scale, the hidden weights' σ/√m
  return c;
}

void apply_recompute_modules(const ModelArgs& m, RecomputePlan* plan) {
  if (m.recompute_granularity != "selective") return;
  for (const std::string& module : m.recompute_modules) {
    if (module == "layernorm") plan->norm_layers = RecomputePlan::kAllLayers;
    plan->mlp = plan->mlp || module == "mlp";
    plan->moe_act = plan->moe_act || module == "moe_act";
    plan->shared_experts = plan->shared_experts || module == "shared_experts";
    plan->moe = plan->moe || module == "moe";
    plan->mla_up_proj = plan->mla_up_proj || module == "mla_up_proj";
    if (module == "mhc") {  // validated (train/arguments_mhc.cc): with --enable-mhc-connections
      plan->mhc = true;
      plan->mhc_layer_num = m.mhc_recompute_layer_num == kUnset ? 0 : m.mhc_recompute_layer_num;
    }
  }
}

ActivationCompressConfig activation_compress_config_from_args(const Arguments& a) {
  ActivationCompressConfig c;
  if (!a.training.compress_activation.empty()) {
    StatusOr<std::vector<bool>> layers = parse_compress_activation(a.training.compress_activation, a.model.num_layers);
    GALE_CHECK_OK(layers.status());  // validated by the feature
    c.layers = *layers;
  }
  StatusOr<int> level = parse_compress_dense(a.training.compress_dense);
  GALE_CHECK_OK(level.status());
  c.dense_level = *level;
  return c;
}

SmartSwapConfig smart_swap_config_from_args(const Arguments& a) {
  const TrainingArgs& t = a.training;
  SmartSwapConfig c;
  c.enabled = t.smart_swap;
  c.warmup_iters = t.smart_swap_warmup_iters;
  c.reduction_bytes = static_cast<int64_t>(std::llround(t.smart_swap_reduction_mb * 1048576.0));
  c.target_bytes = static_cast<int64_t>(std::llround(t.smart_swap_target_mb * 1048576.0));
  c.dir = t.swap_attention_dir;
  return c;
}

SwapAttentionConfig swap_attention_config_from_args(const Arguments& a) {
  SwapAttentionConfig c;
  if (a.training.swap_attention) {
    StatusOr<SwapAttentionConfig> modules = swap_attention_config(a.training.swap_modules, a.training.swap_attention_dir);
    GALE_CHECK_OK(modules.status());  // validated by the feature
    c = *modules;
  } else {  // --swap-layer-input alone: no attention activations
    c.input_norm = c.self_attention = c.post_attention_norm = false;
    c.dir = a.training.swap_attention_dir;
  }
  c.layer_input = a.training.swap_layer_input;
  c.enabled = a.training.swap_attention || a.training.swap_layer_input;
  return c;
}

OptimizerConfig optimizer_config_from_args(const Arguments& a) {
  const TrainingArgs& t = a.training;
  OptimizerConfig o;
  o.type = t.optimizer;
  o.beta1 = t.adam_beta1;
  o.beta2 = t.adam_beta2;
  o.eps = t.adam_eps;
  o.sgd_momentum = t.sgd_momentum;
  o.clip_grad = t.clip_grad;
  o.swap = t.swap_optimizer;
  o.frozen = t.freeze_all_layers;  // no optimizer state: the run never steps
  o.swap_times = t.swap_optimizer_times;
  o.swap_dir = t.swap_optimizer_dir;
  o.compress = t.compress_optimizer;
  o.quant_states = t.quant_states;
  if (t.use_precision_aware_optimizer) {
    o.exp_avg_dtype = t.exp_avg_dtype;
    o.exp_avg_sq_dtype = t.exp_avg_sq_dtype;
  }
  o.ema = t.optimizer_selection == "fused_ema_adamw";
  o.ema_decay = t.ema_decay;
  o.muon.momentum = t.muon_momentum;
  o.muon.nesterov = t.muon_nesterov;
  o.muon.split_qkv = t.muon_split_qkv;
  o.muon.scale_mode = t.muon_scale_mode;
  o.muon.fp32_matmul_prec = t.muon_fp32_matmul_prec;
  o.muon.coefficient_type = t.muon_coefficient_type;
  o.muon.num_ns_steps = t.muon_num_ns_steps;
  o.muon.tp_mode = t.muon_tp_mode;
  o.muon.extra_scale_factor = t.muon_extra_scale_factor;
  o.muon.scalar_optimizer = t.muon_scalar_optimizer;
  o.lion.beta1 = t.lion_beta1;
  o.lion.beta2 = t.lion_beta2;
  apply_mup_to_optimizer(a, &o);  // --use-mup
  return o;
}

int64_t train_iters_from_args(const Arguments& a) {
  const TrainingArgs& t = a.training;
  if (t.train_iters != kUnset) return t.train_iters;
  StatusOr<NumMicroBatchesCalculator> calculator = num_micro_batches_calculator_from_args(a);
  GALE_CHECK_OK(calculator.status());  // validated with the flags
  return calculator->train_iters_for_samples(t.train_samples);
}

GradScalerConfig grad_scaler_config_from_args(const Arguments& a) {
  const TrainingArgs& t = a.training;
  GradScalerConfig c;
  c.dynamic = unset(t.loss_scale);
  c.initial_scale = c.dynamic ? t.initial_loss_scale : t.loss_scale;
  c.min_scale = t.min_loss_scale;
  c.growth_interval = t.loss_scale_window;
  c.hysteresis = t.hysteresis;
  return c;
}

LrSchedule lr_schedule_from_args(const Arguments& a) {
  const TrainingArgs& t = a.training;
  const int64_t gbs = t.global_batch_size;
  LrSchedule s;
  s.max_lr = t.lr;
  s.min_lr = t.min_lr;
  s.init_lr = t.lr_warmup_init;
  s.decay_style = t.lr_decay_style;
  s.wsd_decay_style = t.lr_wsd_decay_style;
  s.start_wd = t.start_weight_decay;
  s.end_wd = t.end_weight_decay;
  s.wd_incr_style = t.weight_decay_incr_style;
  if (t.train_iters != kUnset) {
    const int64_t decay_iters = t.lr_decay_iters != kUnset ? t.lr_decay_iters : t.train_iters;
    s.decay_steps = decay_iters * gbs;
    s.wd_incr_steps = t.train_iters * gbs;
    if (t.lr_wsd_decay_iters != kUnset) s.wsd_decay_steps = t.lr_wsd_decay_iters * gbs;
    s.warmup_steps = !unset(t.lr_warmup_fraction) ? t.lr_warmup_fraction * static_cast<double>(s.decay_steps)
                                                   : static_cast<double>(t.lr_warmup_iters * gbs);
  } else {
    s.decay_steps = t.lr_decay_samples != kUnset ? t.lr_decay_samples : t.train_samples;
    s.wd_incr_steps = t.train_samples;
    if (t.lr_wsd_decay_samples != kUnset) s.wsd_decay_steps = t.lr_wsd_decay_samples;
    s.warmup_steps = !unset(t.lr_warmup_fraction) ? t.lr_warmup_fraction * static_cast<double>(s.decay_steps)
                                                   : static_cast<double>(t.lr_warmup_samples);
  }
  return s;
}

}  // namespace gale
