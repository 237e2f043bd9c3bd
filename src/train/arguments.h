// Every `gale pretrain` flag, grouped as in Megatron's arguments.py, with Megatron's defaults.
//
// Each group is a plain struct (field = flag with '-' -> '_'), a function that registers its
// flags on an ArgParser, and a validation step that fills derived values (e.g. ffn_hidden_size
// from hidden_size) and rejects inconsistent values with one line naming the flag. Layers below
// train/ never see these structs: they receive their own config structs built from them.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/status.h"
#include "parallel/dist_train_layout.h"
#include "train/arg_parser.h"

namespace gale {

constexpr int64_t kUnset = -1;
inline bool unset(double v) { return v != v; }  // NaN marks an unset float flag
constexpr double kUnsetF = std::numeric_limits<double>::quiet_NaN();

struct ModelArgs {
  int64_t num_layers = kUnset;
  int64_t hidden_size = kUnset;
  int64_t ffn_hidden_size = kUnset;  // -> 4h, or int(4h*2/3/64)*64 with --swiglu
  int64_t num_attention_heads = kUnset;
  int64_t kv_channels = kUnset;  // -> h / heads
  bool group_query_attention = false;
  int64_t num_query_groups = 1;  // used only with --group-query-attention
  int64_t seq_length = kUnset;
  int64_t max_position_embeddings = kUnset;
  std::string position_embedding_type = "learned_absolute";
  bool use_rotary_position_embeddings = false;  // legacy spelling of --position-embedding-type rope
  int64_t rotary_base = 10000;
  double rotary_percent = 1.0;
  bool use_rope_scaling = false;      // --use-rope-scaling: Llama 3.1 RoPE scaling
  double rope_scaling_factor = 8.0;   // --rope-scaling-factor
  // --rotary-seq-len-interpolation-factor f: RoPE positions divided by f (position interpolation;
  // Hugging Face's rope_scaling {"rope_type": "linear", "factor": f}); unset: none.
  double rotary_seq_len_interpolation_factor = kUnsetF;
  bool rotary_interleaved = false;  // --rotary-interleaved: RoPE rotates pairs (2i, 2i+1)
  bool attention_output_gate = false;  // --attention-output-gate (train/arguments_attention_gate.cc)
  // --enable-mhc-connections and Megatron-Core's mhc_* fields with its defaults (train/arguments_mhc.cc,
  // model/hyper_connection.h); --mhc-recompute-layer-num unset: None.
  bool enable_mhc_connections = false;
  int64_t mhc_num_residual_streams = 4;
  int64_t mhc_sinkhorn_iterations = 20;
  double mhc_init_gating_factor = 0.01;
  int64_t mhc_recompute_layer_num = kUnset;
  // --softmax-type vanilla|off-by-one|learnable (Megatron-Core; attention sinks, gpt-oss;
  // train/arguments_softmax_type.cc, model/config.h SoftmaxType).
  std::string softmax_type = "vanilla";
  // --qk-clip, --qk-clip-alpha, --qk-clip-threshold, --log-max-attention-logit (Megatron-Core's
  // TransformerConfig qk_clip fields, MuonClip; train/arguments_qk_clip.cc, model/qk_clip.h).
  bool qk_clip = false;
  double qk_clip_alpha = 0.5;
  double qk_clip_threshold = 100.0;
  bool log_max_attention_logit = false;
  // --use-mup and the --mup-* flags (Megatron-Core's TransformerConfig µP fields; parsed with
  // Megatron's defaults: train/arguments_mup.cc, applied by train/mup.h). kUnset / kUnsetF: None.
  bool use_mup = false;
  int64_t mup_base_hidden_size = kUnset;
  double mup_embedding_mult = 1.0;
  double mup_output_mult = 1.0;
  double mup_base_head_dim = kUnsetF;
  double mup_attn_scale_power = 1.0;
  // --no-rope-freq (train/arguments_no_rope.cc): the flag's text; its per-layer pattern (1: no RoPE),
  // filled by validate_model_args; both empty: RoPE in every layer.
  std::string no_rope_freq;
  std::vector<int> no_rope_pattern;
  // --sliding-window W (MindSpeed-LLM's flag; unset: None, full causal attention): a query at
  // position i attends the keys at positions i − W + 1 .. i (Hugging Face Mistral's window).
  int64_t sliding_window = kUnset;
  // --window-size "left,right" (Megatron's; train/arguments_window.cc): sets sliding_window to
  // left + 1 (left -1: none). --window-attn-skip-freq: the flag's text; its per-layer pattern (1:
  // windowed, 0: full attention), filled by validate_model_args when there is a window; empty:
  // every layer windowed.
  std::string window_size;
  std::string window_attn_skip_freq;
  std::vector<int> window_attn_pattern;
  // Gemma-2's flags as MindSpeed-LLM spells them (train/arguments_gemma2.cc; kUnset / kUnsetF: None).
  // --output-logit-softcapping C: the logits become C·tanh(logits / C) before the loss;
  // --attn-logit-softcapping C: the scaled attention scores C·tanh(s / C) before the mask and softmax;
  // --query-pre-attn-scalar N: the softmax scale 1/√N instead of 1/√kv_channels; --post-norm: a norm
  // after the attention and after the MLP, before each residual add (post_attn_norm /
  // post_mlp_layernorm); --interleave-sliding-window W: --sliding-window W in the odd-numbered
  // layers 1, 3, 5, … (1-based), full attention in the others (--window-attn-skip-freq 2).
  double output_logit_softcapping = kUnsetF;
  double attn_logit_softcapping = kUnsetF;
  int64_t query_pre_attn_scalar = kUnset;
  bool post_norm = false;
  int64_t interleave_sliding_window = kUnset;
  // MindSpeed's ALiBi flags (--position-embedding-type alibi; kernels/cpu/attention.h). Gale always
  // adds the bias −m_h·(i − j) inside flash attention, which is MindSpeed's fusion-attention pse
  // type 2: --alibi-fusion-attn-type accepts 2 (or unset); 0 and 3 are refused (validate_model_args).
  // --alibi-diagonal-opposite only changes the bias of keys after the query, which the causal mask
  // hides; --square-alibi-mask ([S, S] bias m·(j − i) instead of Bloom's [1, S] m·j) and
  // --fill-neg-inf (needs --square-alibi-mask; −inf instead of the dtype minimum in the masked
  // entries) are legacy-path choices that give the same probabilities. All three are accepted.
  int64_t alibi_fusion_attn_type = kUnset;
  bool square_alibi_mask = false;
  bool fill_neg_inf = false;
  bool alibi_diagonal_opposite = false;
  std::string normalization = "LayerNorm";
  double norm_epsilon = 1e-5;
  bool swiglu = false;
  // Megatron main's gpt-oss activation: --quick-geglu (gated MLP, gate through a·σ(1.702·a)),
  // --glu-linear-offset (added to the linear half; gated MLPs only) and
  // --activation-func-clamp-value (NaN: unset; gate clamped from above, linear half to ±value).
  bool quick_geglu = false;
  double glu_linear_offset = 0.0;
  double activation_func_clamp_value = std::numeric_limits<double>::quiet_NaN();
  // MindSpeed-LLM's Gemma flags (train/arguments_gemma.cc): --geglu (gated MLP, gate through the
  // exact erf GeLU, Gemma v1's recipe), --gelu-tanh (the same with the tanh GeLU, Hugging Face's
  // gelu_pytorch_tanh), --add-rmsnorm-offset (RMSNorm scales by 1 + w) and --input-embeds-norm
  // (the embedding's output × √hidden_size, rounded to the training dtype).
  bool geglu = false;
  bool gelu_tanh = false;
  bool add_rmsnorm_offset = false;
  bool input_embeds_norm = false;
  bool gated_mlp() const { return swiglu || quick_geglu || geglu || gelu_tanh; }
  bool openai_gelu = false;  // --openai-gelu: tanh GeLU
  bool embed_layernorm = false;  // --embed-layernorm: a norm after the embedding (Bloom; ModelConfig)
  bool squared_relu = false;  // --squared-relu: max(x, 0)² MLP activation
  bool apply_layernorm_1p = false;  // --apply-layernorm-1p: norm weights stored zero-centred (scale 1 + w)
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;  // --disable-bias-linear sets false
  bool add_qkv_bias = false;
  int64_t make_vocab_size_divisible_by = 128;
  double attention_dropout = 0.1;
  double hidden_dropout = 0.1;
  double init_method_std = 0.02;
  bool init_method_xavier_uniform = false;  // --init-method-xavier-uniform: weight matrices U(±√(6/(fan_in+fan_out)))
  // Megatron's activation recomputation (--recompute-granularity full|selective, --recompute-method
  // uniform|block, --recompute-num-layers N; --recompute-activations = selective).
  std::string recompute_granularity;  // "" (none), "full" or "selective"
  std::string recompute_method;       // "" or, with full, "uniform" or "block"
  int64_t recompute_num_layers = kUnset;
  bool recompute_activations = false;
  // --distribute-saved-activations: with full recomputation and TP (without SP), each TP rank keeps
  // 1/TP of every recomputed group's input; backward all-gathers it before the rerun.
  bool distribute_saved_activations = false;
  // MindSpeed's RiPipe (features/feature_recompute_in_advance.cc, feature_recompute_in_bubble.cc):
  // recompute as a step of the interleaved schedule, run before its backward is due.
  bool recompute_in_advance = false;
  bool recompute_in_bubble = false;
  // MindSpeed's --enable-recompute-layers-per-pp-rank (features/feature_enable_recompute_layers_per_pp_rank.cc):
  // --recompute-method block's --recompute-num-layers counts the layers of the pipeline rank (all
  // its virtual stages) instead of each model chunk's.
  bool enable_recompute_layers_per_pp_rank = false;
  // --recompute-modules (selective; Megatron's default core_attn): what selective recomputation
  // covers. Gale implements core_attn (never kept anyway) and layernorm (both norms' outputs).
  std::vector<std::string> recompute_modules;
  // --noop-layers "0,23": global indices of identity layers (MindSpeed), parsed by validation.
  std::string noop_layers_flag;
  std::vector<int64_t> noop_layers;  // sorted, unique
  // --mtp-num-layers (unset: no multi-token prediction) and --mtp-loss-scaling-factor (Megatron's
  // 0.1): DeepSeek-V3 MTP layers after the decoder (model/gpt_model.h).
  int64_t mtp_num_layers = kUnset;
  double mtp_loss_scaling_factor = 0.1;

  // Megatron's hybrid Mamba model (pretrain_mamba.py; train/arguments_hybrid.cc, model/mamba_mixer.h,
  // model/hybrid_layers.h): --is-hybrid-model, the layer allocation and the Mamba-2 mixer's sizes.
  bool is_hybrid_model = false;
  double hybrid_attention_ratio = 0.0;
  double hybrid_mlp_ratio = 0.0;
  std::string hybrid_override_pattern;  // "" (None)
  // Megatron main's deprecated --mtp-hybrid-override-pattern ("": None): validation folds it into
  // hybrid_override_pattern's '/' depths (train/arguments_hybrid.cc).
  std::string mtp_hybrid_override_pattern;
  int64_t mamba_state_dim = 128;
  int64_t mamba_head_dim = 64;
  int64_t mamba_num_groups = 8;
  // --mamba-training-ssm-states-dtype fp32|bf16 ("": Megatron's None, the parameters' dtype).
  std::string mamba_training_ssm_states_dtype;
  // Megatron's --heterogeneous-layers-config-path / --heterogeneous-layers-config-encoded-json
  // (train/arguments_heterogeneous.cc, train/heterogeneous_config.h): "" (None). Validation reads
  // the file into the encoded JSON, which checkpoints keep (as Megatron).
  std::string heterogeneous_layers_config_path;
  std::string heterogeneous_layers_config_encoded_json;

  // Megatron-Core multi-latent attention (train/arguments_mla.cc, model/mla_attention.h).
  bool multi_latent_attention = false;
  int64_t q_lora_rank = kUnset;  // None: a direct query projection
  int64_t kv_lora_rank = 32;
  int64_t qk_head_dim = 128;
  int64_t qk_pos_emb_head_dim = 64;
  int64_t v_head_dim = 128;
  bool mla_down_proj_fusion = false;  // --mla-down-proj-fusion (model/mla_down_proj.h)
  // MindSpeed's --qat-scheme / --qat-quant-block-size (features/feature_qat.cc, model/qat.h):
  // "" (none) or w4a16-mxfp4[-moe-only] / w8a16-mxfp8[-moe-only]; MX blocks of 32 or 128.
  std::string qat_scheme;
  int64_t qat_quant_block_size = 32;
  // Megatron's FP8 flags (train/arguments_fp8.cc, features/feature_fp8.cc, model/fp8.h), emulated.
  std::string fp8_format;                       // --fp8-format: "" (none), e4m3 or hybrid
  std::string fp8_recipe = "delayed";           // --fp8-recipe: delayed, tensorwise or mxfp8
  int fp8_margin = 0;                           // --fp8-margin
  int fp8_interval = 1;                         // --fp8-interval (deprecated in Megatron: ignored)
  int64_t fp8_amax_history_len = 1;             // --fp8-amax-history-len
  std::string fp8_amax_compute_algo = "most_recent";  // --fp8-amax-compute-algo: most_recent or max
  bool fp8_wgrad = true;                        // false: --no-fp8-wgrad
  bool fp8_param_gather = false;                // --fp8-param-gather (refused: feature_fp8.cc)
  bool first_last_layers_bf16 = false;          // --first-last-layers-bf16
  int64_t num_layers_at_start_in_bf16 = 1;      // --num-layers-at-start-in-bf16
  int64_t num_layers_at_end_in_bf16 = 1;        // --num-layers-at-end-in-bf16
  bool qk_layernorm = false;      // per-head q/k norms (with MLA: norms on the q and kv latents)
  bool qk_l2_norm = false;        // --qk-l2-norm: weightless per-head q/k L2 norms (ModelConfig::qk_l2_norm)
  std::string rope_type;          // "" (None: yarn with MLA, rope otherwise), "rope" or "yarn"
  double rotary_scaling_factor = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  // --position-embedding-type yarn (train/arguments_yarn.cc): Megatron's yarn_* flags; unset: the
  // YarnConfig defaults (4096, 32, 1). --rotary-scaling-factor, --mscale and --mscale-all-dim above
  // are shared with MLA's YaRN, as in Megatron.
  int64_t yarn_original_max_position_embeddings = kUnset;
  double yarn_beta_fast = kUnsetF;
  double yarn_beta_slow = kUnsetF;
  bool yarn_correction_range_round_to_int = true;
  // MindSpeed-LLM's LongRoPE (Phi-3 / Phi-3.5; train/arguments_longrope.cc, model/longrope_rope.h):
  // --rope-scaling-type ("" unset; only longrope is read), --rope-scaling-original-max-position-embeddings,
  // --long-factor / --short-factor as given (comma-separated) and parsed (one per rotary pair; filled by
  // validate_longrope_args), --long-mscale / --short-mscale (both or neither) and --longrope-freqs-type.
  std::string rope_scaling_type;
  int64_t rope_scaling_original_max_position_embeddings = kUnset;
  std::string long_factor, short_factor;
  std::vector<double> long_factors, short_factors;
  double long_mscale = kUnsetF, short_mscale = kUnsetF;
  std::string longrope_freqs_type = "mul";
  // Megatron-Core's --experimental-attention-variant dsa (DeepSeek sparse attention, with MLA;
  // train/arguments_mla.cc, model/dsa_indexer.h): "" (none) or "dsa", and the indexer's flags.
  std::string experimental_attention_variant;
  int64_t dsa_indexer_n_heads = kUnset;
  int64_t dsa_indexer_head_dim = kUnset;
  int64_t dsa_indexer_topk = kUnset;
  double dsa_indexer_loss_coeff = 0.0;  // Megatron's None: no indexer loss
  bool dsa_indexer_use_sparse_loss = false;
  // Megatron-Core's Gated DeltaNet (--experimental-attention-variant gdn, its deprecated spelling
  // gated_delta_net normalised to gdn; train/arguments_gdn.cc, model/gated_delta_net.h).
  std::string linear_attention_freq;  // "" (None), an int N or a list expression
  int64_t linear_conv_kernel_dim = 4;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_num_key_heads = 16;
  int64_t linear_num_value_heads = 32;
  std::vector<int> linear_attention_pattern;  // derived: one entry per layer, 1 = GDN

  // Derived by validation.
  int64_t num_kv_heads = 0;       // = num_query_groups with GQA, else num_attention_heads
  int64_t padded_vocab_size = 0;  // set once the tokenizer's vocabulary is known
};

struct TrainingArgs {
  int64_t micro_batch_size = kUnset;
  int64_t global_batch_size = kUnset;  // -> micro_batch_size * data_parallel_size
  // --rampup-batch-size <start batch size> <batch size increment> <ramp-up samples> as given (empty:
  // constant global batch size); read by num_micro_batches_calculator_from_args (model_setup.h).
  std::vector<std::string> rampup_batch_size;
  // Run each iteration on the global batch size rounded down to a multiple of micro-batch size ·
  // DP instead of refusing it (Megatron's flag; the rest counts as skipped samples).
  bool decrease_batch_size_if_needed = false;
  int64_t train_iters = kUnset;
  int64_t train_samples = kUnset;
  int64_t exit_interval = kUnset;
  bool skip_train = false;  // --skip-train: no iterations; the validation and test evaluations only
  // --freeze-all-layers (Megatron main): every parameter frozen; each iteration runs its
  // micro-batches forward only (losses as evaluation computes them), with no optimizer step and no
  // optimizer state; the iteration, consumed samples and learning-rate schedule still advance.
  bool freeze_all_layers = false;
  double exit_duration_in_mins = kUnsetF;
  bool exit_signal_handler = false;  // --exit-signal-handler: SIGTERM saves a checkpoint and exits (train/exit_signal.h)
  int64_t seed = 1234;
  // --data-parallel-random-init: data-parallel rank r initialises its parameters with seed + 10·r
  // (Megatron's _set_random_seed), then every rank takes data-parallel rank 0's values before
  // training (Megatron's DDP broadcast_params), as pretrain_gpt.py does.
  bool data_parallel_random_init = false;
  std::string optimizer = "adam";  // adam is AdamW (decoupled weight decay), as in Megatron
  // --dump-param-to-param-group-map (Megatron-LM main): where to write the parameter -> param-group map
  // at start-up ("": not written; train/param_group_map.h).
  std::string dump_param_to_param_group_map;
  double lr = kUnsetF;
  double min_lr = 0.0;
  // --decoupled-lr / --decoupled-min-lr: the peak and floor of the word embedding's and output
  // layer's rate (the same schedule; the floor defaults to --min-lr). NaN: not given.
  double decoupled_lr = kUnsetF, decoupled_min_lr = kUnsetF;
  std::string lr_decay_style = "linear";
  int64_t lr_decay_iters = kUnset;
  int64_t lr_decay_samples = kUnset;
  int64_t lr_warmup_iters = 0;
  int64_t lr_warmup_samples = 0;
  double lr_warmup_fraction = kUnsetF;
  double lr_warmup_init = 0.0;
  std::string lr_wsd_decay_style = "exponential";
  int64_t lr_wsd_decay_iters = kUnset;
  int64_t lr_wsd_decay_samples = kUnset;
  double weight_decay = 0.01;
  double start_weight_decay = kUnsetF;
  double end_weight_decay = kUnsetF;
  std::string weight_decay_incr_style = "constant";
  double clip_grad = 1.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double sgd_momentum = 0.9;
  // --optimizer-selection (MindSpeed): fused_adamw (default) and fused_torch_adamw are the same
  // AdamW; fused_ema_adamw also keeps an EMA of the parameters with decay --ema-decay
  // (optim/optimizer.h OptimizerConfig::ema; features/feature_fused_ema_adamw.cc).
  std::string optimizer_selection = "fused_adamw";
  double ema_decay = 0.9999;
  // --optimizer muon (Megatron's flags and defaults; optim/optimizer.h MuonConfig).
  double muon_momentum = 0.9;
  bool muon_nesterov = false;
  bool muon_split_qkv = true;  // --muon-no-split-qkv
  std::string muon_scale_mode = "spectral";
  std::string muon_fp32_matmul_prec = "medium";
  std::string muon_coefficient_type = "quintic";
  int64_t muon_num_ns_steps = 5;
  std::string muon_tp_mode = "duplicated";
  bool muon_use_syrk = false;  // accepted; the CPU's Gram products are plain GEMMs either way
  double muon_extra_scale_factor = 1.0;
  std::string muon_scalar_optimizer = "adam";  // --muon-scalar-optimizer adam or lion
  // --optimizer lion / --muon-scalar-optimizer lion (optim/optimizer.h LionConfig): Lion's betas as
  // Muon's scalar optimizer (--optimizer lion's own Lion takes --adam-beta1/2, as Megatron).
  double lion_beta1 = 0.95;
  double lion_beta2 = 0.98;
  // --apply-wd-to-qk-layernorm (Megatron main; Qwen3-Next's rule): weight decay also on the
  // q_layernorm / k_layernorm parameters (OptimizedBuffer::weight_decay). The deprecated
  // --no-weight-decay-cond-type apply_wd_to_qk_layernorm sets it (validation, with a warning).
  bool apply_wd_to_qk_layernorm = false;
  std::string no_weight_decay_cond_type;
  bool check_for_nan_in_loss_and_grad = true;
  // Megatron's --check-weight-hash-across-dp-replicas-interval N: before the first iteration and
  // every N iterations the parameters' hashes must agree across the data-parallel group
  // (train/param_hash.h).
  int64_t check_weight_hash_across_dp_replicas_interval = kUnset;
  // Megatron's --test-mode: before every training and evaluation iteration the --qk-layernorm
  // parameters must be equal across the data- and tensor-parallel replicas (train/param_hash.h).
  bool test_mode = false;
  bool bf16 = false;  // bf16 weights and GEMM inputs; f32 master weights, gradients and optimizer state
  // --reuse-fp32-param (MindSpeed, level 2; features/feature_reuse_fp32_param.cc): with --bf16 the
  // f32 masters of the linear layers' weights are kept as their bf16 copy + a 16-bit residual (2
  // bytes per parameter less). `gale pretrain` clears it below --optimization-level 2.
  bool reuse_fp32_param = false;
  // --swap-optimizer (MindSpeed, level 2; features/feature_swap_optimizer.cc, optim/state_swap.h):
  // the optimizer's fp32 state in an anonymous file in --swap-optimizer-dir ("" = $TMPDIR or
  // /tmp), brought back in --swap-optimizer-times chunks during the step. `gale pretrain` clears it
  // below --optimization-level 2.
  bool swap_optimizer = false;
  int64_t swap_optimizer_times = 16;
  std::string swap_optimizer_dir;
  // --quant-states fp8|mxfp8|hif8 (MindSpeed's low-precision optimizer, level 0;
  // features/feature_low_precision_optimizer.cc, kernels/cpu/quant_states.h): Adam's moments stored
  // as FP8 or HiFloat8 codes with block scales ("" = f32). --quant-grads: the main gradients held as
  // FP16 with a per-parameter scale between micro-batches and through the data-parallel sum
  // (optim/quant_grads.h).
  std::string quant_states;
  bool quant_grads = false;
  // Megatron's precision-aware optimizer (features/feature_precision_aware_optimizer.cc,
  // train/arguments_precision.cc, kernels/cpu/scaled_states.h): --use-precision-aware-optimizer with
  // --exp-avg-dtype / --exp-avg-sq-dtype fp32|fp16|fp8 (Adam's moments stored so, with one f32 scale
  // per optimizer segment), --main-grads-dtype fp32|bf16 (bf16: with --bf16 the gradients are
  // reduced in bf16, bf16_grad_reduce) and --main-params-dtype fp32|fp16 (fp16: not supported yet).
  // Without the flag every dtype must stay fp32 (Megatron's rule).
  bool use_precision_aware_optimizer = false;
  std::string main_grads_dtype = "fp32";
  std::string main_params_dtype = "fp32";
  std::string exp_avg_dtype = "fp32";
  std::string exp_avg_sq_dtype = "fp32";
  // Megatron's --grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 (as given): see
  // bf16_grad_reduce().
  bool grad_reduce_in_bf16 = false;
  bool accumulate_allreduce_grads_in_fp32 = false;
  // Whether the data-parallel gradient reduction runs in bf16 (Megatron's bf16 gradient buffer):
  // with --bf16, when --grad-reduce-in-bf16 or --main-grads-dtype bf16 is given (Megatron's
  // validate_args; without --bf16 Megatron's buffer has the parameters' dtype and the flags change
  // nothing, nor do they in Gale).
  bool bf16_grad_reduce() const { return bf16 && (grad_reduce_in_bf16 || main_grads_dtype == "bf16"); }
  // --swap-attention (MindSpeed, level 2; features/feature_swap_attention.cc, model/activation_swap.h):
  // each layer's attention activations kept for backward go to an anonymous file in
  // --swap-attention-dir after its forward and come back, one layer ahead, in backward.
  // --swap-modules: which (input_norm, self_attention, post_attention_norm; MindSpeed's default all
  // three). `gale pretrain` clears it below --optimization-level 2.
  bool swap_attention = false;
  std::vector<std::string> swap_modules = {"input_norm", "self_attention", "post_attention_norm"};
  std::string swap_attention_dir;
  // --swap-layer-input (MindSpeed's SwapLayerInputFeature, level 2; features/feature_swap_layer_input.cc):
  // each layer's input kept for backward goes to the same file as --swap-attention's (in
  // --swap-attention-dir) and comes back one layer ahead. `gale pretrain` clears it below
  // --optimization-level 2.
  bool swap_layer_input = false;
  // --smart-swap (MindSpeed's SmartSwapFeature, level 2; features/feature_smart_swap.cc,
  // model/smart_swap.h): after --smart-swap-warmup-iters plain iterations (the last one sampled with
  // the allocator's accounting) the layers whose activations go to a file in --swap-attention-dir
  // are chosen so that the peak drops by --smart-swap-reduction-mb (MindSpeed's default 3 GiB) or
  // to --smart-swap-target-mb (> 0), and swapped so for the rest of training. `gale pretrain`
  // clears it below --optimization-level 2.
  bool smart_swap = false;
  int64_t smart_swap_warmup_iters = 2;
  double smart_swap_reduction_mb = 3072.0;
  double smart_swap_target_mb = 0.0;
  // --compress-optimizer (MindSpeed's CompressOptimizerFeature, level 2;
  // features/feature_compress_optimizer.cc, optim/state_swap.h): the optimizer's fp32 state held
  // losslessly compressed in memory, decompressed one chunk at a time for the step.
  // --compress-activation (CompressActivationFeature, level 2; model/activation_compress.h): "" off,
  // "0" every layer, or 1-based layer numbers and ranges ("1-3,5") whose saved activations are held
  // compressed between forward and backward. --compress-dense (AnsCompressTensorFeature, level 2):
  // disable, level0 or level1: each dense MLP's fc1 output held compressed (level1: its raw mantissa
  // bytes in a temporary file). `gale pretrain` clears them below --optimization-level 2.
  bool compress_optimizer = false;
  std::string compress_activation;
  std::string compress_dense = "disable";
  bool fp16 = false;  // the same in f16, with loss scaling (optim/grad_scaler.h)
  // --fp16's loss scaling (Megatron's flags and defaults): --loss-scale S gives a constant scale;
  // without it the scale is dynamic, starting at --initial-loss-scale.
  double loss_scale = kUnsetF;
  double initial_loss_scale = 4294967296.0;  // 2^32
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  int num_threads = 0;  // Gale: OpenMP threads (0 = OMP_NUM_THREADS or all cores)
  // --calculate-per-token-loss (Megatron): each micro-batch's loss is its summed token loss, and
  // the gradients, summed (not averaged) over micro-batches and data-parallel ranks, are divided
  // once by the iteration's loss tokens over the data-parallel group (train/grad_sync.h).
  bool calculate_per_token_loss = false;
  // --iterations-to-skip N [N ...] as given, and parsed: the iterations (counted from 0: the
  // number of iterations done before it) that draw their batch and run nothing (Trainer::run).
  std::vector<std::string> iterations_to_skip_flag;
  std::vector<int64_t> iterations_to_skip;
};

struct ParallelArgs {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t num_layers_per_virtual_pipeline_stage = kUnset;
  int64_t num_virtual_stages_per_pipeline_rank = kUnset;
  int64_t microbatch_group_size_per_virtual_stage = kUnset;  // Megatron default: the pipeline size
  int64_t decoder_first_pipeline_num_layers = kUnset;
  int64_t decoder_last_pipeline_num_layers = kUnset;
  // Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split:
  // the input embedding (the loss) counts as one layer of the first (last) virtual stage when the
  // layers are divided among the stages (train/engine.h chunk_layers).
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  // Explicit layers of every pipeline stage, as given: MindSpeed-LLM's --num-layer-list "1,3,3,1"
  // (one count per pipeline rank, no virtual stages) and MindSpeed's
  // --pipeline-num-transformer-layers "[[0,1],[1,1]*2,[3,0]]" (one row per pipeline rank, one
  // count per virtual stage of that rank; `[..]*n` repeats a row n times). Validation parses the
  // one given into pipeline_layers[pp rank][virtual stage] (empty when neither is given);
  // train/engine.h chunk_layers places the layers from it.
  std::string num_layer_list;
  std::string pipeline_num_transformer_layers;
  // Megatron's --pipeline-model-parallel-layout "Et*3|(tt|)*29,m|L" (train/pipeline_layout.h):
  // every (pipeline rank, virtual stage)'s layers as symbols; the stage count gives the VPP size.
  std::string pipeline_model_parallel_layout;
  std::vector<std::vector<int64_t>> pipeline_layers;
  // MindSpeed's --automated-pipeline (features/feature_automated_pipeline.cc, train/automated_pipeline.h):
  // before training, profile a few iterations at the even split, search the layer split and the
  // per-stage full-layer recomputation for the 1F1B step under a memory limit of
  // (1 - save_memory_ratio) x the even split's largest stage, record the policy in
  // automated_pipeline_config (JSON, docs/formats/automated-pipeline.md; a matching entry there
  // skips the profiling) and train with it. --automated-pipeline-perf (MindSpeed's performance
  // mode) is refused by the parser as not supported yet.
  bool automated_pipeline = false;
  double save_memory_ratio = 0.20;
  std::string automated_pipeline_config = "autopipeline_config.json";
  // Set by the policy (not a flag): full-layer recomputation of the first k layers of pipeline
  // rank r's stage, k = recompute_layers_per_stage[r] (empty: the --recompute-* flags apply).
  std::vector<int64_t> recompute_layers_per_stage;
  // MindSpeed's --schedules-method: "" (Megatron's 1F1B / interleaved 1F1B) or "dualpipev"
  // (DeepSeek's DualPipeV: 2·PP layer chunks, rank r holding chunks r and 2·PP−1−r; validation
  // then sets virtual_pipeline_model_parallel_size to 2, the chunks per rank; train/engine.h).
  std::string schedules_method;
  // MindSpeed's --dualpipev-dw-detach (DualPipeV only): some backward steps send their input
  // gradient before the linears' weight gradients, which run later in the schedule's bubbles
  // (schedule/pipeline_order.h dualpipev_order, model/weight_grad_store.h).
  bool dualpipev_dw_detach = false;
  int64_t context_parallel_size = 1;
  std::string context_parallel_algo = "megatron_cp_algo";  // MindSpeed's --context-parallel-algo
  // Megatron's --cp-comm-type as given (one type, or one per layer; empty = p2p) and its resolved
  // value: p2p (ring attention) or allgather for megatron_cp_algo. a2a and a2a+p2p resolve to
  // ulysses_cp_algo and hybrid_cp_algo (context_parallel_algo, ulysses_degree_in_cp) with p2p here.
  std::vector<std::string> cp_comm_type_list;
  std::string cp_comm_type = "p2p";
  // Megatron's --hierarchical-context-parallel-sizes (as given; their product must be the CP size).
  std::vector<std::string> hierarchical_context_parallel_sizes;
  // MindSpeed's --ulysses-degree-in-cp: U, the Ulysses sub-group size of hybrid_cp_algo (0 = unset;
  // only valid with that algorithm; 1 < U < CP, U dividing CP).
  int64_t ulysses_degree_in_cp = 0;
  // MindSpeed's --cp-window-size W: ring attention as a double ring, an inner ring of W consecutive
  // ranks of the ring group and an outer ring across the windows (1: one ring; 1 <= W < ring size,
  // W dividing it; model/ring_attention.h).
  int64_t cp_window_size = 1;
  // MindSpeed's --context-parallel-kv-cache-policy ("" = none, full, half) and
  // --context-parallel-cache-interval k: ring attention keeps the key/value blocks (full) or the
  // keys (half) it received in forward for backward, in every layer (k = 0) or every (k + 1)-th.
  std::string context_parallel_kv_cache_policy;
  int64_t context_parallel_cache_interval = 0;
  // MindSpeed's --use-ulysses-allgather-kv: under ulysses_cp_algo with one query group per TP rank,
  // all-gather the keys and values and all-to-all only the queries (model/core_attention.h).
  bool use_ulysses_allgather_kv = false;
  // MindSpeed's adaptive CP (--context-parallel-algo adaptive_cp_algo; parallel/adaptive_cp.h):
  // --adaptive-cp-only-reschedule keeps the sequence in order (no remap), --adaptive-cp-without-coarse
  // remaps single positions instead of units of S/1024, --adaptive-cp-dynamic-attn-mask computes the
  // layout for every micro-batch (required with document masks), --attention-mask-on-cpu has no
  // effect (Gale derives the blocks on the host from the document ids), and
  // --adaptive-cp-manually-set-mask-list is refused (MindSpeed's user-edited Python hook).
  // Resolved: --context-parallel-algo adaptive_cp_algo, or hybrid_adaptive_cp_algo, which then
  // reads hybrid_cp_algo in context_parallel_algo (Ulysses groups, their rings adaptive).
  bool adaptive_cp = false;
  bool adaptive_cp_only_reschedule = false;
  bool adaptive_cp_without_coarse = false;
  bool adaptive_cp_dynamic_attn_mask = false;
  bool attention_mask_on_cpu = false;
  bool adaptive_cp_manually_set_mask_list = false;
  int64_t expert_model_parallel_size = 1;
  // MindSpeed's --unaligned-linear: the attention's query groups (with their heads) and the FFN's
  // columns need not be divisible by the TP size; the first ranks hold one more (model/layer_shares.h).
  bool unaligned_linear = false;
  // MindSpeed's --tp-2d --tp-x X --tp-y Y (TP2dFeature; features/feature_tp_2d.cc): the TP group as an
  // X×Y grid, X·Y = --tensor-model-parallel-size (model/tp2d_layer.h). Validated by validate_tp2d.
  bool tp_2d = false;
  int64_t tp_x = 1, tp_y = 1;
  bool sequence_parallel = false;
  bool use_distributed_optimizer = false;
  // Megatron's custom FSDP (--use-custom-fsdp, newer Megatron's --use-megatron-fsdp) with
  // --data-parallel-sharding-strategy no_shard|optim|optim_grads|optim_grads_params (default
  // no_shard). validate_parallel_args resolves it: no_shard is plain data parallelism, optim is
  // ZeRO-1 and turns on use_distributed_optimizer, optim_grads is ZeRO-2 and optim_grads_params
  // ZeRO-3 (zero2() / zero3() below; docs/parallelism.md §16).
  bool use_custom_fsdp = false;
  std::string data_parallel_sharding_strategy = "no_shard";
  // ZeRO-3: --use-custom-fsdp with optim_grads_params, or MindSpeed's --layerzero (build_engine:
  // optim/zero3_sync.h); ZeRO-2: --use-custom-fsdp with optim_grads.
  bool zero3() const {
    return layerzero || use_torch_fsdp2 || (use_custom_fsdp && data_parallel_sharding_strategy == "optim_grads_params");
  }
  bool zero2() const { return use_custom_fsdp && data_parallel_sharding_strategy == "optim_grads"; }
  // MindSpeed's --layerzero --layerzero-config FILE (features/feature_layerzero.cc): ZeRO-3 inside
  // sub-groups of zero3_size consecutive DP ranks, the optimizer state sharded over the whole DP
  // group. layerzero_zero3_size is read from the file by validate_parallel_args.
  bool layerzero = false;
  std::string layerzero_config;
  int64_t layerzero_zero3_size = 0;
  // Megatron's --use-torch-fsdp2 with MindSpeed's --fsdp2-config-path FILE.yaml
  // (features/feature_torch_fsdp2.cc; train/fsdp2_config.h): ZeRO-3 over groups of
  // fsdp2_sharding_size consecutive DP ranks (the whole DP group without the file), replicated
  // across the groups (HSDP). The fsdp2_* fields below are read from the file by
  // validate_parallel_args (Megatron's defaults without it).
  bool use_torch_fsdp2 = false;
  std::string fsdp2_config_path;
  bool torch_fsdp2_no_reshard_after_forward = false;  // Megatron-LM main: reshard_after_forward false
  int64_t fsdp2_sharding_size = 0;
  bool fsdp2_wrap_embedding = true, fsdp2_wrap_layers = true, fsdp2_wrap_head = false;
  bool fsdp2_reshard_after_forward = true;
  int64_t fsdp2_forward_prefetch = 0;
  // Megatron's --num-distributed-optimizer-instances N ("partial DistOpt"): the dp-cp group splits
  // into N instances of DP·CP/N consecutive ranks; optimizer state is sharded inside an instance
  // and replicated across instances (engine.h, optim/data_parallel_sync.h).
  int64_t num_distributed_optimizer_instances = 1;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  // Megatron's --overlap-param-gather-with-optimizer-step: the first model chunk's all-gather (one
  // bucket) starts as soon as the optimizer has updated that chunk, while it updates the others.
  bool overlap_param_gather_with_optimizer_step = false;
  // Megatron's DDP precision and all-gather-group flags (train/arguments_ddp_precision.cc; validated
  // by features/feature_ddp_precision.cc; optim/data_parallel_sync.h DataParallelConfig).
  bool ddp_reduce_scatter_with_fp32_accumulation = false;
  std::vector<std::string> ddp_param_name_patterns_for_fp32_local_accumulation;
  bool create_all_gather_group = false;
  // MindSpeed's --reset-bucket-group-order (features/feature_reset_bucket_group_order.cc): the
  // all-gather prefetch follows the order the first forward used the buckets in
  // (DataParallelConfig::reset_bucket_group_order). Cleared below --optimization-level 2.
  bool reset_bucket_group_order = false;
  // MindSpeed's --optimize-send-recv-comm (features/feature_optimize_send_recv_comm.cc): the 1F1B
  // schedule's gradients travel on a second communicator over the pipeline group's ranks
  // (Engine::pp_backward). Cleared below --optimization-level 2.
  bool optimize_send_recv_comm = false;
  // MindSpeed's --use-multiparameter-pipeline-model-parallel
  // (features/feature_use_multiparameter_pipeline_model_parallel.cc): the pipeline stages exchange
  // a list of typed tensors (Engine::stage_tensors). Cleared below --optimization-level 2.
  bool use_multiparameter_pipeline_model_parallel = false;
  // MindSpeed's --param-and-grad-buffer-pad N (features/feature_param_and_grad_buffer_pad.cc): every
  // gradient bucket (and, with the distributed optimizer, every rank's shard of it) starts at a
  // multiple of N bytes of the flat buffers (DataParallelConfig::buffer_pad). kUnset: none. Cleared
  // below --optimization-level 2.
  int64_t param_and_grad_buffer_pad = kUnset;
  bool use_tp_pp_dp_mapping = false;
  int64_t ddp_bucket_size = kUnset;  // gradient bucket elements (default: Megatron's max(40M, 1M·dp))
  // Megatron's --ddp-num-buckets N: the bucket size becomes this rank's parameter count (all its
  // chunks) / N (excludes --ddp-bucket-size); build_engine applies it.
  int64_t ddp_num_buckets = kUnset;
  std::string distributed_backend = "mpi";  // Megatron's default is nccl; Gale maps nccl to mpi on CPUs
  int64_t distributed_timeout_minutes = 10;

  // MindSpeed's --dist-train with MindSpeed-MM's --mm-model FILE (features/feature_dist_train.cc,
  // train/dist_train_config.h): the job's ranks in sub-worlds of their own TP/PP/DP layouts, one
  // after another along the model's layers.
  bool dist_train = false;
  std::string mm_model;

  // Derived.
  int64_t world_size = 1;
  int64_t data_parallel_size = 1;
  // --dist-train: the rank map of the whole job and this rank's sub-world in it; the sizes above
  // are this rank's view (its sub-world's TP, the whole pipeline's stages as PP, with the stages'
  // layers as --num-layer-list).
  DistTrainLayout dist_train_layout;
  int dist_train_subworld = -1;
  int64_t virtual_pipeline_model_parallel_size = 1;  // model chunks per pipeline rank (1: no interleaving)
};

struct DataArgs {
  std::vector<std::string> data_path;
  std::string split;  // "" -> "969, 30, 1" when --data-path is given
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string data_args_path, per_split_data_args_path;
  bool mock_data = false;
  std::string data_cache_path;
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  // MindSpeed's --fix-sub-seq-length L (features/feature_fix_sub_seq_length.cc): with
  // --reset-attention-mask and 0 < L <= --seq-length, attention blocks are the consecutive runs of
  // L positions of each sample (the last one shorter), not its documents; otherwise (default -1)
  // the documents. Cleared below --optimization-level 2.
  int64_t fix_sub_seq_length = -1;
  int64_t num_workers = 2;
  bool mmap_bin_files = true;  // --no-mmap-bin-files
  // Megatron's --dataloader-type: "single" (MegatronPretrainingSampler: consecutive indices from the
  // consumed samples on) or "cyclic" (MegatronPretrainingRandomSampler under cyclic_iter, with
  // --no-data-sharding; data/random_sampler.h); "external" is refused (not supported yet).
  std::string dataloader_type = "single";
  bool data_sharding = true;  // --no-data-sharding
  // MindSpeed-LLM's --is-instruction-dataset: --data-path P names P_packed_{input_ids,attention_mask,
  // labels}_document made by `gale preprocess --handler-name AlpacaStyleInstructionHandler`.
  bool is_instruction_dataset = false;
  // MindSpeed-LLM's --neat-pack: the instruction dataset was preprocessed with --pack --neat-pack;
  // with --reset-attention-mask (required) attention stays inside each packed sample.
  bool neat_pack = false;
  // Megatron's --variable-seq-lengths: micro-batches may have different sequence lengths. With an
  // instruction dataset each micro-batch is padded only to its longest sample (MindSpeed-LLM's
  // collator, PaddingStrategy.LONGEST); the feature manager turns it off below level 2
  // (features/feature_variable_seq_lengths.cc).
  bool variable_seq_lengths = false;
  // Megatron's --fim-data (GPTFIMDataset; data/fim_dataset.h) and its flags. The optional ones are
  // unset while their `has_` flag is false (Megatron's None).
  bool fim_data = false;
  double fim_rate = 0.5, fim_spm_rate = 0.5;
  std::string fim_split_sample;
  bool has_fim_split_sample = false;
  double fim_fragment_rate = 0.0;
  bool has_fim_fragment_rate = false;
  std::string fim_no_prefix;
  bool has_fim_no_prefix = false;
  std::string fim_prefix_token = "<fim_prefix>", fim_middle_token = "<fim_middle>",
              fim_suffix_token = "<fim_suffix>", fim_pad_token = "<fim_pad>", fim_eod_token = "<|endoftext|>";
  // Megatron-LM main's --sft (data/sft_dataset.h): --data-path names a JSONL file of "messages"
  // conversations, tokenized by --tokenizer-type SFTTokenizer with --sft-tokenizer-prompt-format,
  // packed with one attention document per conversation.
  bool sft = false;
  std::string sft_tokenizer_prompt_format = "nemotron-h-aligned";
  // Megatron's --dataloader-inter-document-masking: attention and position ids restart at every
  // document boundary of a pretraining sample (the dataset's sequences, EOD or not).
  bool dataloader_inter_document_masking = false;
  // Megatron-LM main's --mid-level-dataset-surplus (BlendedMegatronDatasetConfig): each dataset of a
  // weighted blend is built with ceil(ceil(n·w) · (1 + surplus)) samples for a split of n samples,
  // which decides its epochs and so its sample order (data/blending.h). Finite and > -1.
  double mid_level_dataset_surplus = 0.005;
  // Megatron-LM main's --per-dataset-sequences-path FILE: a JSON object {prefix: [sequence_count,
  // document_count]} (tools/build_sequences_per_dataset.py's output) that stands for the .idx headers,
  // with the token dtype taken from the tokenizer's vocabulary size (data/sequences_per_dataset.h).
  std::string per_dataset_sequences_path;
  // Megatron-LM main's --allow-ambiguous-pad-tokens: keep the tokenizer's pad id even when it equals
  // its end-of-document id (labels equal to it then get no loss); otherwise such a pad becomes -1
  // (data/pad_token.h).
  bool allow_ambiguous_pad_tokens = false;
  // Megatron-LM main's --phase-transition-iterations (train/phase_transitions.h): the text as given
  // and its iterations, sorted by validate_phase_args; empty: off. phase_resume_iteration is no
  // flag: the iteration the run resumes at, which sizes the phase's training dataset
  // (pretrain_sample_counts); gale pretrain sets it before building the data.
  std::string phase_transition_iterations;
  std::vector<int64_t> phase_transitions;
  int64_t phase_resume_iteration = 0;
  // Megatron-LM main's --dataloader-fast-cache-load and --dataloader-defer-npy-index-mmap
  // (data/index_cache.h; both need every index in --data-cache-path).
  bool dataloader_fast_cache_load = false;
  bool dataloader_defer_npy_index_mmap = false;
  // Whether samples carry document ids that restrict attention (--reset-attention-mask, --sft,
  // --dataloader-inter-document-masking).
  bool document_attention() const { return reset_attention_mask || sft || dataloader_inter_document_masking; }
};

// Megatron's --tokenizer-type values Gale does not read yet: accepted by the parser so that start-up
// can say "not supported yet" instead of "not a valid choice".
inline const std::vector<std::string> kUnsupportedTokenizerTypes = {
    "BertWordPieceLowerCase", "BertWordPieceCase", "MultimodalTokenizer", "NullMultimodalTokenizer"};

struct TokenizerArgs {
  std::string tokenizer_type;  // "" -> GPT2BPETokenizer (pretrain_gpt's default), or NullTokenizer with --mock-data
  std::string vocab_file, merge_file, tokenizer_model;
  int64_t vocab_size = kUnset;
  int64_t vocab_extra_ids = 0;
  // TikTokenizer: --tiktoken-pattern v1|v2 (required there), --tiktoken-num-special-tokens
  // (Megatron's default 1000), --tiktoken-special-tokens (default <unk> <s> </s>).
  std::string tiktoken_pattern;
  int64_t tiktoken_num_special_tokens = 1000;
  std::vector<std::string> tiktoken_special_tokens;
};

// Megatron's --ckpt-format choices (megatron/training/arguments.py; zarr from its older releases).
inline constexpr const char* kCkptFormats[] = {"torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"};

struct CheckpointArgs {
  std::string save, load;
  int64_t save_interval = kUnset;
  bool load_optim = true;  // --no-load-optim
  bool load_rng = true;    // --no-load-rng
  bool save_optim = true;  // --no-save-optim
  bool save_rng = true;    // --no-save-rng
  bool finetune = false;
  bool exit_on_missing_checkpoint = false;
  // --override-ckpt-iteration N (Megatron main): a loaded checkpoint's iteration becomes N and its
  // consumed training samples N x --global-batch-size (skipped samples 0), so the data loader
  // replays from there; the optimizer and scheduler state load as saved. kUnset: off.
  int64_t override_ckpt_iteration = kUnset;
  // --use-ema (`gale generate`, `gale evaluate`; `gale convert` has its own): read the model's
  // weights from the checkpoint's parameter EMA (--optimizer-selection fused_ema_adamw) instead.
  bool use_ema = false;
  // --ckpt-format: one of kCkptFormats, accepted for Megatron's scripts; Gale always writes its own
  // format (docs/formats/checkpoint.md). --async-save needs one with an asynchronous save in Megatron.
  std::string ckpt_format = "torch_dist";
  // Megatron's --ckpt-convert-format torch --ckpt-convert-save DIR: load --load, write it in
  // Megatron's torch format to DIR/torch at this run's TP x PP, and exit (train/megatron_checkpoint.h).
  std::string ckpt_convert_format, ckpt_convert_save;
  // --async-save: each rank copies what it saves into host memory (peak host memory rises by that
  // copy) and a background thread writes the files; the tracker is written once all ranks finished.
  bool async_save = false;
  // --use-checkpoint-args: the model flags come from the checkpoint's args (gale generate /
  // evaluate: all of them; gale pretrain: Megatron's set, train/checkpoint_args.h), with
  // --use-mp-args-from-checkpoint-args also the parallel sizes, and the tokenizer model unless
  // --no-use-tokenizer-model-from-checkpoint-args.
  bool use_checkpoint_args = false;
  bool use_mp_args_from_checkpoint_args = false;
  bool use_tokenizer_model_from_checkpoint_args = true;
  int64_t ckpt_step = kUnset;         // --ckpt-step: load iter_<N> of --load, not the tracker's iteration
  // --pretrained-checkpoint: loaded as with --finetune when --load holds no checkpoint (Megatron).
  std::string pretrained_checkpoint;
  // What a resumed run takes of the saved learning-rate schedule (Megatron's _check_and_set): the
  // flags' values (override), the checkpoint's (use-checkpoint), or, with neither, the flags' with a
  // warning for each difference (Megatron stops there).
  bool override_opt_param_scheduler = false;
  bool use_checkpoint_opt_param_scheduler = false;
  // Megatron's non-persistent checkpoints (train/checkpointing.h, docs/formats/checkpoint.md):
  // every --non-persistent-save-interval iterations (when no persistent save falls there) a
  // checkpoint of type "global" (a normal checkpoint in --non-persistent-global-ckpt-dir, default
  // <save>/non_persistent, older ones removed) or "local" (each rank's part in
  // <--non-persistent-local-ckpt-dir>/<rank>/, with --non-persistent-local-ckpt-algo atomic: all the
  // rank holds, fully_parallel: one copy of everything over the job). --replication stores every
  // part on the --replication-factor ranks n, n+J, ... of its clique (J = --replication-jump).
  int64_t non_persistent_save_interval = kUnset;
  std::string non_persistent_ckpt_type;  // "" (none), global or local
  std::string non_persistent_global_ckpt_dir;
  std::string non_persistent_local_ckpt_dir;
  std::string non_persistent_local_ckpt_algo = "fully_parallel";
  bool replication = false;
  int64_t replication_jump = kUnset;
  int64_t replication_factor = 2;
};

struct LoggingArgs {
  int64_t log_interval = 100;
  bool log_throughput = false;
  // Megatron's straggler detector (train/straggler_detector.h): --log-straggler,
  // --disable-straggler-on-startup, --straggler-ctrlr-port, --straggler-minmax-count.
  bool log_straggler = false;
  bool disable_straggler_on_startup = false;
  int64_t straggler_ctrlr_port = 65535;
  int64_t straggler_minmax_count = 1;
  bool log_params_norm = false;
  bool log_num_zeros_in_grad = false;
  // Megatron's --log-progress: append the job's progress to <--save>/progress.txt (train/progress_log.h).
  bool log_progress = false;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  // Megatron's timers (core/timers.h): --timing-log-level 0..2, --timing-log-option
  // max|minmax|all, and --no-barrier-with-level-1-timing (level-1 timers start after a world barrier
  // unless given).
  int64_t timing_log_level = 0;
  std::string timing_log_option = "minmax";
  bool barrier_with_l1_time = true;
  // TensorBoard (Megatron's flags; written by the last rank only, docs/formats/tensorboard.md).
  std::string tensorboard_dir;  // empty: no TensorBoard logging
  std::string config_logger_dir;  // --config-logger-dir: Megatron's config logger (train/config_logger.h)
  int64_t tensorboard_log_interval = 1;
  int64_t tensorboard_queue_size = 1000;
  bool log_timers_to_tensorboard = false;
  bool log_batch_size_to_tensorboard = false;
  bool log_learning_rate_to_tensorboard = true;  // --no-log-learnig-rate-to-tensorboard (sic)
  bool log_loss_scale_to_tensorboard = true;
  bool log_validation_ppl_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  bool log_world_size_to_tensorboard = false;
  // Megatron main's --log-memory-interval N (None: unset): every N-th iteration, a multiple of
  // --log-interval, prints the memory report line (train/memory_report.h) after the log line.
  int64_t log_memory_interval = kUnset;
  // Weights & Biases (Megatron's flags; the last rank writes an offline run for `wandb sync`,
  // docs/formats/wandb.md): empty project: no W&B run.
  std::string wandb_project, wandb_exp_name;
  std::string wandb_save_dir;  // empty: {--save}/wandb
  // MindSpeed's log-line features, set by `gale pretrain` from their status in the feature registry
  // (their flags belong to the features): --op-cal-tflops (features/feature_op_cal_tflops.cc) adds the
  // throughputs of the FLOPs the kernels counted; --async-log-allreduce
  // (features/feature_async_log_allreduce.cc) makes the data-parallel all-reduce of the logged loss
  // non-blocking.
  bool op_cal_tflops = false;
  bool async_log_allreduce = false;
};

// Megatron-Core mixture of experts (train/arguments_moe.cc); inactive without --num-experts.
struct MoeArgs {
  int64_t num_experts = kUnset;  // 0 is turned into None, as Megatron
  // --moe-use-upcycling: --load holds a dense checkpoint, copied into every expert (train/checkpointing.h).
  bool moe_use_upcycling = false;
  // --moe-upcycling-granularity G: the dense FFN is G × --ffn-hidden-size, cut into G expert slices
  // (train/moe_upcycling.h).
  int64_t moe_upcycling_granularity = 1;
  int64_t moe_router_topk = 2;
  // --moe-router-load-balancing-type and --moe-aux-loss-coeff take one value or several (Megatron's
  // nargs='+'): one (as Megatron turns a one-element list into a scalar) lands in the scalar fields,
  // several in the lists (`..._types` / `..._coeffs`, of equal length; the scalars then unused).
  double moe_aux_loss_coeff = 0.0;
  std::vector<double> moe_aux_loss_coeffs;
  double moe_z_loss_coeff = kUnsetF;
  std::string moe_router_load_balancing_type = "aux_loss";
  std::vector<std::string> moe_router_load_balancing_types;
  std::string moe_router_score_function = "softmax";
  bool moe_router_pre_softmax = false;
  double moe_router_topk_scaling_factor = kUnsetF;  // None: 1
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  double moe_router_quantile_balancing_ema = 0.0;  // Megatron main's; with quantile_balancing
  int64_t moe_router_num_groups = kUnset;  // None: no group-limited routing
  int64_t moe_router_group_topk = kUnset;
  double moe_expert_capacity_factor = kUnsetF;  // None (or negative): dropless
  std::string moe_token_drop_policy = "probs";
  bool moe_pad_expert_input_to_capacity = false;
  std::string moe_token_dispatcher_type = "allgather";
  bool moe_grouped_gemm = false;
  int64_t moe_ffn_hidden_size = kUnset;  // -> --ffn-hidden-size
  std::string moe_layer_freq = "1";      // int k (layer i is MoE iff i % k == 0) or a list "[1,0,1,...]"
  int64_t expert_tensor_parallel_size = kUnset;  // -> --tensor-model-parallel-size (1 under --moe-tp-extend-ep)
  // MindSpeed's --moe-tp-extend-ep (features/feature_moe_tp_extend_ep.cc): the TP ranks split the
  // experts instead of their weights, i.e. Megatron's --expert-tensor-parallel-size 1 with an
  // expert-parallel size of TP x --expert-model-parallel-size on the same ranks
  // (expert_grid_ep_size).
  bool moe_tp_extend_ep = false;
  bool moe_permutation_async_comm = false;  // accepted (MindSpeed requires it with --moe-tp-extend-ep); no effect
  // MindSpeed's --fix-router (features/feature_fix_router.cc): fixed round-robin expert choice for
  // benchmarking (MoeConfig::fix_router).
  bool fix_router = false;
  int64_t moe_shared_expert_intermediate_size = kUnset;  // unset: no shared expert
  // MindSpeed's --n-shared-experts K (features/feature_n_shared_experts.cc): validation sets
  // moe_shared_expert_intermediate_size = K · --ffn-hidden-size (MindSpeed's conversion); unset or 0: none.
  int64_t n_shared_experts = kUnset;
  bool moe_shared_expert_gate = false;
  bool moe_shared_expert_overlap = false;  // needs --moe-token-dispatcher-type alltoall
  double moe_input_jitter_eps = kUnsetF;   // None: no jitter
  bool moe_router_force_load_balancing = false;  // benchmark: random router logits (MoeConfig::force_load_balancing)

  // Derived by validation: one flag per layer (1: MoE); empty without --num-experts.
  std::vector<int> layer_pattern;
  bool enabled() const { return num_experts > 0; }
  // Megatron's get_aux_loss_coeff: the coefficient of load-balancing type `type` (aux_loss,
  // seq_aux_loss, global_aux_loss), 0 when it is not selected; and whether `type` is selected.
  double aux_loss_coeff(const std::string& type) const;
  bool uses_load_balancing_type(const std::string& type) const;
};

// MindSpeed-LLM's LoRA fine-tuning flags (train/arguments_lora.cc, model/lora.h); LoRA is on when
// --lora-target-modules names at least one linear, as in MindSpeed-LLM.
struct LoraArgs {
  int64_t lora_r = 16;       // MindSpeed-LLM's default rank
  int64_t lora_alpha = 32;   // MindSpeed-LLM's default alpha (scaling alpha / r)
  std::vector<std::string> lora_target_modules;  // of linear_qkv, linear_proj, linear_fc1, linear_fc2
  std::string lora_load;     // the adapter checkpoint to resume from (or to merge, gale convert)
  std::vector<std::string> lora_modules_to_save;  // modules trained whole (word_embeddings, output_layer, ...)
  bool enabled() const { return !lora_target_modules.empty(); }
};

// MindSpeed-LLM's post-training stage and its DPO flags (train/arguments_dpo.cc, train/dpo.h).
struct DpoArgs {
  // --stage: "" (pretraining or plain fine-tuning), "sft" (the same: Gale's fine-tuning needs no
  // stage) or "dpo" (offline DPO against a frozen reference model); MindSpeed-LLM's other stages are
  // refused.
  std::string stage;
  bool is_pairwise_dataset = false;  // --is-pairwise-dataset: PREFIX_packed_{chosen,rejected}_*
  double dpo_beta = 0.1;
  std::string dpo_loss_type = "sigmoid";  // sigmoid, hinge, ipo
  double dpo_label_smoothing = 0.0;
  double pref_ftx = 0.0;
  std::string ref_model;  // the reference model's checkpoint; "" = the --load checkpoint
  // --refer-model-iter (MindSpeed-LLM, default 1): the iteration of that directory the reference
  // loads, so that a resumed DPO run's reference keeps its initial weights
  // (train/checkpointing.h dpo_reference_iteration). refer_model_iter_given: the flag was on the
  // command line.
  int64_t refer_model_iter = 1;
  bool refer_model_iter_given = false;
  bool enabled() const { return stage == "dpo"; }
};

// MindSpeed's quantisation-aware distillation flags (QADQuantEngineFeature; train/arguments_qad.cc,
// features/feature_qad.cc, model/logits_kl.h).
struct QadArgs {
  bool qad_enable = false;            // --qad-enable (--no-qad-enable: off)
  std::string qad_teacher_load;       // the teacher's Gale checkpoint directory (required with it)
  double kl_temperature = 1.0;        // τ of softmax(logits / τ), > 0
  double kl_loss_weight = 1.0;        // the KL term's weight in the loss, >= 0
  std::string kl_loss_reduction = "mean";  // over a micro-batch's masked tokens: mean or sum
};

// Megatron-LM's offline distillation from saved logits (train/arguments_logits_kd.cc; the shards
// train/cached_logits.h, the loss model/topk_kl.h).
struct LogitsKdArgs {
  std::string logits_save_dir;             // --logits-save-dir: write the teacher's top-K here
  int64_t logits_save_top_k = 0;           // --logits-save-top-k (required with the dir; 0: not given)
  double logits_save_top_p = std::numeric_limits<double>::quiet_NaN();  // --logits-save-top-p, (0, 1]; NaN: off
  int64_t logits_save_top_p_min_k = 1;     // --logits-save-top-p-min-k, >= 1
  std::string logits_save_dtype = "fp16";  // --logits-save-dtype fp16 | bf16 | fp32
  std::string logits_load_dir;             // --logits-load-dir: the student's teacher shards
  int64_t logits_load_decode_threads = 4;  // Megatron's loader knobs (accepted; see the .cc)
  int64_t logits_load_prefetch_factor = 3;
  int64_t logits_load_msc_prefetch_depth = 2;
  double logits_load_kd_loss_alpha = 1.0;  // loss = alpha · kd + (1 − alpha) · lm
  bool logits_load_ignore_errors = false;  // a failing KD loss falls back to the lm loss with a warning
};

// Megatron's rerun state machine (train/arguments_rerun.cc, train/rerun_state_machine.h).
struct RerunArgs {
  std::string rerun_mode = "disabled";  // --rerun-mode: disabled, validate_results or report_stats
  int64_t error_injection_rate = 0;     // --error-injection-rate: inject once per N validations (0: never)
  std::string error_injection_type = "transient_error";  // correct_result, transient_error, persistent_error
  bool check_for_spiky_loss = false;    // --check-for-spiky-loss
  bool check_for_large_grads = false;   // --check-for-large-grads
  std::string result_rejected_tracker_filename;  // --result-rejected-tracker-filename ("" = none)
};

// Megatron's fault-tolerance flags and the FT package's parameters (train/arguments_ft.cc,
// train/ft_integration.h, docs/fault-tolerance.md).
struct FtArgs {
  bool enable_ft_package = false;  // --enable-ft-package
  bool calc_ft_timeouts = false;   // --calc-ft-timeouts
  // --ft-param-rank_section_timeouts: section:seconds entries (none: no timeout); the default is
  // the example of Megatron's ft_integration.py.
  std::string rank_section_timeouts = "setup:600,step:180,checkpointing:420";
  std::string rank_out_of_section_timeout = "300";  // --ft-param-rank_out_of_section_timeout (none: off)
  double safety_factor = 5.0;            // --ft-param-safety_factor (FT's default)
  // --ft-num-warmup-iters (Megatron-LM main): the first N training iterations (and the first N of each
  // evaluation) run outside "step", and no out-of-section timeout applies until N training iterations ended.
  int64_t num_warmup_iters = 5;
  double workload_check_interval = 5.0;  // --ft-param-workload_check_interval: seconds (FT's default)
};

// Megatron's and MindSpeed's profiling flags (train/arguments_profile.cc; train/profiler.h).
struct ProfileArgs {
  bool profile = false;              // --profile: record a trace of the window below
  int64_t profile_step_start = 10;   // the window: the iterations after start, up to and with end
  int64_t profile_step_end = 12;     //   (Megatron's global steps: log iterations start+1 .. end)
  std::vector<std::string> profile_ranks_flag = {"0"};  // --profile-ranks as given
  std::vector<int64_t> profile_ranks = {0};             // parsed; -1 (MindSpeed): every rank
  bool use_pytorch_profiler = false;  // accepted: Gale's trace is the profiler either way
  bool record_memory_history = false;  // the last rank's allocator history (core/memory_history.h)
  std::string memory_snapshot_path = "snapshot.json";
  std::string profile_level = "level0";  // MindSpeed's: level_none, level0, level1, level2
  bool profile_with_cpu = false;       // accepted: Gale's trace is the CPU's
  bool profile_with_stack = false;     // not supported yet
  bool profile_with_memory = false;
  bool profile_record_shapes = false;
  std::string profile_save_path;  // "": --tensorboard-dir, else ./profile_dir
};

// Megatron flags Gale accepts only with the value that changes nothing here
// (train/arguments_megatron_compat.cc).
struct MegatronCompatArgs {
  std::string moe_router_dtype = "fp32";     // --moe-router-dtype
  std::string transformer_impl = "transformer_engine";  // --transformer-impl: one implementation stands for both
  std::vector<std::string> spec;  // --spec: only Megatron's Mamba stack spec, with --is-hybrid-model
  std::string yaml_cfg;  // --yaml-cfg: the YAML file the arguments came from (train/yaml_cfg.h)
  // Megatron-LM main's --output-logit-dtype bf16|fp32 ("": Megatron's None, the output layer's input
  // dtype, which is f32 in Gale: its output layer multiplies f32 inputs): bf16 rounds the logits
  // (ModelConfig::bf16_logits).
  std::string output_logit_dtype;
  bool enable_msc = false;  // Megatron-LM main's --enable-msc: refused unless --disable-msc turns it off
};

// MindSpeed's mask flags of Ascend's flash attention (train/arguments_mindspeed_compat.cc).
struct MindSpeedCompatArgs {
  int sparse_mode = 0;          // --sparse-mode
  int64_t pre_tockens = 65536;  // --pre-tockens: earlier tokens a query sees
  int64_t next_tockens = 0;     // --next-tockens: later tokens a query sees
  std::string attention_mask_type = "causal";  // --attention-mask-type: causal (general: not yet)
};

// MindSpeed's auto settings (features/feature_auto_settings.cc, train/auto_settings.h) and
// --prof-file, the profile a run writes (docs/formats/auto-settings.md).
struct AutoSettingsArgs {
  bool auto_settings = false;                // --auto-settings: profile, model and search instead of training
  std::string auto_settings_type = "white";  // white (Gale's); black / mixed: not supported yet
  std::string auto_settings_work_dir;        // default: the current directory
  int64_t auto_settings_ranks = 8;           // the target world size to search layouts for
  std::string auto_settings_log_level = "info";
  int64_t target_nnodes = 1;                 // the target's nodes (ranks per node = ranks / nodes)
  int64_t nproc_per_node = 2;                // local ranks the profiling runs may use (1 or more)
  double auto_settings_memory_limit_gib = 0.0;  // per-rank limit; 0: this host's memory / local ranks
  double auto_settings_inter_node_bandwidth_ratio = 0.25;  // inter-node / measured intra-node bandwidth
  std::string prof_file;                     // --prof-file: write this run's profile (JSON) here
  // MindSpeed's --auto-parallel (features/feature_auto_parallel.cc, train/auto_parallel.h).
  bool auto_parallel = false;
  int64_t nnodes = 1;                        // its world: --nnodes × --nproc-per-node ranks
  int64_t auto_parallel_max_trials = 8;      // Gale: real runs at most
};

struct Arguments {
  ModelArgs model;
  MoeArgs moe;
  LoraArgs lora;
  DpoArgs dpo;
  QadArgs qad;
  LogitsKdArgs logits_kd;
  RerunArgs rerun;
  FtArgs ft;
  ProfileArgs profile;
  TrainingArgs training;
  ParallelArgs parallel;
  DataArgs data;
  TokenizerArgs tokenizer;
  CheckpointArgs checkpoint;
  LoggingArgs logging;
  MegatronCompatArgs megatron_compat;
  MindSpeedCompatArgs mindspeed_compat;
  AutoSettingsArgs auto_settings;
};

void add_model_args(ArgParser& p, ModelArgs& a);
void add_training_args(ArgParser& p, TrainingArgs& a);
void add_parallel_args(ArgParser& p, ParallelArgs& a);
void add_data_args(ArgParser& p, DataArgs& a);
void add_tokenizer_args(ArgParser& p, TokenizerArgs& a);
void add_checkpoint_args(ArgParser& p, CheckpointArgs& a);
void add_logging_args(ArgParser& p, LoggingArgs& a);
void add_moe_args(ArgParser& p, MoeArgs& a);
void add_lora_args(ArgParser& p, LoraArgs& a);
void add_dpo_args(ArgParser& p, DpoArgs& a);
// --multi-latent-attention and its sizes (Megatron names and defaults; train/arguments_mla.cc).
void add_mla_args(ArgParser& p, ModelArgs& a);
// --is-hybrid-model and the Mamba flags (Megatron names and defaults; train/arguments_hybrid.cc).
void add_hybrid_args(ArgParser& p, ModelArgs& a);
// --heterogeneous-layers-config-path / --heterogeneous-layers-config-encoded-json.
void add_heterogeneous_args(ArgParser& p, ModelArgs& a);
// MindSpeed's QAT flags --qat-scheme, --qat-quant-block-size (train/arguments_qat.cc; validated by
// features/feature_qat.cc).
void add_qat_args(ArgParser& p, ModelArgs& a);
// Megatron's FP8 flags --fp8-format, --fp8-recipe, ... (train/arguments_fp8.cc; validated by
// features/feature_fp8.cc).
void add_fp8_args(ArgParser& p, ModelArgs& a);
// Megatron's precision-aware optimizer flags and --grad-reduce-in-bf16 /
// --accumulate-allreduce-grads-in-fp32 (train/arguments_precision.cc; validated by
// features/feature_precision_aware_optimizer.cc).
void add_precision_args(ArgParser& p, TrainingArgs& a);
// Megatron's --ddp-reduce-scatter-with-fp32-accumulation, --ddp-param-name-patterns-for-fp32-local-
// accumulation and --create-all-gather-group (train/arguments_ddp_precision.cc; validated by
// features/feature_ddp_precision.cc).
void add_ddp_precision_args(ArgParser& p, ParallelArgs& a);
// MindSpeed's --automated-pipeline flags (train/arguments_automated_pipeline.cc; validated by
// features/feature_automated_pipeline.cc).
void add_automated_pipeline_args(ArgParser& p, ParallelArgs& a);
// MindSpeed's QAD flags --qad-enable, --qad-teacher-load, --kl-temperature, --kl-loss-weight,
// --kl-loss-reduction (train/arguments_qad.cc; validated by features/feature_qad.cc).
void add_qad_args(ArgParser& p, QadArgs& a);
// Megatron's --logits-save-* / --logits-load-* flags and their checks (train/arguments_logits_kd.cc;
// run by validate_all_pretrain_args).
void add_logits_kd_args(ArgParser& p, LogitsKdArgs& a);
Status validate_logits_kd_args(const Arguments& a, const ArgParser& p);
void add_rerun_args(ArgParser& p, RerunArgs& a);
Status validate_rerun_args(const Arguments& a, const ArgParser& p);
// --enable-ft-package, --calc-ft-timeouts and the --ft-param-* flags (train/arguments_ft.cc).
void add_ft_args(ArgParser& p, FtArgs& a);
// The --ft-param-* values, --save, and the flags given without --enable-ft-package (errors naming them).
Status validate_ft_args(const Arguments& a, const ArgParser& p);
// --profile and its window, ranks and options, --record-memory-history, --memory-snapshot-path
// (train/arguments_profile.cc).
void add_profile_args(ArgParser& p, ProfileArgs& a);
// The window (start >= 0, end > start), the ranks (integers in [-1, world size)), and
// --profile-with-stack (not supported yet); parses --profile-ranks.
Status validate_profile_args(Arguments& a, const ArgParser& p, int64_t world_size);
// The KL flags given without --qad-enable (an error naming them).
Status validate_qad_args(const Arguments& a, const ArgParser& p);
// Every other flag of Megatron's pretrain_gpt.py parser (train/arguments_megatron_compat.cc):
// accepted with a start-up note where it changes nothing in Gale, "not supported yet" where Gale
// lacks it, Megatron's own error where Megatron rejects it; no Megatron flag is unknown.
void add_megatron_compat_args(ArgParser& p, MegatronCompatArgs& a);
// The values those flags accept (--rerun-mode disabled, --moe-router-dtype fp32, and
// --no-position-embedding only with RoPE, as Megatron).
Status validate_megatron_compat_args(const Arguments& a, const ArgParser& p);
// The flags Megatron-LM main added since core_v0.12.1 (train/arguments_megatron_main.cc): run, accepted
// with a note, or refused with their reason; and their checks.
void add_megatron_main_args(ArgParser& p, Arguments& a);
Status validate_megatron_main_args(const Arguments& a, const ArgParser& p);

// MindSpeed's flags outside its feature classes (train/arguments_mindspeed_compat.cc): accepted with
// a start-up note where they change nothing in Gale; --sparse-mode / --pre-tockens / --next-tockens,
// the band mask of Ascend's flash attention, mapped onto --sliding-window; the flags of MindSpeed's
// core_r0.7/r0.8 branches refused with what replaced them.
void add_mindspeed_compat_args(ArgParser& p, MindSpeedCompatArgs& a);
// Checks the band-mask flags and sets --sliding-window from --pre-tockens; before the model checks.
Status validate_mindspeed_compat_args(Arguments& a, const ArgParser& p);

// MindSpeed's --auto-settings and its flags, and --prof-file (train/arguments_auto_settings.cc).
void add_auto_settings_args(ArgParser& p, AutoSettingsArgs& a);
// Their values and what --auto-settings does not compose with (one line naming the flag).
Status validate_auto_settings_args(const Arguments& a, const ArgParser& p);

// Registers all groups above (what `gale pretrain` accepts).
void add_all_pretrain_args(ArgParser& p, Arguments& a);

// Cross-flag validation and derived values, as Megatron's validate_args. `world_size` is the
// number of processes. Errors are one line naming the flag.
Status validate_model_args(ModelArgs& m, const ArgParser& p);
Status validate_training_args(Arguments& a, const ArgParser& p);
Status validate_parallel_args(Arguments& a, const ArgParser& p, int64_t world_size);
// --tp-2d / --tp-x / --tp-y against the layout and the model (train/arguments_tp2d.cc): the grid,
// the divisibility the 2-D sharding needs, and the combinations Gale's 2-D path does not support.
Status validate_tp2d(const Arguments& a);
// The explicit pipeline splits, parsed (rows: pipeline ranks; counts: their virtual stages),
// without checking them against the layout. --num-layer-list "4,6,6,4" gives one row of one count
// per pipeline rank; --pipeline-num-transformer-layers takes MindSpeed's nested lists, where
// `[..]*n` (or a count followed by `*n`) repeats the element n times. A malformed text is an
// error naming `flag`.
StatusOr<std::vector<std::vector<int64_t>>> parse_num_layer_list(const std::string& text,
                                                                 const char* flag = "--num-layer-list");
StatusOr<std::vector<std::vector<int64_t>>> parse_pipeline_num_transformer_layers(const std::string& text);
Status validate_data_args(Arguments& a, const ArgParser& p);
Status validate_checkpoint_args(Arguments& a, const ArgParser& p);
// The non-persistent checkpoint flags (Megatron's validate_args checks, and what Gale does not
// compose them with yet) on `world_size` ranks: --replication needs the world to split into cliques.
Status validate_non_persistent_args(Arguments& a, const ArgParser& p, int64_t world_size);
// After the model and parallel flags: the MoE flags, and what MoE does not compose with yet.
Status validate_moe_args(Arguments& a, const ArgParser& p);
// The expert generator's expert-parallel size (the ranks a MoE layer's experts are spread over):
// --expert-model-parallel-size, times --tensor-model-parallel-size under --moe-tp-extend-ep.
int64_t expert_grid_ep_size(const Arguments& a);
// The router flags of a MoE model (scaling factor, expert bias, groups, capacity); part of
// validate_moe_args.
Status validate_moe_router_args(MoeArgs& m);
// The LoRA flags (values, target names) and what LoRA does not compose with yet (MoE layers).
// After the model and parallel flags.
Status validate_lora_args(Arguments& a, const ArgParser& p);
// --stage dpo and its flags, and what DPO does not compose with yet (after the other groups).
Status validate_dpo_args(Arguments& a, const ArgParser& p);
// The MLA flags (sizes, YaRN) and what MLA does not compose with (GQA, LoRA on linear_qkv).
// After the model and parallel flags.
Status validate_mla_args(Arguments& a, const ArgParser& p);
// --hybrid-layer-pattern (Megatron main's unified pattern, model/hybrid_pattern.h; also an
// --hybrid-override-pattern holding its separators): both flags given is Megatron's error; the
// pattern's decoder layers set --num-layers (Megatron's warning when that differs); its '|' give
// the pipeline stages (segment k on rank k mod PP, virtual stage k / PP; the flags that give the split
// otherwise are Megatron's errors) and '/' the MTP depths (they set --mtp-num-layers; each depth's
// layers are M, * or -); '+' layers set --multi-latent-attention. Before the model and parallel checks.
Status resolve_hybrid_layer_pattern(Arguments& a, const ArgParser& p);
// The hybrid model's layer allocation, sizes and what it cannot be combined with yet.
Status validate_hybrid_args(const Arguments& a, const ArgParser& p);
// A hybrid MoE model's MoeArgs::layer_pattern (train/arguments_hybrid_moe.cc; part of
// validate_moe_args): 1 for each 'E' layer of the hybrid pattern. Refuses --moe-layer-freq, a
// pattern without 'E' and the MoE accelerations not supported in hybrid models yet.
StatusOr<std::vector<int>> hybrid_moe_layer_pattern(const Arguments& a, const ArgParser& p);
// The heterogeneous layer configuration: the JSON read and checked against the model flags, and
// what it cannot be combined with yet.
Status validate_heterogeneous_args(Arguments& a, const ArgParser& p);
// --mtp-num-layers (at least 1) and --mtp-loss-scaling-factor, and what MTP does not compose with
// yet (pipeline and context parallelism). After the model and parallel flags.
Status validate_mtp_args(Arguments& a);
// --moe-layer-freq: an int k (layer i is MoE iff i % k == 0) or a list of L zeros and ones
// ("[1,0,1,1]"; Megatron's Python expressions such as "([0]+[1]*3)" are also read).
StatusOr<std::vector<int>> parse_moe_layer_freq(const std::string& value, int64_t num_layers);
// A Megatron layer-pattern flag (`flag` names it in errors): an int k gives entry i = every(k, i),
// a list expression as parse_moe_layer_freq's gives the list (L entries of 0 and 1).
StatusOr<std::vector<int>> parse_layer_pattern(const char* flag, const std::string& value, int64_t num_layers,
                                               bool (*every)(int64_t k, int64_t i));
// YaRN RoPE of standard attention (--position-embedding-type yarn; train/arguments_yarn.cc): the
// yarn_* flags, added beside --position-embedding-type, and the checks validate_model_args runs.
void add_yarn_args(ArgParser& p, ModelArgs& a);
Status validate_yarn_args(const ModelArgs& m, const ArgParser& p);
// LongRoPE (--rope-scaling-type longrope; train/arguments_longrope.cc): MindSpeed-LLM's flags, added
// beside the RoPE flags, and the checks validate_model_args runs (fills long_factors / short_factors).
void add_longrope_args(ArgParser& p, ModelArgs& a);
Status validate_longrope_args(ModelArgs& m, const ArgParser& p);
// --quick-geglu, --glu-linear-offset, --activation-func-clamp-value (train/arguments_glu.cc): the
// model-only checks (run by validate_model_args) and the one that needs --num-experts (run by
// validate_all_pretrain_args).
Status validate_glu_args(const ModelArgs& m);
Status validate_glu_moe_args(const Arguments& a);
// MindSpeed-LLM's Gemma flags (--geglu, --gelu-tanh, --add-rmsnorm-offset, --input-embeds-norm;
// train/arguments_gemma.cc): their registration, their checks (run by validate_all_pretrain_args)
// and the model config they resolve to (run by model_config_from_args).
struct ModelConfig;
void add_gemma_args(ArgParser& p, ModelArgs& a);
Status validate_gemma_args(const Arguments& a);
void apply_gemma_args(const Arguments& a, ModelConfig* c);
// --attention-output-gate: what it does not compose with (train/arguments_attention_gate.cc; run by
// validate_all_pretrain_args).
Status validate_attention_output_gate(const Arguments& a);
// --qk-l2-norm: what it does not compose with (train/arguments_qk_l2_norm.cc; run by
// validate_all_pretrain_args).
Status validate_qk_l2_norm(const Arguments& a);
// --freeze-all-layers (train/arguments_freeze.cc; run by validate_all_pretrain_args): Megatron's
// warnings (the distributed optimizer and --overlap-param-gather turned off), --load made
// weights-only (--finetune), and what Gale does not support with it yet.
Status validate_freeze_all_layers(Arguments& a);
// --softmax-type (train/arguments_softmax_type.cc): the flag, added beside the attention flags, and
// what it does not compose with yet (run by validate_all_pretrain_args).
void add_softmax_type_args(ArgParser& p, ModelArgs& a);
Status validate_softmax_type(const Arguments& a);
// --phase-transition-iterations (train/arguments_phase.cc): the flag, added beside the data flags;
// its parsing and Megatron's checks (run by validate_all_pretrain_args).
void add_phase_args(ArgParser& p, DataArgs& a);
Status validate_phase_args(Arguments& a, const ArgParser& p);
// --dataloader-fast-cache-load and --dataloader-defer-npy-index-mmap (train/arguments_data_cache.cc):
// the flags, added beside the data flags, and Megatron's checks (run by validate_all_pretrain_args).
void add_data_cache_args(ArgParser& p, DataArgs& a);
Status validate_data_cache_args(const Arguments& a, const ArgParser& p);
// --enable-mhc-connections and the mhc_* flags (train/arguments_mhc.cc): added beside the attention
// flags; Megatron's checks and what Gale does not support with them yet (run by validate_all_pretrain_args).
void add_mhc_args(ArgParser& p, ModelArgs& a);
Status validate_mhc_args(const Arguments& a, const ArgParser& p);
// --qk-clip and its flags, --log-max-attention-logit (train/arguments_qk_clip.cc): the flags, added
// beside the attention flags, their values and what they do not compose with yet (run by
// validate_all_pretrain_args).
void add_qk_clip_args(ArgParser& p, ModelArgs& a);
Status validate_qk_clip(const Arguments& a);
// --use-mup and the --mup-* flags (train/arguments_mup.cc): the flags, added beside the attention
// flags, and their checks and Megatron's start-up warnings (run by validate_all_pretrain_args).
void add_mup_args(ArgParser& p, ModelArgs& a);
Status validate_mup(const Arguments& a);
// --no-rope-freq (train/arguments_no_rope.cc): the flag, added beside the RoPE flags, and its check,
// run by validate_model_args (fills ModelArgs::no_rope_pattern).
void add_no_rope_args(ArgParser& p, ModelArgs& a);
Status validate_no_rope_args(ModelArgs& m);
// --window-size and --window-attn-skip-freq (train/arguments_window.cc): the flags, added beside
// --sliding-window, and their checks, run by validate_model_args: --window-size's left + 1 becomes
// ModelArgs::sliding_window, the skip pattern ModelArgs::window_attn_pattern.
struct WindowSize {
  int64_t left = -1, right = -1;
};
StatusOr<WindowSize> parse_window_size(const std::string& value);
void add_window_args(ArgParser& p, ModelArgs& a);
Status validate_window_args(ModelArgs& m);
// Gemma-2's flags (train/arguments_gemma2.cc): added beside --window-size; the check, run by
// validate_model_args before validate_window_args, maps --interleave-sliding-window onto
// --sliding-window and --window-attn-skip-freq and refuses what Gale cannot combine with the others.
void add_gemma2_args(ArgParser& p, ModelArgs& a);
Status validate_gemma2_args(ModelArgs& m);
// ... and, run by validate_all_pretrain_args, the combinations with other groups' flags it refuses.
Status validate_gemma2_combinations(const Arguments& a);
// Gated DeltaNet (--experimental-attention-variant gdn; train/arguments_gdn.cc): its flags, added
// by add_mla_args, and their checks, run by validate_mla_args (fills ModelArgs::linear_attention_pattern).
void add_gdn_args(ArgParser& p, ModelArgs& a);
Status validate_gdn_args(ModelArgs& m, const ArgParser& p);
// DeepSeek sparse attention (--experimental-attention-variant dsa; train/arguments_mla.cc): the
// variant's name and the indexer flags' values (run by validate_mla_args; normalises the GDN
// spelling through validate_gdn_args), and the model it needs (MLA with --qk-layernorm, indexer
// head dim ≥ --qk-pos-emb-head-dim: features/feature_dsa.cc, and checkpoint args read for inference).
Status validate_dsa_args(ModelArgs& m, const ArgParser& p);
Status check_dsa_model_args(const ModelArgs& m);
// `world_rank` matters only under --dist-train: the arguments become that rank's sub-world's view
// (validate_dist_train_args).
Status validate_all_pretrain_args(Arguments& a, const ArgParser& p, int64_t world_size, int64_t world_rank = 0);
// --dist-train: reads --mm-model's dist_config, refuses what is not supported with it, validates
// every sub-world's view of the arguments (errors name the sub-world) and leaves `a` as the view of
// the sub-world holding `world_rank` (train/arguments_dist_train.cc).
Status validate_dist_train_args(Arguments& a, const ArgParser& p, int64_t world_size, int64_t world_rank);

// Megatron's vocabulary padding: ceil(V / (divisible_by * tp)) * divisible_by * tp.
int64_t pad_vocab_size(int64_t vocab, int64_t divisible_by, int64_t tp);

}  // namespace gale
