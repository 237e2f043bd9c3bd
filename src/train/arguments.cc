// Registration and validation of the pretrain flags (Megatron names, defaults and checks).
#include "train/arguments.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/newton_schulz.h"
#include "train/batch_size_rampup.h"

namespace gale {

void add_model_args(ArgParser& p, ModelArgs& a) {
  p.group("model");
  p.add("--num-layers", &a.num_layers, "number of transformer layers (required)");
  p.add("--hidden-size", &a.hidden_size, "transformer hidden size (required)");
  p.add("--ffn-hidden-size", &a.ffn_hidden_size, "MLP hidden size; default 4*hidden, or int(8*hidden/3/64)*64 with --swiglu");
  p.add("--num-attention-heads", &a.num_attention_heads, "number of attention heads (required)");
  p.add("--kv-channels", &a.kv_channels, "attention head dimension; default hidden/heads");
  p.add_flag("--group-query-attention", &a.group_query_attention, "use grouped-query attention");
  p.add("--num-query-groups", &a.num_query_groups, "number of key/value heads with --group-query-attention");
  p.add("--seq-length", &a.seq_length, "sequence length (required)");
  p.add("--max-position-embeddings", &a.max_position_embeddings, "maximum sequence length of position embeddings (required)");
  p.add_choice("--position-embedding-type", &a.position_embedding_type,
               {"learned_absolute", "rope", "yarn", "none", "alibi"},
               "position embedding (yarn: RoPE with YaRN's frequency blend, --rotary-scaling-factor and the --yarn-* "
               "flags, model/yarn_rope.h; alibi: MindSpeed's ALiBi, a per-head linear distance bias inside attention)");
  add_yarn_args(p, a);
  p.add_flag("--use-rotary-position-embeddings", &a.use_rotary_position_embeddings, "legacy spelling of --position-embedding-type rope");
  p.add("--rotary-base", &a.rotary_base, "RoPE base period");
  p.add("--rotary-percent", &a.rotary_percent, "fraction of each head's dimensions that RoPE rotates");
  p.add_flag("--use-rope-scaling", &a.use_rope_scaling, "Llama 3.x RoPE frequency scaling (low 1, high 4, context 8192)");
  p.add("--rope-scaling-factor", &a.rope_scaling_factor, "--use-rope-scaling: the factor low frequencies are divided by");
  add_no_rope_args(p, a);
  add_longrope_args(p, a);
  p.add_flag("--rotary-interleaved", &a.rotary_interleaved,
             "RoPE rotates interleaved pairs (2i, 2i+1) instead of the two halves of each head");
  p.add_flag("--use-glm-rope", &a.rotary_interleaved,
             "MindSpeed-LLM (ChatGLM3 / GLM-4, with --rotary-percent 0.5): GLM's RoPE, the same rotation as "
             "--rotary-interleaved (recorded as it)");
  p.add("--rotary-seq-len-interpolation-factor", &a.rotary_seq_len_interpolation_factor,
        "RoPE position interpolation: positions divided by this factor (unset: none)");
  p.add("--sliding-window", &a.sliding_window,
        "sliding-window attention: a query at position i attends only the keys at positions i-W+1 .. i "
        "(Mistral's window; unset: full causal attention)");
  add_window_args(p, a);
  add_gemma2_args(p, a);
  p.add("--alibi-fusion-attn-type", &a.alibi_fusion_attn_type,
        "ALiBi bias form of MindSpeed's fusion attention (pse type): Gale's bias is type 2, -m*(i-j) inside "
        "flash attention; 0 and 3 are refused");
  p.add_flag("--square-alibi-mask", &a.square_alibi_mask,
             "ALiBi (MindSpeed legacy path): [S, S] bias m*(j-i) instead of m*j; same probabilities, accepted");
  p.add_flag("--fill-neg-inf", &a.fill_neg_inf,
             "ALiBi (MindSpeed legacy path, with --square-alibi-mask): masked entries -inf; same probabilities, accepted");
  p.add_flag("--alibi-diagonal-opposite", &a.alibi_diagonal_opposite,
             "ALiBi: sign of the bias of keys after the query, which the causal mask hides; accepted");
  p.add_choice("--normalization", &a.normalization, {"LayerNorm", "RMSNorm"}, "normalization layer");
  p.add("--norm-epsilon", &a.norm_epsilon, "epsilon of the normalization layers");
  p.add_flag("--apply-layernorm-1p", &a.apply_layernorm_1p,
             "zero-centred norm weights: initialised to 0, the norms scale by 1 + weight");
  p.add_flag("--swiglu", &a.swiglu, "SwiGLU MLP instead of GeLU");
  p.add_flag("--quick-geglu", &a.quick_geglu,
             "gated MLP with Megatron's quick GeLU of the gate, a·sigmoid(1.702·a), instead of GeLU (gpt-oss)");
  p.add("--glu-linear-offset", &a.glu_linear_offset,
        "gated MLP (--swiglu, --quick-geglu): add this to the linear half before the product (gpt-oss: 1.0)");
  p.add("--activation-func-clamp-value", &a.activation_func_clamp_value,
        "gated MLP: clamp the gate to at most this and the linear half to [-value, value] before the activation "
        "(gpt-oss: 7.0; with --swiglu MoE models only)");
  p.add_flag("--embed-layernorm", &a.embed_layernorm,
             "MindSpeed-LLM: normalise the embedding's output (--normalization's norm, with its weight and bias) before "
             "the first layer, as Bloom's word_embeddings_layernorm");
  p.add_flag("--openai-gelu", &a.openai_gelu, "tanh-approximated GeLU (GPT-2's gelu_new) instead of the exact erf GeLU");
  p.add_flag("--squared-relu", &a.squared_relu, "squared-ReLU MLP activation max(x, 0)² instead of GeLU");
  p.add_flag("--untie-embeddings-and-output-weights", &a.untie_embeddings_and_output_weights,
             "separate output layer weights instead of the tied input embedding");
  p.add_false("--disable-bias-linear", &a.add_bias_linear, "no biases in linear layers");
  p.add_flag("--add-qkv-bias", &a.add_qkv_bias, "bias on the QKV projection even with --disable-bias-linear");
  p.add_flag("--attention-output-gate", &a.attention_output_gate,
             "Megatron-Core's gated attention (Qwen3-Next): linear_qkv also gives each query head a gate, and "
             "attention's output is multiplied by its sigmoid before linear_proj (model/attention_output_gate.h)");
  p.add_flag("--qk-l2-norm", &a.qk_l2_norm,
             "Megatron main's L2Norm (Llama 4): every query and key head scaled by rsqrt(mean(x^2) + --norm-epsilon) "
             "over head_dim, without a weight, after linear_qkv and before RoPE; replaces --qk-layernorm's norms "
             "(model/l2_norm.h)");
  add_softmax_type_args(p, a);
  add_mhc_args(p, a);
  add_qk_clip_args(p, a);
  add_mup_args(p, a);
  add_gemma_args(p, a);
  p.add("--make-vocab-size-divisible-by", &a.make_vocab_size_divisible_by, "pad the vocabulary to a multiple of this (times TP)");
  p.add("--attention-dropout", &a.attention_dropout, "dropout on attention probabilities");
  p.add("--hidden-dropout", &a.hidden_dropout, "dropout on the residual branches");
  p.add("--init-method-std", &a.init_method_std, "standard deviation of the normal weight initialisation");
  p.add_flag("--init-method-xavier-uniform", &a.init_method_xavier_uniform,
             "Xavier-uniform initialisation of every weight matrix (bound √(6/(fan_in + fan_out)) of its whole "
             "shape) instead of the normal one");
  p.add("--noop-layers", &a.noop_layers_flag,
        "comma-separated global layer indices (from 0) that are identity layers without parameters, to balance "
        "pipeline stages (MindSpeed)");
  p.add("--mtp-num-layers", &a.mtp_num_layers,
        "multi-token prediction (DeepSeek-V3): this many MTP layers after the decoder, layer k predicting the "
        "token k+1 positions ahead (unset: none)");
  p.add("--mtp-loss-scaling-factor", &a.mtp_loss_scaling_factor,
        "weight of the MTP loss: the mean of the MTP layers' losses times this is added to the loss");
  p.group("activation recomputation");
  p.add_choice("--recompute-granularity", &a.recompute_granularity, {"full", "selective"},
               "full: keep only the input of layer groups and rerun their forward in backward; selective: core "
               "attention only, which Gale never keeps anyway");
  p.add_choice("--recompute-method", &a.recompute_method, {"uniform", "block"},
               "with full: uniform = every layer, in groups of --recompute-num-layers; block = the first "
               "--recompute-num-layers layers of each pipeline stage (model chunk), one by one");
  p.add("--recompute-num-layers", &a.recompute_num_layers, "with full: the group size (uniform) or layer count (block)");
  p.add_flag("--recompute-activations", &a.recompute_activations, "same as --recompute-granularity selective");
  p.add_flag("--recompute-in-advance", &a.recompute_in_advance,
             "MindSpeed (interleaved pipeline, --recompute-granularity full --recompute-method block): each "
             "recompute runs as its own step before its backward, while the gradient is on its way; the last "
             "pipeline rank's last virtual stage keeps its activations (no recompute there)");
  p.add_flag("--recompute-in-bubble", &a.recompute_in_bubble,
             "MindSpeed (interleaved pipeline, no --recompute-granularity): forwards that would hold more than PP x VPP "
             "chunk activations keep only their input and recompute in a step before their backward");
  p.add_flag("--enable-recompute-layers-per-pp-rank", &a.enable_recompute_layers_per_pp_rank,
             "MindSpeed (--recompute-method block with virtual pipeline stages): --recompute-num-layers counts the "
             "layers of the pipeline rank, spread over its virtual stages (layer l of stage v recomputes when "
             "l x VPP + v < N)");
  p.add_flag("--distribute-saved-activations", &a.distribute_saved_activations,
             "with --recompute-granularity full and tensor parallelism (without --sequence-parallel): each TP rank "
             "keeps 1/TP of every recomputed group's input, all-gathered before the rerun");
  p.add_list("--recompute-modules", &a.recompute_modules,
             "with selective: the modules recomputed, of core_attn (default; Gale never keeps attention "
             "probabilities anyway), layernorm (both norms' outputs), mlp (dense MLPs keep only their input), "
             "moe_act (the experts' activation outputs; needs --moe-grouped-gemm), shared_experts (the MoE shared "
             "expert keeps only its input), moe (MoE layers keep only their input), mla_up_proj (MLA's up "
             "projections and RoPE; needs --multi-latent-attention), mhc (Megatron's mHC recomputation: the "
             "hyper-connection modules' stream inputs, aggregations and the norms' outputs, rebuilt per "
             "--mhc-recompute-layer-num block; needs --enable-mhc-connections)",
             1);
}

void add_training_args(ArgParser& p, TrainingArgs& a) {
  p.group("training");
  p.add("--micro-batch-size", &a.micro_batch_size, "samples per micro-batch per data-parallel rank (required)");
  p.add("--global-batch-size", &a.global_batch_size, "samples per iteration; default micro-batch-size * data-parallel size");
  p.add_list("--rampup-batch-size", &a.rampup_batch_size,
             "<start batch size> <batch size increment> <ramp-up samples>: grow the global batch size from the "
             "start by increments, each after ramp-up samples / ((global - start) / increment) consumed samples, up "
             "to --global-batch-size (needs --train-samples)",
             1);
  p.add_flag("--decrease-batch-size-if-needed", &a.decrease_batch_size_if_needed,
             "run each iteration on the global batch size rounded down to a multiple of --micro-batch-size times the "
             "data-parallel size (e.g. after losing ranks), counting the rest as skipped samples");
  p.add("--train-iters", &a.train_iters, "iterations to train (or --train-samples)");
  p.add("--train-samples", &a.train_samples, "samples to train (or --train-iters)");
  p.add("--exit-interval", &a.exit_interval, "exit after the iteration that is a multiple of this");
  p.add("--exit-duration-in-mins", &a.exit_duration_in_mins, "exit after this many minutes");
  p.add_flag("--exit-signal-handler", &a.exit_signal_handler,
             "on SIGTERM (to any rank), save the checkpoint (with --save) after the current iteration and exit");
  p.add_list("--iterations-to-skip", &a.iterations_to_skip_flag,
             "iterations to skip (counted from 0, as Megatron): each draws its global batch (consumed and skipped "
             "samples advance) but runs no forward, backward or optimizer step, and is not logged",
             1);
  p.add_flag("--calculate-per-token-loss", &a.calculate_per_token_loss,
             "weigh every loss token alike across the global batch: gradients are summed over micro-batches and "
             "data-parallel ranks and divided once by the global batch's loss-mask tokens (not averaged per "
             "micro-batch)");
  p.add_flag("--freeze-all-layers", &a.freeze_all_layers,
             "Megatron main: every parameter frozen; each iteration runs forward only (the losses logged, no "
             "gradients, no optimizer step, no optimizer state); --load reads the weights only, as --finetune, "
             "and the run starts at --override-ckpt-iteration or at the iteration of --save's tracker; --save "
             "writes nothing (no weights, no tracker)");
  p.add_flag("--skip-train", &a.skip_train,
             "no training: with --load, evaluate the loaded model on the validation and test sets and exit");
  p.add("--seed", &a.seed, "random seed (initialisation, dropout, data shuffles)");
  p.add_flag("--data-parallel-random-init", &a.data_parallel_random_init,
             "initialise the parameters with a different seed (--seed + 10 x data-parallel rank) on each "
             "data-parallel rank, then broadcast data-parallel rank 0's values before training, as Megatron");
  p.add_choice("--optimizer", &a.optimizer, {"adam", "sgd", "muon", "dist_muon", "lion"},
               "optimizer (adam is AdamW; muon: Muon for the 2-D weights of the layers, AdamW for the rest; "
               "dist_muon is Megatron's deprecated spelling of muon with --use-distributed-optimizer; lion: Lion "
               "with betas --adam-beta1/--adam-beta2 for the 2-D weights of the layers, AdamW for the rest)");
  p.add("--lr", &a.lr, "peak learning rate (required)");
  p.add("--min-lr", &a.min_lr, "minimum learning rate");
  p.add("--decoupled-lr", &a.decoupled_lr,
        "peak learning rate of the word embedding and the output layer (the same schedule as --lr)");
  p.add("--decoupled-min-lr", &a.decoupled_min_lr, "minimum of that learning rate (default: --min-lr)");
  p.add_choice("--lr-decay-style", &a.lr_decay_style, {"constant", "linear", "cosine", "inverse-square-root", "WSD"},
               "learning-rate decay");
  p.add("--lr-decay-iters", &a.lr_decay_iters, "iterations to decay over; default --train-iters");
  p.add("--lr-decay-samples", &a.lr_decay_samples, "samples to decay over; default --train-samples");
  p.add("--lr-warmup-iters", &a.lr_warmup_iters, "linear warmup iterations");
  p.add("--lr-warmup-samples", &a.lr_warmup_samples, "linear warmup samples");
  p.add("--lr-warmup-fraction", &a.lr_warmup_fraction, "warmup as a fraction of the decay steps");
  p.add("--lr-warmup-init", &a.lr_warmup_init, "learning rate at the start of warmup");
  p.add_choice("--lr-wsd-decay-style", &a.lr_wsd_decay_style, {"exponential", "linear", "cosine", "minus_sqrt"},
               "decay of the WSD annealing phase");
  p.add("--lr-wsd-decay-iters", &a.lr_wsd_decay_iters, "iterations of the WSD annealing phase");
  p.add("--lr-wsd-decay-samples", &a.lr_wsd_decay_samples, "samples of the WSD annealing phase");
  p.add("--weight-decay", &a.weight_decay, "AdamW weight decay (not applied to biases and norm weights)");
  p.add_flag("--apply-wd-to-qk-layernorm", &a.apply_wd_to_qk_layernorm,
             "apply the weight decay to the q_layernorm and k_layernorm parameters too (Qwen3-Next's rule; "
             "other biases and 1-D parameters still get none)");
  p.add_choice("--no-weight-decay-cond-type", &a.no_weight_decay_cond_type, {"apply_wd_to_qk_layernorm"},
               "deprecated spelling of --apply-wd-to-qk-layernorm (Megatron warns and sets it)");
  p.add("--start-weight-decay", &a.start_weight_decay, "weight decay at the start (non-constant increment)");
  p.add("--end-weight-decay", &a.end_weight_decay, "weight decay at the end (non-constant increment)");
  p.add_choice("--weight-decay-incr-style", &a.weight_decay_incr_style, {"constant", "linear", "cosine"},
               "weight decay increment");
  p.add("--clip-grad", &a.clip_grad, "clip the global gradient L2 norm to this (0 disables)");
  p.add("--adam-beta1", &a.adam_beta1, "AdamW beta1");
  p.add("--adam-beta2", &a.adam_beta2, "AdamW beta2");
  p.add("--adam-eps", &a.adam_eps, "AdamW epsilon");
  p.add("--sgd-momentum", &a.sgd_momentum, "SGD momentum");
  p.add_choice("--optimizer-selection", &a.optimizer_selection, {"fused_adamw", "fused_torch_adamw", "fused_ema_adamw"},
               "MindSpeed: the AdamW implementation; fused_ema_adamw also keeps an exponential moving average of the "
               "parameters (saved in checkpoints as optimizer.ema_params.<name>; `gale convert --use-ema` exports it)");
  p.add("--ema-decay", &a.ema_decay,
        "MindSpeed: decay of fused_ema_adamw's parameter EMA, in [0, 1] (default 0.9999; the first steps use "
        "min(decay, (1 + t) / (10 + t)))");
  p.add("--muon-momentum", &a.muon_momentum, "Muon's momentum (an EMA of the gradients)");
  p.add_false("--muon-no-split-qkv", &a.muon_split_qkv,
              "Muon: orthogonalise the fused QKV weight whole, not its query, key and value rows apart");
  p.add_flag("--muon-nesterov", &a.muon_nesterov, "Muon: Nesterov-style momentum");
  p.add_choice("--muon-scale-mode", &a.muon_scale_mode, {"spectral", "unit_rms_norm", "shape_scaling"},
               "Muon's update scale: sqrt(max(out, in)), sqrt(out/in) or sqrt(max(1, out/in))");
  p.add_choice("--muon-fp32-matmul-prec", &a.muon_fp32_matmul_prec, {"low", "medium", "high"},
               "Muon's Newton-Schulz precision: medium runs it on bf16 values, high in f32");
  p.add("--muon-coefficient-type", &a.muon_coefficient_type,
        "Muon's Newton-Schulz coefficients: simple, quintic, polar_express, cans, aol, deepseekv4, cubic5");
  p.add("--muon-num-ns-steps", &a.muon_num_ns_steps, "Muon's Newton-Schulz steps");
  p.add_choice("--muon-tp-mode", &a.muon_tp_mode, {"blockwise", "duplicated", "distributed"},
               "Muon with TP: duplicated orthogonalises the whole (gathered) matrix on every rank, blockwise each "
               "shard on its own");
  p.add_flag("--muon-use-syrk", &a.muon_use_syrk,
             "Muon: Megatron's Triton SYRK Gram kernel; accepted, the same products as plain GEMMs here");
  p.add("--muon-extra-scale-factor", &a.muon_extra_scale_factor, "Muon: a further factor on every update");
  p.add_choice("--muon-scalar-optimizer", &a.muon_scalar_optimizer, {"adam", "lion"},
               "Muon: the optimizer of the other parameters (embeddings, output layer, biases, norms)");
  p.add("--lion-beta1", &a.lion_beta1,
        "Lion's beta1 (the sign update's interpolation) as Muon's scalar optimizer; --optimizer lion's own "
        "Lion uses --adam-beta1, as Megatron");
  p.add("--lion-beta2", &a.lion_beta2,
        "Lion's beta2 (its momentum's EMA) as Muon's scalar optimizer; --optimizer lion's own Lion uses "
        "--adam-beta2, as Megatron");
  p.add_false("--no-check-for-nan-in-loss-and-grad", &a.check_for_nan_in_loss_and_grad,
              "do not stop on NaN/inf loss or gradients");
  p.add_flag("--check-for-nan-in-loss-and-grad", &a.check_for_nan_in_loss_and_grad,
             "the default (older Megatron spelling); stop on a NaN or inf loss or gradient norm");
  p.add("--check-weight-hash-across-dp-replicas-interval", &a.check_weight_hash_across_dp_replicas_interval,
        "every N iterations (and before the first) check that the data-parallel replicas hold the same parameters "
        "(their hashes), and stop if not");
  p.add_flag("--test-mode", &a.test_mode,
             "Megatron's real-time tests: before every training and evaluation iteration check that the "
             "--qk-layernorm parameters are equal on every data- and tensor-parallel rank, and stop if not");
  p.add_flag("--bf16", &a.bf16,
             "bf16 weights and GEMM inputs (bf16 GEMMs accumulate in f32; AMX where the CPU has it), f32 master "
             "weights, gradients and optimizer state");
  p.add_flag("--reuse-fp32-param", &a.reuse_fp32_param,
             "MindSpeed: with --bf16 keep the f32 master weights as the bf16 parameters plus 16-bit residuals "
             "(2 bytes per parameter less; bit-identical training)");
  p.add_flag("--swap-optimizer", &a.swap_optimizer,
             "MindSpeed: keep the optimizer's fp32 state out of memory (in a temporary file in --swap-optimizer-dir) "
             "and bring it back in --swap-optimizer-times chunks during the step; needs --use-distributed-optimizer");
  p.add("--swap-optimizer-times", &a.swap_optimizer_times,
        "MindSpeed: chunks the swapped optimizer state comes back in during the step (default 16; 0: all at once); "
        "the resident state is about one chunk");
  p.add_choice("--quant-states", &a.quant_states, {"fp8", "hif8", "mxfp8"},
               "MindSpeed: store Adam's moments as 8-bit codes: fp8 (exp_avg E4M3, exp_avg_sq E5M2) with an f32 "
               "scale per block of up to 128 elements, mxfp8 (the same formats, k-scaled) with an E8M0 scale per 32, "
               "hif8 (both HiFloat8) with fp8's blocks and MindSpeed's hif8 scale; dequantised to f32 for each update");
  p.add_flag("--quant-grads", &a.quant_grads,
             "MindSpeed: hold the main gradients as FP16 with a per-parameter f32 scale (65503 / amax), requantised "
             "at every micro-batch's accumulation, the scales aligned by a data-parallel MIN before the sum; the "
             "optimizer reads them dequantised (AdamW; f32 gradients only as one layer's scratch and for the tied "
             "embedding)");
  p.add("--swap-optimizer-dir", &a.swap_optimizer_dir,
        "Gale: directory of --swap-optimizer's temporary state file (unlinked at once; default $TMPDIR or /tmp; "
        "use a disk, not tmpfs)");
  p.add_flag("--swap-attention", &a.swap_attention,
             "MindSpeed: move each layer's attention activations kept for backward to a temporary file (in "
             "--swap-attention-dir) after its forward and read them back, one layer ahead, in backward");
  p.add_list("--swap-modules", &a.swap_modules,
             "MindSpeed: what --swap-attention moves, comma-separated: input_norm, self_attention, "
             "post_attention_norm (default all three)");
  p.add("--swap-attention-dir", &a.swap_attention_dir,
        "Gale: directory of --swap-attention's and --swap-layer-input's temporary files (unlinked at once; default "
        "$TMPDIR or /tmp; use a disk, not tmpfs)");
  p.add_flag("--swap-layer-input", &a.swap_layer_input,
             "MindSpeed: move each transformer layer's input kept for backward to a temporary file (in "
             "--swap-attention-dir) after its forward and read it back, one layer ahead, in backward");
  p.add_flag("--smart-swap", &a.smart_swap,
             "MindSpeed: choose, from a sampled warm-up iteration, the layers whose activations kept for backward go "
             "to a temporary file (in --swap-attention-dir) so that the peak memory drops by --smart-swap-reduction-mb "
             "(or to --smart-swap-target-mb), and swap them so for the rest of training (bit-identical)");
  p.add("--smart-swap-warmup-iters", &a.smart_swap_warmup_iters,
        "Gale: --smart-swap's plain iterations before the policy applies; the last one is sampled (default 2, "
        "MindSpeed's warm-up steps)");
  p.add("--smart-swap-reduction-mb", &a.smart_swap_reduction_mb,
        "Gale: how much --smart-swap lowers the sampled peak, in MiB (default 3072, MindSpeed's reduction_memory); "
        "when not reachable, as much as swapping can");
  p.add("--smart-swap-target-mb", &a.smart_swap_target_mb,
        "Gale: --smart-swap's target peak in MiB of live allocator memory instead of a reduction (MindSpeed's "
        "target_mode; default 0: off)");
  p.add_flag("--compress-optimizer", &a.compress_optimizer,
             "MindSpeed: hold Adam's moments (and SGD's momentum) losslessly compressed in memory (byte planes + zstd) "
             "between steps; each chunk is decompressed for its update and compressed again (bit-identical training)");
  p.add("--compress-activation", &a.compress_activation,
        "MindSpeed: layers whose activations kept for backward are held losslessly compressed from the end of their "
        "forward to their backward: 1-based numbers and ranges ('1-3,5') or 0 for every layer");
  p.add_choice("--compress-dense", &a.compress_dense, {"disable", "level0", "level1"},
               "MindSpeed: hold each dense MLP's fc1 output (the activation's input) compressed until its backward: "
               "level0 codes the sign/exponent byte and keeps the mantissa bytes in memory, level1 also moves the "
               "mantissa bytes to a temporary file in $TMPDIR");
  p.add_flag("--fp16", &a.fp16,
             "f16 weights and GEMM inputs (emulated on the CPU: f16 values, f32 GEMMs; docs/training.md), f32 master "
             "weights, gradients and optimizer state, with loss scaling");
  p.add("--loss-scale", &a.loss_scale, "--fp16: a constant loss scale (a positive power of 2 is best); unset: dynamic");
  p.add("--initial-loss-scale", &a.initial_loss_scale, "--fp16: initial dynamic loss scale");
  p.add("--min-loss-scale", &a.min_loss_scale, "--fp16: minimum dynamic loss scale");
  p.add("--loss-scale-window", &a.loss_scale_window,
        "--fp16: iterations without overflow before the dynamic loss scale doubles");
  p.add("--hysteresis", &a.hysteresis, "--fp16: overflows in a row before the dynamic loss scale halves");
  p.add("--num-threads", &a.num_threads, "Gale: compute threads per process (default: OMP_NUM_THREADS or all cores)");
}

void add_parallel_args(ArgParser& p, ParallelArgs& a) {
  p.group("distributed");
  p.add("--tensor-model-parallel-size", &a.tensor_model_parallel_size, "tensor-parallel size");
  p.add("--pipeline-model-parallel-size", &a.pipeline_model_parallel_size, "pipeline-parallel size");
  p.add("--num-layers-per-virtual-pipeline-stage", &a.num_layers_per_virtual_pipeline_stage,
        "layers per virtual pipeline stage (interleaved 1F1B)");
  p.add("--num-virtual-stages-per-pipeline-rank", &a.num_virtual_stages_per_pipeline_rank,
        "virtual pipeline stages per pipeline rank (interleaved 1F1B)");
  p.add("--microbatch-group-size-per-virtual-pipeline-stage", &a.microbatch_group_size_per_virtual_stage,
        "contiguous micro-batches per virtual pipeline stage in the interleaved schedule (default: the "
        "pipeline size)");
  p.add("--decoder-first-pipeline-num-layers", &a.decoder_first_pipeline_num_layers, "layers on the first pipeline stage");
  p.add("--decoder-last-pipeline-num-layers", &a.decoder_last_pipeline_num_layers, "layers on the last pipeline stage");
  p.add("--num-layer-list", &a.num_layer_list,
        "MindSpeed-LLM: the layers of each pipeline stage, comma-separated (e.g. 4,6,6,4; one per pipeline rank, "
        "summing to --num-layers; no virtual stages)");
  p.add("--pipeline-num-transformer-layers", &a.pipeline_num_transformer_layers,
        "MindSpeed: the layers of each (pipeline rank, virtual stage), one row per pipeline rank (e.g. "
        "[[0,1],[1,1]*2,[3,0]]; [..]*n repeats a row; summing to --num-layers)");
  p.add("--pipeline-model-parallel-layout", &a.pipeline_model_parallel_layout,
        "Megatron: the layers of every pipeline stage as symbols, stages split by '|' in Megatron's order (E "
        "embedding, t decoder layer, m MTP layer, L loss; x*n and (..)*n repeat; e.g. \"Et*3|(tt|)*29,m|L\"); the "
        "stage count / PP gives the virtual pipeline size");
  p.add_choice("--schedules-method", &a.schedules_method, {"dualpipev"},
               "MindSpeed: dualpipev runs DeepSeek's DualPipeV schedule (the layers cut into 2 x PP chunks, pipeline "
               "rank r holding chunks r and 2PP-1-r, so rank 0 holds the embedding and the loss; --num-layers "
               "divisible by 2 x PP, at least 2 x PP micro-batches per iteration)");
  p.add_flag("--dualpipev-dw-detach", &a.dualpipev_dw_detach,
             "MindSpeed: with --schedules-method dualpipev, the cool-down backwards (and those of DualPipeV's phase 3) "
             "send their input gradient first and run the linears' weight gradients later, in the schedule's bubbles "
             "(DeepSeek's WeightGradStore); dense GPT layers only");
  p.add_flag("--account-for-embedding-in-pipeline-split", &a.account_for_embedding_in_pipeline_split,
             "count the input embedding as one layer of the first (virtual) pipeline stage when dividing the layers");
  p.add_flag("--account-for-loss-in-pipeline-split", &a.account_for_loss_in_pipeline_split,
             "count the loss as one layer of the last (virtual) pipeline stage when dividing the layers");
  p.add("--context-parallel-size", &a.context_parallel_size,
        "context-parallel size: each sequence cut into 2 x CP chunks, cp rank r holding chunks r and 2CP-1-r");
  p.add("--context-parallel-algo", &a.context_parallel_algo,
        "context-parallel algorithm (MindSpeed): megatron_cp_algo (default; ring attention, or with --cp-comm-type "
        "allgather keys and values all-gathered) or kvallgather_cp_algo (keys and values all-gathered, queries local, "
        "key/value gradients reduce-scattered; = --cp-comm-type allgather) or ulysses_cp_algo (all-to-all from sequence to head split; heads and query groups divisible by TP x CP) or "
        "hybrid_cp_algo (Ulysses within groups of --ulysses-degree-in-cp consecutive cp ranks, ring attention "
        "across them) or adaptive_cp_algo (ring attention over a layout chosen from the attention mask, the empty "
        "blocks skipped) or hybrid_adaptive_cp_algo (hybrid_cp_algo with that ring)");
  p.add("--ulysses-degree-in-cp", &a.ulysses_degree_in_cp,
        "hybrid_cp_algo: U, the cp ranks of each Ulysses sub-group (1 < U < CP, dividing CP; heads and query "
        "groups divisible by TP x U); the ring degree is CP / U");
  p.add_list("--cp-comm-type", &a.cp_comm_type_list,
             "context-parallel communication (Megatron; one type for all layers): p2p (default; ring attention, "
             "key/value blocks passed around the cp group, overlapped with attention), allgather (keys and values "
             "all-gathered), a2a (= --context-parallel-algo ulysses_cp_algo) or a2a+p2p (= hybrid_cp_algo, with "
             "--hierarchical-context-parallel-sizes A P: all-to-all within A adjacent cp ranks, the ring across them)",
             1);
  p.add_list("--hierarchical-context-parallel-sizes", &a.hierarchical_context_parallel_sizes,
             "--cp-comm-type a2a+p2p: the all-to-all and ring levels of the cp group, A P with A x P = CP", 1);
  p.add("--cp-window-size", &a.cp_window_size,
        "ring attention (megatron_cp_algo with --cp-comm-type p2p, hybrid_cp_algo): W > 1 runs MindSpeed's double "
        "ring, an inner ring of W consecutive ranks and an outer ring across the windows (1 <= W < ring size, W "
        "dividing it; default 1: one ring)");
  p.add_choice("--context-parallel-kv-cache-policy", &a.context_parallel_kv_cache_policy, {"full", "half"},
               "ring attention keeps the key/value blocks received in forward for backward: full (keys and values; "
               "backward sends only gradients) or half (keys; backward passes the values around again)");
  p.add("--context-parallel-cache-interval", &a.context_parallel_cache_interval,
        "with --context-parallel-kv-cache-policy: cache in every layer (0, default) or in layers 0, k+1, 2(k+1), ... "
        "(0 <= k < --num-layers)");
  p.add_flag("--use-ulysses-allgather-kv", &a.use_ulysses_allgather_kv,
             "MindSpeed: with --context-parallel-algo ulysses_cp_algo and one query group per TP rank (MQA), "
             "all-gather the keys and values over the cp group and all-to-all only the queries");
  p.add_flag("--adaptive-cp-only-reschedule", &a.adaptive_cp_only_reschedule,
             "MindSpeed, adaptive_cp_algo: keep the sequence in order (rank r holds positions r*S/CP ...) and only skip "
             "the ring's empty blocks; no remap of positions across the cp ranks");
  p.add_flag("--adaptive-cp-without-coarse", &a.adaptive_cp_without_coarse,
             "MindSpeed, adaptive_cp_algo: remap single positions instead of units of S/1024 (the coarsened mask)");
  p.add_flag("--adaptive-cp-dynamic-attn-mask", &a.adaptive_cp_dynamic_attn_mask,
             "MindSpeed, adaptive_cp_algo: compute the layout for every micro-batch (the mask changes between "
             "micro-batches; required with --reset-attention-mask), not once");
  p.add_flag("--attention-mask-on-cpu", &a.attention_mask_on_cpu,
             "MindSpeed, adaptive_cp_algo: keep the whole mask in host memory; no effect in Gale, which never builds "
             "the mask (the blocks come from the document ids and --sliding-window on the host)");
  p.add_flag("--adaptive-cp-manually-set-mask-list", &a.adaptive_cp_manually_set_mask_list,
             "MindSpeed, adaptive_cp_algo: a mask list from a user-edited hook; not supported yet");
  p.add("--expert-model-parallel-size", &a.expert_model_parallel_size, "expert-parallel size");
  p.add_flag("--unaligned-linear", &a.unaligned_linear,
             "tensor parallelism with --num-attention-heads / --num-query-groups / --ffn-hidden-size not divisible "
             "by TP: whole query groups (with their heads) and FFN columns dealt out unevenly, one more to each of "
             "the first ranks (MindSpeed's UnalignedLinearFeature)");
  p.add_flag("--tp-2d", &a.tp_2d,
             "2-D tensor parallelism (MindSpeed's TP2dFeature): the TP ranks as a --tp-x x --tp-y grid, activations "
             "and linear weights sharded on both axes, norms all-reduced over the hidden axis");
  p.add("--tp-x", &a.tp_x, "--tp-2d: the first axis of the grid (splits the sequence between layers, the linears' "
                           "outputs of linear_qkv / linear_fc1)");
  p.add("--tp-y", &a.tp_y, "--tp-2d: the second axis (splits the hidden size between layers); --tp-x x --tp-y = "
                           "--tensor-model-parallel-size");
  p.add_flag("--sequence-parallel", &a.sequence_parallel, "split activations along the sequence inside the TP group");
  p.add_flag("--use-distributed-optimizer", &a.use_distributed_optimizer, "shard optimizer state across data-parallel ranks");
  p.add_flag("--use-custom-fsdp,--use-megatron-fsdp", &a.use_custom_fsdp,
             "Megatron's custom FSDP; what it shards is --data-parallel-sharding-strategy (no_shard: plain data "
             "parallelism, optim: the distributed optimizer, optim_grads: ZeRO-2, optim_grads_params: ZeRO-3)");
  p.add_choice("--data-parallel-sharding-strategy", &a.data_parallel_sharding_strategy,
               {"no_shard", "optim", "optim_grads", "optim_grads_params"},
               "with --use-custom-fsdp: no_shard (default), optim (ZeRO-1), optim_grads (ZeRO-2), optim_grads_params "
               "(ZeRO-3)");
  p.add_flag("--layerzero", &a.layerzero,
             "MindSpeed's LayerZeRO: ZeRO-3 inside sub-groups of zero3_size consecutive data-parallel ranks, the "
             "optimizer state sharded over the whole data-parallel group (needs --layerzero-config)");
  p.add("--layerzero-config", &a.layerzero_config,
        "MindSpeed: the LayerZeRO YAML file (zero3_size; param_dtype/reduce_dtype fp32; see docs/parallelism.md)");
  p.add_flag("--use-torch-fsdp2", &a.use_torch_fsdp2,
             "PyTorch FSDP2 (Megatron; MindSpeed's TorchFullyShardedDataParallelFeature): ZeRO-3 with each "
             "transformer layer and the embedding gathered for its forward and backward, the head kept from the "
             "forward's start to the backward's end (needs --untie-embeddings-and-output-weights)");
  p.add("--fsdp2-config-path", &a.fsdp2_config_path,
        "MindSpeed: the FSDP2 YAML file (sharding_size, sub_modules_to_wrap, reshard_after_forward, "
        "num_to_forward_prefetch; fp32; see docs/parallelism.md)");
  p.add("--num-distributed-optimizer-instances", &a.num_distributed_optimizer_instances,
        "with --use-distributed-optimizer: shard the optimizer state inside N groups of DP x CP / N consecutive "
        "data-parallel ranks, replicated across the groups");
  p.add_flag("--overlap-grad-reduce", &a.overlap_grad_reduce, "overlap gradient reduction with backward");
  p.add_flag("--overlap-param-gather", &a.overlap_param_gather, "overlap parameter all-gather with forward");
  p.add_flag("--overlap-param-gather-with-optimizer-step", &a.overlap_param_gather_with_optimizer_step,
             "start the first model chunk's parameter all-gather (one bucket) right after the optimizer updates it, "
             "overlapped with the other chunks' update (interleaved pipeline parallelism)");
  p.add_flag("--reset-bucket-group-order", &a.reset_bucket_group_order,
             "MindSpeed: with --overlap-param-gather, prefetch each bucket's parameter all-gather in the order the "
             "first iteration's forward used them, not the buffer's order");
  p.add_flag("--optimize-send-recv-comm", &a.optimize_send_recv_comm,
             "MindSpeed: the 1F1B pipeline schedule (without interleaving) sends the gradients on a second "
             "communicator over the pipeline group, the activations on the pipeline group");
  p.add_flag("--dist-train", &a.dist_train,
             "MindSpeed: several sub-worlds with their own TP/PP/DP layouts in one job, chained along the model's "
             "layers, described by --mm-model's dist_config");
  p.add("--mm-model", &a.mm_model,
        "MindSpeed-MM's model JSON; with --dist-train its \"dist_config\" gives the sub-worlds");
  p.add_flag("--use-multiparameter-pipeline-model-parallel", &a.use_multiparameter_pipeline_model_parallel,
             "MindSpeed: the pipeline stages exchange a list of typed tensors (the hidden states, and with "
             "--reset-attention-mask the document ids) instead of the hidden states alone");
  p.add("--param-and-grad-buffer-pad", &a.param_and_grad_buffer_pad,
        "MindSpeed: pad the parameter and gradient buffers so that every bucket (and distributed-optimizer shard) "
        "starts at a multiple of this many bytes (512 on Ascend)");
  p.add("--ddp-bucket-size", &a.ddp_bucket_size,
        "gradient bucket size in elements with --overlap-grad-reduce (default max(40M, 1M x data-parallel size))");
  p.add("--ddp-num-buckets", &a.ddp_num_buckets,
        "gradient buckets: the bucket size becomes this rank's parameter count / N (instead of --ddp-bucket-size)");
  p.add_flag("--use-tp-pp-dp-mapping", &a.use_tp_pp_dp_mapping, "rank order tp-cp-ep-pp-dp instead of tp-cp-ep-dp-pp");
  p.add_choice("--distributed-backend", &a.distributed_backend, {"mpi", "nccl", "gloo"},
               "collectives backend (mpi on CPUs; nccl needs a CUDA build)");
  p.add("--distributed-timeout-minutes", &a.distributed_timeout_minutes, "timeout of collective operations");
}

void add_data_args(ArgParser& p, DataArgs& a) {
  p.group("data");
  p.add_list("--data-path", &a.data_path, "dataset prefix, weighted blend 'w1 p1 w2 p2 ...', or list 'p1 p2 ...'");
  p.add("--split", &a.split, "train/valid/test proportions of --data-path (default '969, 30, 1')");
  p.add_list("--train-data-path", &a.train_data_path, "training blend (instead of --data-path)");
  p.add_list("--valid-data-path", &a.valid_data_path, "validation blend (instead of --data-path)");
  p.add_list("--test-data-path", &a.test_data_path, "test blend (instead of --data-path)");
  p.add("--data-args-path", &a.data_args_path, "file holding the --data-path text");
  p.add("--per-split-data-args-path", &a.per_split_data_args_path, "JSON file with train/valid/test blends");
  p.add_flag("--mock-data", &a.mock_data, "synthetic data (Megatron's mock GPT dataset)");
  p.add("--data-cache-path", &a.data_cache_path, "where to cache dataset indices");
  p.add_flag("--eod-mask-loss", &a.eod_mask_loss, "no loss on end-of-document tokens");
  p.add_flag("--reset-position-ids", &a.reset_position_ids, "restart position ids after each end-of-document");
  p.add_flag("--reset-attention-mask", &a.reset_attention_mask, "no attention across end-of-document boundaries");
  p.add_flag("--dataloader-inter-document-masking", &a.dataloader_inter_document_masking,
             "attention and position ids restart at every document boundary of a sample (Megatron's cu_seqlens)");
  p.add("--mid-level-dataset-surplus", &a.mid_level_dataset_surplus,
        "extra fraction of samples built for each dataset of a weighted blend: a split of n samples "
        "gives a dataset of weight w ceil(ceil(n*w)*(1+surplus)) samples (default 0.005)");
  p.add("--per-dataset-sequences-path", &a.per_dataset_sequences_path,
        "JSON file of each dataset prefix's [sequence_count, document_count] (as Megatron's "
        "tools/build_sequences_per_dataset.py writes it) standing for the .idx headers; checked against each .idx");
  p.add_flag("--allow-ambiguous-pad-tokens", &a.allow_ambiguous_pad_tokens,
             "keep the tokenizer's pad id when it shares its id with another special token (labels equal to it get "
             "no loss, which Megatron warns makes training unstable); by default such a pad is not masked");
  p.add_flag("--sft", &a.sft, "Megatron SFT: --data-path is a JSONL file of \"messages\" conversations (needs "
                              "--tokenizer-type SFTTokenizer)");
  p.add("--sft-tokenizer-prompt-format", &a.sft_tokenizer_prompt_format,
        "SFT prompt format: nemotron-h-aligned (default), nemotron-nano-v2 or identity");
  p.add("--fix-sub-seq-length", &a.fix_sub_seq_length,
        "MindSpeed: with --reset-attention-mask, attend within consecutive sub-sequences of this many positions (the "
        "last one takes the rest) instead of the documents; <= 0 or > --seq-length: the documents (default -1)");
  p.add("--num-workers", &a.num_workers,
        "data loader workers (with --fim-data: Megatron's per-worker FIM random streams, micro-batch m read by "
        "worker m mod N)");
  p.add("--dataloader-type", &a.dataloader_type,
        "single: one pass in dataset order (default); cyclic: Megatron's shuffled order (torch.randperm seeded "
        "with the epoch), epoch after epoch");
  p.add_false("--no-data-sharding", &a.data_sharding,
              "with --dataloader-type cyclic: shuffle the whole dataset and deal it out to the data-parallel ranks "
              "instead of shuffling each rank's own bucket");
  p.add_false("--no-mmap-bin-files", &a.mmap_bin_files, "read .bin files instead of mapping them");
  p.add_flag("--is-instruction-dataset", &a.is_instruction_dataset,
             "MindSpeed-LLM: --data-path is an instruction dataset (PREFIX_packed_*_document) for fine-tuning");
  p.add_flag("--neat-pack", &a.neat_pack,
             "MindSpeed-LLM: the instruction dataset is neat-packed (its attention mask numbers each pack's samples); "
             "needs --reset-attention-mask");
  p.add_flag("--variable-seq-lengths", &a.variable_seq_lengths,
             "micro-batches of different sequence lengths: an instruction dataset's micro-batch is padded to its "
             "longest sample instead of --seq-length (level 2)");
  p.add_flag("--fim-data", &a.fim_data,
             "Megatron's fill-in-the-middle dataset: GPT samples turned into PSM/SPM FIM samples (needs "
             "--tokenizer-type HuggingFaceTokenizer)");
  p.add("--fim-rate", &a.fim_rate, "probability to turn a sample (or segment) into FIM");
  p.add("--fim-spm-rate", &a.fim_spm_rate, "probability that a FIM sample is SPM rather than PSM");
  p.add("--fim-split-sample", &a.fim_split_sample,
        "token at which a segment is cut into fragments, each turned into FIM with --fim-fragment-rate");
  p.add("--fim-fragment-rate", &a.fim_fragment_rate, "probability of FIM per fragment; unset by default, needed with --fim-split-sample");
  p.add("--fim-no-prefix", &a.fim_no_prefix, "no FIM for a segment whose text starts with this string");
  p.add("--fim-prefix-token", &a.fim_prefix_token, "FIM prefix token");
  p.add("--fim-middle-token", &a.fim_middle_token, "FIM middle token");
  p.add("--fim-suffix-token", &a.fim_suffix_token, "FIM suffix token");
  p.add("--fim-pad-token", &a.fim_pad_token, "FIM pad token");
  p.add("--fim-eod-token", &a.fim_eod_token, "FIM end-of-document token at which samples are cut");
}

void add_tokenizer_args(ArgParser& p, TokenizerArgs& a) {
  p.group("tokenizer");
  std::vector<std::string> types = {"GPT2BPETokenizer",          "HuggingFaceTokenizer", "SentencePieceTokenizer",
                                    "GPTSentencePieceTokenizer", "Llama2Tokenizer",      "TikTokenizer",
                                    "NullTokenizer",             "PretrainedFromHF",     "SFTTokenizer"};
  types.insert(types.end(), kUnsupportedTokenizerTypes.begin(), kUnsupportedTokenizerTypes.end());
  p.add_choice("--tokenizer-type", &a.tokenizer_type, types,
               "tokenizer (default GPT2BPETokenizer; NullTokenizer with --mock-data and no tokenizer files; "
               "MindSpeed-LLM's PretrainedFromHF is HuggingFaceTokenizer)");
  p.add("--vocab-file", &a.vocab_file, "vocabulary file (GPT-2 vocab.json)");
  p.add("--merge-file", &a.merge_file, "BPE merges file (GPT-2 merges.txt)");
  p.add("--tokenizer-model,--tokenizer-name-or-path", &a.tokenizer_model,
        "tokenizer model (SentencePiece .model, or tokenizer.json / its folder; MindSpeed-LLM: "
        "--tokenizer-name-or-path)");
  p.add("--vocab-size", &a.vocab_size, "vocabulary size of NullTokenizer (and of --mock-data)");
  p.add("--vocab-extra-ids", &a.vocab_extra_ids, "extra sentinel ids added to the vocabulary");
  p.add("--tiktoken-pattern", &a.tiktoken_pattern, "TikTokenizer's split pattern: v1 or v2");
  p.add("--tiktoken-num-special-tokens", &a.tiktoken_num_special_tokens,
        "TikTokenizer: number of special tokens, ids 0..N-1 (default 1000)");
  p.add_list("--tiktoken-special-tokens", &a.tiktoken_special_tokens,
             "TikTokenizer: the named special tokens, first; must include <unk> <s> </s> (their default)", 1);
}

void add_checkpoint_args(ArgParser& p, CheckpointArgs& a) {
  p.group("checkpointing");
  p.add("--save", &a.save, "directory to save checkpoints to");
  p.add("--load", &a.load, "directory to load a checkpoint from");
  p.add("--save-interval,--persistent-save-interval", &a.save_interval, "iterations between checkpoints (required with --save)");
  p.add_false("--no-load-optim", &a.load_optim, "do not load optimizer state");
  p.add_false("--no-load-rng", &a.load_rng, "do not load RNG state");
  p.add_false("--no-save-optim", &a.save_optim, "do not save optimizer state");
  p.add_false("--no-save-rng", &a.save_rng, "do not save RNG state");
  p.add_flag("--finetune", &a.finetune, "load weights only; reset iteration, optimizer and RNG");
  p.add("--override-ckpt-iteration", &a.override_ckpt_iteration,
        "start from this iteration instead of the loaded checkpoint's, with consumed samples N x "
        "--global-batch-size, so that the data loader replays from there (optimizer and scheduler as loaded)");
  p.add_flag("--exit-on-missing-checkpoint", &a.exit_on_missing_checkpoint, "stop if --load has no checkpoint");
  p.add("--ckpt-step", &a.ckpt_step, "load iter_<N> of the checkpoint directory instead of its latest iteration");
  p.add("--pretrained-checkpoint", &a.pretrained_checkpoint,
        "when --load holds no checkpoint, load this one's weights as --finetune does (iteration 0)");
  p.add_flag("--use-checkpoint-args", &a.use_checkpoint_args,
             "take the model flags Megatron takes from the checkpoint in --load (its metadata.json args; "
             "train/checkpoint_args.h lists them) instead of the command line");
  p.add_flag("--use-mp-args-from-checkpoint-args", &a.use_mp_args_from_checkpoint_args,
             "with --use-checkpoint-args: also the tensor, pipeline and expert parallel sizes");
  p.add_false("--no-use-tokenizer-model-from-checkpoint-args", &a.use_tokenizer_model_from_checkpoint_args,
              "with --use-checkpoint-args: keep the command line's --tokenizer-model");
  p.add_flag("--override-opt_param-scheduler", &a.override_opt_param_scheduler,
             "on --load, keep this run's learning-rate and weight-decay schedule flags");
  p.add_flag("--use-checkpoint-opt_param-scheduler", &a.use_checkpoint_opt_param_scheduler,
             "on --load, take the learning-rate and weight-decay schedule from the checkpoint");
  p.add("--ckpt-format", &a.ckpt_format,
        "Megatron's checkpoint format (torch, torch_dist, zarr, torch_dcp, fsdp_dtensor): accepted, but Gale always "
        "writes its own sharded safetensors format (docs/formats/checkpoint.md) and detects what --load holds (its "
        "own, Megatron's torch, torch_dist or torch_dcp: docs/formats/megatron-checkpoint.md)");
  p.add_choice("--ckpt-convert-format", &a.ckpt_convert_format, {"torch", "torch_dist", "zarr"},
               "convert the --load checkpoint to this format in --ckpt-convert-save/FORMAT at this run's tensor and "
               "pipeline parallel sizes, then exit (Megatron's conversion; Gale writes torch, Megatron's legacy "
               "format: the model weights and the iteration)");
  p.add("--ckpt-convert-save", &a.ckpt_convert_save, "the directory of --ckpt-convert-format's checkpoint");
  p.add_flag("--async-save", &a.async_save,
             "save checkpoints asynchronously: each rank copies what it saves into host memory (peak host memory "
             "rises by one such copy) and a background thread writes it while training continues; the tracker file "
             "is written once every rank has finished (needs --ckpt-format torch_dist, torch_dcp or fsdp_dtensor)");
  p.add("--non-persistent-save-interval", &a.non_persistent_save_interval,
        "iterations between non-persistent checkpoints (needs --save and --non-persistent-ckpt-type)");
  p.add_choice("--non-persistent-ckpt-type", &a.non_persistent_ckpt_type, {"global", "local", "in_memory"},
        "global: a normal checkpoint in --non-persistent-global-ckpt-dir with older ones removed; local: each rank "
        "saves its part in --non-persistent-local-ckpt-dir/<rank>");
  p.add("--non-persistent-global-ckpt-dir", &a.non_persistent_global_ckpt_dir,
        "directory of the global non-persistent checkpoints (default <save>/non_persistent, read from "
        "<load>/non_persistent)");
  p.add("--non-persistent-local-ckpt-dir", &a.non_persistent_local_ckpt_dir,
        "root directory of the local non-persistent checkpoints (each rank writes <dir>/<rank>/)");
  p.add_choice("--non-persistent-local-ckpt-algo", &a.non_persistent_local_ckpt_algo, {"fully_parallel", "atomic"},
        "fully_parallel: each rank saves its share of one copy (a load exchanges the parts); atomic: each rank "
        "saves everything it holds (a load reads only its own part)");
  p.add_flag("--replication", &a.replication,
             "replicate local checkpoints: each part is also stored by the other ranks of its clique");
  p.add("--replication-jump", &a.replication_jump,
        "J: the spacing between the ranks of a replication clique (n, n+J, n+2J, ...)");
  p.add("--replication-factor", &a.replication_factor, "F: the number of ranks holding each local part (default 2)");
}

void add_logging_args(ArgParser& p, LoggingArgs& a) {
  p.group("logging");
  p.add("--log-interval", &a.log_interval, "iterations between log lines");
  p.add_flag("--log-throughput", &a.log_throughput, "add TFLOP/s to the log line");
  p.add_flag("--log-straggler", &a.log_straggler,
             "at every log line, rank 0 prints each reading's fastest and slowest rank (forward compute, get_batch, "
             "estimated TFLOP/s, CPU power/temperature/utilisation/clock)");
  p.add_flag("--disable-straggler-on-startup", &a.disable_straggler_on_startup,
             "start the straggler detector off (a connection to --straggler-ctrlr-port toggles it)");
  p.add("--straggler-ctrlr-port", &a.straggler_ctrlr_port,
        "rank 0's TCP port that toggles the straggler detector (default 65535)");
  p.add("--straggler-minmax-count", &a.straggler_minmax_count,
        "number of ranks of lowest and highest estimated TFLOP/s to list (default 1: none listed)");
  p.add_flag("--log-progress", &a.log_progress,
             "append the job's start and every checkpoint save (throughput, floating-point operations, tokens) to "
             "progress.txt in the --save directory");
  p.add_flag("--log-params-norm", &a.log_params_norm, "add the parameter L2 norm to the log line");
  p.add_flag("--log-num-zeros-in-grad", &a.log_num_zeros_in_grad, "add the number of zero gradients to the log line");
  p.add("--eval-interval", &a.eval_interval, "iterations between validation runs");
  p.add("--eval-iters", &a.eval_iters, "iterations per validation run");
  p.add("--timing-log-level", &a.timing_log_level,
        "timers reported after each log line: 0 checkpoint and set-up times only, 1 adds forward-backward, "
        "gradient reductions and optimizer phases, 2 adds per-micro-batch compute and pipeline transfers");
  p.add_choice("--timing-log-option", &a.timing_log_option, {"max", "minmax", "all"},
               "how timers are reported across ranks: the maximum, the minimum and maximum, or every rank");
  p.add_false("--no-barrier-with-level-1-timing", &a.barrier_with_l1_time,
              "start level-1 timers without first waiting for every rank");
  p.add("--tensorboard-dir", &a.tensorboard_dir,
        "write TensorBoard event files to this directory (created if missing; last rank only)");
  p.add("--config-logger-dir", &a.config_logger_dir,
        "dump, as Megatron's config logger, each model chunk's configuration (JSON) and initial state dict, the "
        "DDP and optimizer configurations, and every last-stage forward's input ids and logits (.pth) to this "
        "directory, one file per rank and call (docs/formats/config-logger.md)");
  p.add("--wandb-project", &a.wandb_project,
        "Weights & Biases project: the last rank writes the run offline, for `wandb sync` (needs --wandb-exp-name)");
  p.add("--wandb-exp-name", &a.wandb_exp_name, "Weights & Biases run name (--wandb-project)");
  p.add("--wandb-save-dir", &a.wandb_save_dir,
        "directory of the Weights & Biases run (its wandb/offline-run-* directory); default {--save}/wandb");
  p.add("--tensorboard-log-interval", &a.tensorboard_log_interval, "iterations between TensorBoard scalars");
  p.add("--tensorboard-queue-size", &a.tensorboard_queue_size,
        "TensorBoard events kept in memory before they are written to the file");
  p.add_flag("--log-timers-to-tensorboard", &a.log_timers_to_tensorboard,
             "write iteration-time (and throughput with --log-throughput) and the timers of --timing-log-level to "
             "TensorBoard");
  p.add_flag("--log-batch-size-to-tensorboard", &a.log_batch_size_to_tensorboard, "write batch-size to TensorBoard");
  p.add_false("--no-log-learnig-rate-to-tensorboard", &a.log_learning_rate_to_tensorboard,
              "do not write learning-rate to TensorBoard (Megatron's spelling)");
  p.add_false("--no-log-loss-scale-to-tensorboard", &a.log_loss_scale_to_tensorboard,
              "do not write loss-scale to TensorBoard");
  p.add_flag("--log-validation-ppl-to-tensorboard", &a.log_validation_ppl_to_tensorboard,
             "write validation perplexity to TensorBoard");
  p.add_flag("--log-memory-to-tensorboard", &a.log_memory_to_tensorboard,
             "write the host allocator's byte counts to TensorBoard");
  p.add_flag("--log-world-size-to-tensorboard", &a.log_world_size_to_tensorboard, "write world-size to TensorBoard");
  p.add("--log-memory-interval", &a.log_memory_interval,
        "Megatron main's: every N iterations (a multiple of --log-interval) print the memory report line "
        "\"[Rank R] (after N iterations) memory (MB) | allocated: ...\" after the log line");
}

void add_all_pretrain_args(ArgParser& p, Arguments& a) {
  add_model_args(p, a.model);
  add_training_args(p, a.training);
  add_parallel_args(p, a.parallel);
  add_data_args(p, a.data);
  add_phase_args(p, a.data);
  add_data_cache_args(p, a.data);
  add_tokenizer_args(p, a.tokenizer);
  add_checkpoint_args(p, a.checkpoint);
  add_logging_args(p, a.logging);
  add_moe_args(p, a.moe);
  add_lora_args(p, a.lora);
  add_dpo_args(p, a.dpo);
  add_mla_args(p, a.model);
  add_hybrid_args(p, a.model);
  add_heterogeneous_args(p, a.model);
  add_qat_args(p, a.model);
  add_fp8_args(p, a.model);
  add_precision_args(p, a.training);
  add_ddp_precision_args(p, a.parallel);
  add_automated_pipeline_args(p, a.parallel);
  add_qad_args(p, a.qad);
  add_logits_kd_args(p, a.logits_kd);
  add_rerun_args(p, a.rerun);
  add_ft_args(p, a.ft);
  add_profile_args(p, a.profile);
  add_megatron_compat_args(p, a.megatron_compat);
  add_megatron_main_args(p, a);
  add_mindspeed_compat_args(p, a.mindspeed_compat);
  add_auto_settings_args(p, a.auto_settings);
}

int64_t pad_vocab_size(int64_t vocab, int64_t divisible_by, int64_t tp) {
  int64_t multiple = divisible_by * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

namespace {
Status required(int64_t v, const char* flag) {
  if (v == kUnset) return InvalidArgument(flag, " is required");
  if (v <= 0) return InvalidArgument(flag, ": expected a positive integer, found ", v);
  return Status::Ok();
}
Status in_unit_interval(double v, const char* flag) {
  if (!(v >= 0.0 && v < 1.0)) return InvalidArgument(flag, ": expected a probability in [0, 1), found ", v);
  return Status::Ok();
}
}  // namespace

// --noop-layers: MindSpeed's checks (digits only, each in [0, --num-layers)); duplicates collapse.
Status parse_noop_layers(ModelArgs& m) {
  m.noop_layers.clear();
  if (m.noop_layers_flag.empty()) return Status::Ok();
  size_t start = 0;
  while (start <= m.noop_layers_flag.size()) {
    size_t comma = m.noop_layers_flag.find(',', start);
    if (comma == std::string::npos) comma = m.noop_layers_flag.size();
    const std::string item = m.noop_layers_flag.substr(start, comma - start);
    if (item.empty() || item.size() > 9 || item.find_first_not_of("0123456789") != std::string::npos)
      return InvalidArgument("--noop-layers: expected comma-separated layer indices such as 0,23, found \"", item,
                             "\" in \"", m.noop_layers_flag, "\"");
    const int64_t layer = std::stoll(item);
    if (layer >= m.num_layers)
      return InvalidArgument("--noop-layers: layer ", layer, " is not below --num-layers ", m.num_layers,
                             " (indices count from 0)");
    m.noop_layers.push_back(layer);
    start = comma + 1;
  }
  std::sort(m.noop_layers.begin(), m.noop_layers.end());
  m.noop_layers.erase(std::unique(m.noop_layers.begin(), m.noop_layers.end()), m.noop_layers.end());
  return Status::Ok();
}

// --position-embedding-type alibi and MindSpeed's ALiBi flags (ModelArgs::alibi_fusion_attn_type).
static Status validate_alibi_args(const ModelArgs& m, const ArgParser& p) {
  const bool alibi = m.position_embedding_type == "alibi";
  for (const char* flag : {"--alibi-fusion-attn-type", "--square-alibi-mask", "--fill-neg-inf", "--alibi-diagonal-opposite"})
    if (p.was_set(flag) && !alibi)
      return InvalidArgument(flag, " needs --position-embedding-type alibi, found ", m.position_embedding_type);
  if (!alibi) return Status::Ok();
  if (m.alibi_fusion_attn_type != kUnset && m.alibi_fusion_attn_type != 2) {
    if (m.alibi_fusion_attn_type == 0 || m.alibi_fusion_attn_type == 3)
      return InvalidArgument("--alibi-fusion-attn-type: expected 2 (Gale's in-kernel bias -m*(i-j)), found ",
                             m.alibi_fusion_attn_type,
                             m.alibi_fusion_attn_type == 0 ? " (an explicit compressed bias tensor, not supported)"
                                                           : " (a different in-kernel bias form, not supported)");
    return InvalidArgument("--alibi-fusion-attn-type: expected 0, 2 or 3 (MindSpeed), found ", m.alibi_fusion_attn_type);
  }
  if (m.fill_neg_inf && !m.square_alibi_mask)
    return InvalidArgument("--fill-neg-inf needs --square-alibi-mask (MindSpeed), found it off");
  if (m.multi_latent_attention)
    return Unimplemented("--position-embedding-type alibi with --multi-latent-attention: not supported (MLA "
                         "carries its positions in the RoPE part of its heads)");
  return Status::Ok();
}

Status validate_model_args(ModelArgs& m, const ArgParser& p) {
  GALE_RETURN_IF_ERROR(required(m.num_layers, "--num-layers"));
  GALE_RETURN_IF_ERROR(required(m.hidden_size, "--hidden-size"));
  GALE_RETURN_IF_ERROR(required(m.num_attention_heads, "--num-attention-heads"));
  GALE_RETURN_IF_ERROR(required(m.seq_length, "--seq-length"));
  GALE_RETURN_IF_ERROR(required(m.max_position_embeddings, "--max-position-embeddings"));
  if (m.use_rotary_position_embeddings && m.position_embedding_type == "alibi")
    return InvalidArgument("--use-rotary-position-embeddings with --position-embedding-type alibi: expected one "
                           "position embedding, found RoPE and ALiBi");
  if (m.use_rotary_position_embeddings) m.position_embedding_type = "rope";
  GALE_RETURN_IF_ERROR(validate_alibi_args(m, p));
  GALE_RETURN_IF_ERROR(validate_yarn_args(m, p));
  GALE_RETURN_IF_ERROR(validate_longrope_args(m, p));
  if (m.use_rope_scaling && m.position_embedding_type != "rope")
    return InvalidArgument("--use-rope-scaling needs --position-embedding-type rope, found ", m.position_embedding_type);
  if (m.use_rope_scaling && m.multi_latent_attention)
    return InvalidArgument("--use-rope-scaling with --multi-latent-attention: MLA's RoPE scaling is YaRN "
                           "(--rotary-scaling-factor)");
  if (m.use_rope_scaling && !(m.rope_scaling_factor >= 1.0))
    return InvalidArgument("--rope-scaling-factor: expected a number ≥ 1, found ", m.rope_scaling_factor);
  if (m.openai_gelu && m.swiglu) return InvalidArgument("--openai-gelu with --swiglu: the SwiGLU MLP has no GeLU");
  GALE_RETURN_IF_ERROR(validate_glu_args(m));
  if (m.squared_relu && m.swiglu)
    return InvalidArgument("--squared-relu with --swiglu: the MLP has one activation (squared ReLU or SwiGLU)");
  if (m.squared_relu && m.openai_gelu)
    return InvalidArgument("--squared-relu with --openai-gelu: the MLP has one activation (squared ReLU or GeLU)");
  if (m.rotary_interleaved && m.position_embedding_type != "rope" && !m.multi_latent_attention)
    return InvalidArgument("--rotary-interleaved needs --position-embedding-type rope (or --multi-latent-attention), found ",
                           m.position_embedding_type);
  if (!unset(m.rotary_seq_len_interpolation_factor)) {
    if (!(m.rotary_seq_len_interpolation_factor > 0.0))
      return InvalidArgument("--rotary-seq-len-interpolation-factor: expected a positive number, found ",
                             m.rotary_seq_len_interpolation_factor);
    if (m.position_embedding_type != "rope" || m.multi_latent_attention)
      return InvalidArgument("--rotary-seq-len-interpolation-factor needs --position-embedding-type rope without "
                             "--multi-latent-attention (found ",
                             m.multi_latent_attention ? "--multi-latent-attention" : m.position_embedding_type, ")");
  }
  if (m.kv_channels == kUnset) {
    if (m.hidden_size % m.num_attention_heads != 0)
      return InvalidArgument("--hidden-size ", m.hidden_size, " must be divisible by --num-attention-heads ",
                             m.num_attention_heads, " (or give --kv-channels)");
    m.kv_channels = m.hidden_size / m.num_attention_heads;
  }
  GALE_RETURN_IF_ERROR(required(m.kv_channels, "--kv-channels"));
  if (m.ffn_hidden_size == kUnset) {
    m.ffn_hidden_size = m.swiglu ? (4 * m.hidden_size * 2 / 3) / 64 * 64 : 4 * m.hidden_size;
    // Megatron: int((4 * h * 2 / 3) / 64) * 64 computed in floats; same result for integers.
  }
  GALE_RETURN_IF_ERROR(required(m.ffn_hidden_size, "--ffn-hidden-size"));
  if (m.group_query_attention) {
    GALE_RETURN_IF_ERROR(required(m.num_query_groups, "--num-query-groups"));
    if (m.num_attention_heads % m.num_query_groups != 0)
      return InvalidArgument("--num-attention-heads ", m.num_attention_heads, " must be divisible by --num-query-groups ",
                             m.num_query_groups);
    m.num_kv_heads = m.num_query_groups;
  } else {
    m.num_kv_heads = m.num_attention_heads;
  }
  GALE_RETURN_IF_ERROR(parse_noop_layers(m));
  GALE_RETURN_IF_ERROR(validate_no_rope_args(m));
  if (m.recompute_activations) {
    if (!m.recompute_granularity.empty() && m.recompute_granularity != "selective")
      return InvalidArgument("--recompute-activations means --recompute-granularity selective, found --recompute-granularity ",
                             m.recompute_granularity);
    m.recompute_granularity = "selective";
  }
  if (m.recompute_granularity == "full") {
    if (m.recompute_method.empty())
      return InvalidArgument("--recompute-granularity full requires --recompute-method uniform or block");
    if (m.recompute_num_layers == kUnset)
      return InvalidArgument("--recompute-granularity full requires --recompute-num-layers");
    if (m.recompute_num_layers < 1)
      return InvalidArgument("--recompute-num-layers: expected at least 1, found ", m.recompute_num_layers);
  } else {
    if (!m.recompute_method.empty())
      return InvalidArgument("--recompute-method requires --recompute-granularity full, found ",
                             m.recompute_granularity.empty() ? "no --recompute-granularity"
                                                             : "--recompute-granularity " + m.recompute_granularity);
    if (m.recompute_num_layers != kUnset)
      return InvalidArgument("--recompute-num-layers requires --recompute-granularity full");
  }
  if (!m.recompute_modules.empty() && m.recompute_granularity != "selective")
    return InvalidArgument("--recompute-modules requires --recompute-granularity selective, found ",
                           m.recompute_granularity.empty() ? "no --recompute-granularity"
                                                           : "--recompute-granularity " + m.recompute_granularity);
  for (const std::string& module : m.recompute_modules) {
    if (module == "mla_up_proj" && !m.multi_latent_attention)
      return InvalidArgument("--recompute-modules mla_up_proj: expected --multi-latent-attention (it recomputes "
                             "MLA's up projections), found it off");
    if (module == "core_attn" || module == "layernorm" || module == "mlp" || module == "moe_act" ||
        module == "moe" || module == "shared_experts" || module == "mla_up_proj" || module == "mhc")
      continue;
    return InvalidArgument("--recompute-modules: expected core_attn, layernorm, moe_act, mla_up_proj, mlp, moe, "
                           "shared_experts or mhc, found '", module, "'");
  }
  if (m.recompute_granularity == "selective" && m.recompute_modules.empty()) m.recompute_modules = {"core_attn"};
  if (m.max_position_embeddings < m.seq_length)
    return InvalidArgument("--max-position-embeddings ", m.max_position_embeddings, " must be at least --seq-length ",
                           m.seq_length);
  if (m.position_embedding_type == "rope") {
    if (!(m.rotary_percent > 0.0 && m.rotary_percent <= 1.0))
      return InvalidArgument("--rotary-percent: expected a value in (0, 1], found ", m.rotary_percent);
    int64_t rot = static_cast<int64_t>(m.kv_channels * m.rotary_percent);
    if (rot % 2 != 0 || rot == 0)
      return InvalidArgument("--rotary-percent ", m.rotary_percent, " of --kv-channels ", m.kv_channels,
                             " gives ", rot, " rotary dimensions; expected a positive even number");
    if (m.rotary_base <= 0) return InvalidArgument("--rotary-base: expected a positive integer, found ", m.rotary_base);
  }
  if (m.sliding_window != kUnset && m.sliding_window <= 0)
    return InvalidArgument("--sliding-window: expected a positive window (tokens), found ", m.sliding_window);
  GALE_RETURN_IF_ERROR(validate_gemma2_args(m));
  GALE_RETURN_IF_ERROR(validate_window_args(m));
  if (!(m.norm_epsilon > 0.0)) return InvalidArgument("--norm-epsilon: expected a positive number, found ", m.norm_epsilon);
  GALE_RETURN_IF_ERROR(in_unit_interval(m.attention_dropout, "--attention-dropout"));
  GALE_RETURN_IF_ERROR(in_unit_interval(m.hidden_dropout, "--hidden-dropout"));
  if (!(m.init_method_std > 0.0))
    return InvalidArgument("--init-method-std: expected a positive number, found ", m.init_method_std);
  GALE_RETURN_IF_ERROR(required(m.make_vocab_size_divisible_by, "--make-vocab-size-divisible-by"));
  return Status::Ok();
}

// --optimizer muon or lion (Megatron's emerging optimizers): what Megatron refuses with one, and
// what Gale lacks.
Status validate_muon_args(const Arguments& a) {
  const TrainingArgs& t = a.training;
  if (t.optimizer != "muon" && t.optimizer != "lion") return Status::Ok();
  const std::string name = "--optimizer " + t.optimizer;
  const ParallelArgs& par = a.parallel;
  if (par.use_distributed_optimizer) {  // Megatron's layer-wise distributed optimizer (optim/layer_wise.h)
    const char* what = par.overlap_param_gather ? "--overlap-param-gather"
                       : par.num_distributed_optimizer_instances > 1 ? "--num-distributed-optimizer-instances"
                       : t.quant_grads ? "--quant-grads"
                       : nullptr;
    if (what)
      return Unimplemented(name, " with --use-distributed-optimizer and ", what,
                           ": not supported yet (the layer-wise distributed optimizer all-reduces the gradients "
                           "and gathers whole parameters after its step)");
  }
  if (t.fp16)
    return InvalidArgument(name, " with --fp16: expected --bf16 or fp32 (Megatron: emerging optimizer "
                           "with fp16 is not supported)");
  if (a.checkpoint.ckpt_format != "torch" && a.checkpoint.ckpt_format != "torch_dist")
    return InvalidArgument(name, ": expected --ckpt-format torch or torch_dist, found ",
                           a.checkpoint.ckpt_format, " (Megatron's emerging optimizers support those two)");
  // emerging_optimizers' Lion: each beta in [0, 1) (--optimizer lion's own takes the Adam betas,
  // checked alike with every optimizer).
  if (t.optimizer == "muon" && t.muon_scalar_optimizer == "lion")
    for (const auto& [flag, beta] : {std::pair<const char*, double>{"--lion-beta1", t.lion_beta1},
                                     std::pair<const char*, double>{"--lion-beta2", t.lion_beta2}})
      if (!(beta >= 0.0 && beta < 1.0)) return InvalidArgument(flag, ": expected Lion's beta in [0, 1), found ", beta);
  if (t.optimizer == "lion") return Status::Ok();
  if (t.muon_fp32_matmul_prec == "low")
    return InvalidArgument("--muon-fp32-matmul-prec: expected medium or high, found low (torch's "
                           "set_float32_matmul_precision has no 'low')");
  if (!ns_coefficients(t.muon_coefficient_type))
    return InvalidArgument("--muon-coefficient-type: expected one of ", ns_coefficient_type_list(), ", found '",
                           t.muon_coefficient_type, "'");
  if (t.muon_num_ns_steps < 1)
    return InvalidArgument("--muon-num-ns-steps: expected at least 1, found ", t.muon_num_ns_steps);
  const NsCoefficients c = *ns_coefficients(t.muon_coefficient_type);
  if (c.fixed_steps > 0 && t.muon_num_ns_steps != c.fixed_steps)
    return InvalidArgument("--muon-num-ns-steps: expected ", c.fixed_steps, " with --muon-coefficient-type ",
                           t.muon_coefficient_type, ", found ", t.muon_num_ns_steps);
  return Status::Ok();
}

Status validate_training_args(Arguments& a, const ArgParser& p) {
  TrainingArgs& t = a.training;
  // Megatron: the deprecated --no-weight-decay-cond-type apply_wd_to_qk_layernorm (its only
  // choice) sets --apply-wd-to-qk-layernorm; `gale pretrain` warns.
  if (t.no_weight_decay_cond_type == "apply_wd_to_qk_layernorm") t.apply_wd_to_qk_layernorm = true;
  GALE_RETURN_IF_ERROR(required(t.micro_batch_size, "--micro-batch-size"));
  if (t.global_batch_size == kUnset) t.global_batch_size = t.micro_batch_size * a.parallel.data_parallel_size;
  GALE_RETURN_IF_ERROR(required(t.global_batch_size, "--global-batch-size"));
  if (t.global_batch_size % (t.micro_batch_size * a.parallel.data_parallel_size) != 0 && !t.decrease_batch_size_if_needed)
    return InvalidArgument("--global-batch-size ", t.global_batch_size, " must be a multiple of --micro-batch-size ",
                           t.micro_batch_size, " times the data-parallel size ", a.parallel.data_parallel_size);
  if (t.decrease_batch_size_if_needed && t.global_batch_size < t.micro_batch_size * a.parallel.data_parallel_size)
    return InvalidArgument("--decrease-batch-size-if-needed: --global-batch-size ", t.global_batch_size,
                           " is smaller than --micro-batch-size ", t.micro_batch_size, " times the data-parallel size ",
                           a.parallel.data_parallel_size, ": no micro-batch to run");
  t.iterations_to_skip.clear();
  for (const std::string& v : t.iterations_to_skip_flag) {
    const size_t digits = !v.empty() && (v[0] == '-' || v[0] == '+') ? 1 : 0;
    if (v.size() == digits || v.size() > digits + 18 || v.find_first_not_of("0123456789", digits) != std::string::npos)
      return InvalidArgument("--iterations-to-skip: expected integers (iterations counted from 0), found '", v, "'");
    t.iterations_to_skip.push_back(std::stoll(v));
  }
  bool iters = t.train_iters != kUnset, samples = t.train_samples != kUnset;
  if (iters == samples) return InvalidArgument("give exactly one of --train-iters and --train-samples");
  if (iters) {
    GALE_RETURN_IF_ERROR(required(t.train_iters, "--train-iters"));
    if (t.lr_decay_samples != kUnset) return InvalidArgument("--lr-decay-samples needs --train-samples, not --train-iters");
    if (t.lr_warmup_samples != 0) return InvalidArgument("--lr-warmup-samples needs --train-samples, not --train-iters");
    if (t.lr_wsd_decay_samples != kUnset) return InvalidArgument("--lr-wsd-decay-samples needs --train-samples");
  } else {
    GALE_RETURN_IF_ERROR(required(t.train_samples, "--train-samples"));
    if (t.lr_decay_iters != kUnset) return InvalidArgument("--lr-decay-iters needs --train-iters, not --train-samples");
    if (t.lr_warmup_iters != 0) return InvalidArgument("--lr-warmup-iters needs --train-iters, not --train-samples");
    if (t.lr_wsd_decay_iters != kUnset) return InvalidArgument("--lr-wsd-decay-iters needs --train-iters");
  }
  if (!t.rampup_batch_size.empty()) {
    // Megatron: "expected no batch-size rampup for iteration-based training".
    if (iters) return InvalidArgument("--rampup-batch-size needs sample-based training (--train-samples), not --train-iters");
    GALE_RETURN_IF_ERROR(num_micro_batches_calculator_from_args(a).status());
  }
  if (!unset(t.lr_warmup_fraction) && (t.lr_warmup_iters != 0 || t.lr_warmup_samples != 0))
    return InvalidArgument("--lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples are exclusive");
  if (!unset(t.lr_warmup_fraction) && !(t.lr_warmup_fraction >= 0.0 && t.lr_warmup_fraction < 1.0))
    return InvalidArgument("--lr-warmup-fraction: expected a value in [0, 1), found ", t.lr_warmup_fraction);
  if (unset(t.lr)) return InvalidArgument("--lr is required");
  if (!(t.lr >= 0.0)) return InvalidArgument("--lr: expected a non-negative number, found ", t.lr);
  if (!(t.min_lr >= 0.0)) return InvalidArgument("--min-lr: expected a non-negative number, found ", t.min_lr);
  if (t.min_lr > t.lr) return InvalidArgument("--min-lr ", t.min_lr, " must not exceed --lr ", t.lr);
  if (!std::isnan(t.decoupled_lr) && !(t.decoupled_lr >= 0.0))
    return InvalidArgument("--decoupled-lr: expected a non-negative number, found ", t.decoupled_lr);
  if (!std::isnan(t.decoupled_min_lr)) {
    if (std::isnan(t.decoupled_lr))
      return InvalidArgument("--decoupled-min-lr needs --decoupled-lr (the rate it is the minimum of)");
    if (!(t.decoupled_min_lr >= 0.0))
      return InvalidArgument("--decoupled-min-lr: expected a non-negative number, found ", t.decoupled_min_lr);
  }
  if (t.lr_warmup_init > t.lr) return InvalidArgument("--lr-warmup-init ", t.lr_warmup_init, " must not exceed --lr ", t.lr);
  {
    // Megatron's scheduler asserts warmup < decay steps and decay steps > 0.
    const bool by_iters = t.train_iters != kUnset;
    const int64_t decay = by_iters ? (t.lr_decay_iters != kUnset ? t.lr_decay_iters : t.train_iters)
                                   : (t.lr_decay_samples != kUnset ? t.lr_decay_samples : t.train_samples);
    const char* decay_flag = by_iters ? "--lr-decay-iters" : "--lr-decay-samples";
    if (decay <= 0) return InvalidArgument(decay_flag, ": expected a positive number, found ", decay);
    const int64_t warmup = by_iters ? t.lr_warmup_iters : t.lr_warmup_samples;
    if (unset(t.lr_warmup_fraction) && warmup >= decay)
      return InvalidArgument(by_iters ? "--lr-warmup-iters " : "--lr-warmup-samples ", warmup, " must be less than ",
                             decay_flag, " ", decay);
    if (warmup < 0) return InvalidArgument(by_iters ? "--lr-warmup-iters" : "--lr-warmup-samples",
                                           ": expected a non-negative number, found ", warmup);
    const int64_t wsd = by_iters ? t.lr_wsd_decay_iters : t.lr_wsd_decay_samples;
    if (t.lr_decay_style == "WSD" && wsd != kUnset && (wsd <= 0 || wsd > decay))
      return InvalidArgument(by_iters ? "--lr-wsd-decay-iters " : "--lr-wsd-decay-samples ", wsd,
                             ": expected a positive number not above ", decay_flag, " ", decay);
  }
  if (t.lr_decay_style == "WSD" && t.lr_wsd_decay_iters == kUnset && t.lr_wsd_decay_samples == kUnset)
    return InvalidArgument("--lr-decay-style WSD needs --lr-wsd-decay-iters (or --lr-wsd-decay-samples)");
  if (t.weight_decay_incr_style == "constant") {
    if (!unset(t.start_weight_decay) || !unset(t.end_weight_decay))
      return InvalidArgument("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine");
    t.start_weight_decay = t.weight_decay;
    t.end_weight_decay = t.weight_decay;
  } else {
    if (unset(t.start_weight_decay) || unset(t.end_weight_decay))
      return InvalidArgument("--weight-decay-incr-style ", t.weight_decay_incr_style,
                             " needs --start-weight-decay and --end-weight-decay");
    if (t.end_weight_decay < t.start_weight_decay)
      return InvalidArgument("--end-weight-decay must be at least --start-weight-decay");
  }
  if (t.weight_decay < 0.0) return InvalidArgument("--weight-decay: expected a non-negative number, found ", t.weight_decay);
  if (t.clip_grad < 0.0) return InvalidArgument("--clip-grad: expected a non-negative number, found ", t.clip_grad);
  if (!(t.adam_beta1 >= 0.0 && t.adam_beta1 < 1.0)) return InvalidArgument("--adam-beta1: expected a value in [0, 1), found ", t.adam_beta1);
  if (!(t.adam_beta2 >= 0.0 && t.adam_beta2 < 1.0)) return InvalidArgument("--adam-beta2: expected a value in [0, 1), found ", t.adam_beta2);
  if (!(t.adam_eps > 0.0)) return InvalidArgument("--adam-eps: expected a positive number, found ", t.adam_eps);
  GALE_RETURN_IF_ERROR(validate_muon_args(a));
  if (t.seed <= 0 || t.seed > 4294967295LL) return InvalidArgument("--seed: expected an integer in [1, 2^32-1], found ", t.seed);
  if (t.num_threads < 0) return InvalidArgument("--num-threads: expected a non-negative integer, found ", t.num_threads);
  if (t.fp16) {
    if (t.bf16) return InvalidArgument("--fp16 and --bf16 are exclusive: give one of them");
    if (!unset(t.loss_scale) && !(t.loss_scale > 0.0))
      return InvalidArgument("--loss-scale: expected a positive number, found ", t.loss_scale);
    if (!(t.initial_loss_scale > 0.0))
      return InvalidArgument("--initial-loss-scale: expected a positive number, found ", t.initial_loss_scale);
    if (!(t.min_loss_scale > 0.0 && t.min_loss_scale <= t.initial_loss_scale))
      return InvalidArgument("--min-loss-scale: expected a positive number not above --initial-loss-scale ",
                             t.initial_loss_scale, ", found ", t.min_loss_scale);
    if (t.loss_scale_window <= 0)
      return InvalidArgument("--loss-scale-window: expected a positive integer, found ", t.loss_scale_window);
    if (t.hysteresis <= 0) return InvalidArgument("--hysteresis: expected a positive integer, found ", t.hysteresis);
    // As Megatron: with dynamic scaling non-finite gradients are the scaler's signal, not an error.
    if (unset(t.loss_scale)) t.check_for_nan_in_loss_and_grad = false;
  }
  if (t.check_weight_hash_across_dp_replicas_interval != kUnset && t.check_weight_hash_across_dp_replicas_interval <= 0)
    return InvalidArgument("--check-weight-hash-across-dp-replicas-interval: expected a positive integer, found ",
                           t.check_weight_hash_across_dp_replicas_interval);
  LoggingArgs& l = a.logging;
  if (l.log_interval <= 0) return InvalidArgument("--log-interval: expected a positive integer, found ", l.log_interval);
  if (l.log_memory_interval != kUnset && (l.log_memory_interval <= 0 || l.log_memory_interval % l.log_interval != 0))
    return InvalidArgument("--log-memory-interval: expected a positive multiple of --log-interval ", l.log_interval,
                           " (as Megatron asserts), found ", l.log_memory_interval);
  if (l.straggler_ctrlr_port < 1 || l.straggler_ctrlr_port > 65535)
    return InvalidArgument("--straggler-ctrlr-port: expected a TCP port in [1, 65535], found ", l.straggler_ctrlr_port);
  if (l.straggler_minmax_count < 1)
    return InvalidArgument("--straggler-minmax-count: expected a positive integer, found ", l.straggler_minmax_count);
  if (l.timing_log_level < 0 || l.timing_log_level > 2)
    return InvalidArgument("--timing-log-level: expected 0, 1 or 2, found ", l.timing_log_level);
  if (l.eval_interval <= 0) return InvalidArgument("--eval-interval: expected a positive integer, found ", l.eval_interval);
  if (l.eval_iters < 0) return InvalidArgument("--eval-iters: expected a non-negative integer, found ", l.eval_iters);
  if (l.tensorboard_log_interval <= 0)
    return InvalidArgument("--tensorboard-log-interval: expected a positive integer, found ", l.tensorboard_log_interval);
  if (l.tensorboard_queue_size <= 0)
    return InvalidArgument("--tensorboard-queue-size: expected a positive integer, found ", l.tensorboard_queue_size);
  return Status::Ok();
}

Status validate_checkpoint_args(Arguments& a, const ArgParser& p) {
  CheckpointArgs& c = a.checkpoint;
  if (!c.save.empty() && c.save_interval == kUnset)
    return InvalidArgument("--save needs --save-interval (iterations between checkpoints)");
  if (c.save_interval != kUnset && c.save_interval <= 0)
    return InvalidArgument("--save-interval: expected a positive integer, found ", c.save_interval);
  if (c.save.empty() && p.was_set("--save-interval"))
    return InvalidArgument("--save-interval needs --save (the directory to write checkpoints to)");
  if (c.override_opt_param_scheduler && c.use_checkpoint_opt_param_scheduler)
    return InvalidArgument("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are exclusive: "
                           "the schedule comes from the flags or from the checkpoint");
  if (c.ckpt_step != kUnset && c.ckpt_step < 0)
    return InvalidArgument("--ckpt-step: expected an iteration ≥ 0, found ", c.ckpt_step);
  if (c.override_ckpt_iteration != kUnset && c.finetune)  // Megatron's assertion
    return InvalidArgument("--override-ckpt-iteration with --finetune: cannot override checkpoint iteration "
                           "together with finetune flag");
  if (c.override_ckpt_iteration != kUnset && c.override_ckpt_iteration < 0)
    return InvalidArgument("--override-ckpt-iteration: expected an iteration ≥ 0, found ", c.override_ckpt_iteration);
  if (c.ckpt_step != kUnset && c.load.empty() && c.pretrained_checkpoint.empty())
    return InvalidArgument("--ckpt-step needs --load (or --pretrained-checkpoint): the directory to load from");
  if (std::find(std::begin(kCkptFormats), std::end(kCkptFormats), c.ckpt_format) == std::end(kCkptFormats))
    return InvalidArgument("--ckpt-format: expected one of torch, torch_dist, zarr, torch_dcp, fsdp_dtensor, found '",
                           c.ckpt_format, "'");
  // Megatron's initialize_megatron: a conversion needs both directories.
  if (!c.ckpt_convert_format.empty()) {
    if (c.ckpt_convert_save.empty())
      return InvalidArgument("--ckpt-convert-format ", c.ckpt_convert_format, " needs --ckpt-convert-save DIR");
    if (c.load.empty())
      return InvalidArgument("--ckpt-convert-format ", c.ckpt_convert_format, " needs --load: the checkpoint to convert");
    if (c.ckpt_convert_format != "torch")
      return Unimplemented("--ckpt-convert-format ", c.ckpt_convert_format,
                           ": not supported yet (Gale writes Megatron's legacy torch format: --ckpt-convert-format torch)");
  } else if (!c.ckpt_convert_save.empty()) {
    return InvalidArgument("--ckpt-convert-save needs --ckpt-convert-format torch");
  }
  // Megatron's save_checkpoint: no asynchronous save of legacy (torch) or zarr checkpoints.
  if (c.async_save && c.ckpt_format != "torch_dist" && c.ckpt_format != "torch_dcp" && c.ckpt_format != "fsdp_dtensor")
    return InvalidArgument("--async-save needs --ckpt-format torch_dist (or torch_dcp, fsdp_dtensor), found ",
                           c.ckpt_format, " (Megatron has no asynchronous save for that format)");
  return Status::Ok();
}

// Megatron's _set_wandb_writer: the experiment name is required, the directory defaults to
// {--save}/wandb.
static Status validate_wandb_args(const Arguments& a) {
  const LoggingArgs& l = a.logging;
  if (l.wandb_project.empty()) return Status::Ok();
  if (l.wandb_exp_name.empty())
    return InvalidArgument("--wandb-exp-name: Please specify the wandb experiment name! (--wandb-project is '",
                           l.wandb_project, "')");
  if (l.wandb_save_dir.empty() && a.checkpoint.save.empty())
    return InvalidArgument("--wandb-project needs --wandb-save-dir or --save (the run is written to "
                           "{--save}/wandb), found neither");
  return Status::Ok();
}

}  // namespace gale

namespace gale {

Status validate_mtp_args(Arguments& a) {
  ModelArgs& m = a.model;
  if (m.mtp_num_layers == kUnset) return Status::Ok();
  if (m.mtp_num_layers < 1) return InvalidArgument("--mtp-num-layers: expected at least 1, found ", m.mtp_num_layers);
  if (!(m.mtp_loss_scaling_factor >= 0.0))
    return InvalidArgument("--mtp-loss-scaling-factor: expected a number ≥ 0, found ", m.mtp_loss_scaling_factor);
  const ParallelArgs& par = a.parallel;
  // Megatron core_v0.12.1's validate_args refuses MTP with context parallelism; pipeline
  // parallelism (interleaved too) puts the MTP layers on the last stage (model/gpt_model.h).
  if (par.context_parallel_size > 1)
    return InvalidArgument("--mtp-num-layers with --context-parallel-size ", par.context_parallel_size,
                           ": Megatron does not support multi-token prediction with context parallelism "
                           "(expected --context-parallel-size 1)");
  return Status::Ok();
}

Status validate_all_pretrain_args(Arguments& a, const ArgParser& p, int64_t world_size, int64_t world_rank) {
  // Megatron: --optimizer dist_muon is the deprecated spelling of --optimizer muon
  // --use-distributed-optimizer (its layer-wise distributed optimizer).
  if (a.training.optimizer == "dist_muon") {
    a.training.optimizer = "muon";
    a.parallel.use_distributed_optimizer = true;
  }
  GALE_RETURN_IF_ERROR(validate_profile_args(a, p, world_size));
  GALE_RETURN_IF_ERROR(validate_wandb_args(a));
  if (a.parallel.dist_train) return validate_dist_train_args(a, p, world_size, world_rank);
  GALE_RETURN_IF_ERROR(validate_mindspeed_compat_args(a, p));
  GALE_RETURN_IF_ERROR(resolve_hybrid_layer_pattern(a, p));
  GALE_RETURN_IF_ERROR(validate_model_args(a.model, p));
  GALE_RETURN_IF_ERROR(validate_parallel_args(a, p, world_size));
  GALE_RETURN_IF_ERROR(validate_moe_args(a, p));
  GALE_RETURN_IF_ERROR(validate_lora_args(a, p));
  GALE_RETURN_IF_ERROR(validate_mla_args(a, p));
  GALE_RETURN_IF_ERROR(validate_hybrid_args(a, p));
  GALE_RETURN_IF_ERROR(validate_heterogeneous_args(a, p));
  GALE_RETURN_IF_ERROR(validate_mtp_args(a));
  GALE_RETURN_IF_ERROR(validate_attention_output_gate(a));
  GALE_RETURN_IF_ERROR(validate_qk_l2_norm(a));
  GALE_RETURN_IF_ERROR(validate_gemma2_combinations(a));
  GALE_RETURN_IF_ERROR(validate_glu_moe_args(a));
  GALE_RETURN_IF_ERROR(validate_gemma_args(a));
  GALE_RETURN_IF_ERROR(validate_softmax_type(a));
  GALE_RETURN_IF_ERROR(validate_mhc_args(a, p));
  GALE_RETURN_IF_ERROR(validate_qk_clip(a));
  GALE_RETURN_IF_ERROR(validate_mup(a));
  GALE_RETURN_IF_ERROR(validate_training_args(a, p));
  GALE_RETURN_IF_ERROR(validate_data_args(a, p));
  GALE_RETURN_IF_ERROR(validate_phase_args(a, p));
  GALE_RETURN_IF_ERROR(validate_data_cache_args(a, p));
  GALE_RETURN_IF_ERROR(validate_checkpoint_args(a, p));
  GALE_RETURN_IF_ERROR(validate_non_persistent_args(a, p, world_size));
  GALE_RETURN_IF_ERROR(validate_freeze_all_layers(a));
  GALE_RETURN_IF_ERROR(validate_megatron_compat_args(a, p));
  GALE_RETURN_IF_ERROR(validate_megatron_main_args(a, p));
  GALE_RETURN_IF_ERROR(validate_dpo_args(a, p));
  GALE_RETURN_IF_ERROR(validate_qad_args(a, p));
  GALE_RETURN_IF_ERROR(validate_logits_kd_args(a, p));
  GALE_RETURN_IF_ERROR(validate_rerun_args(a, p));
  GALE_RETURN_IF_ERROR(validate_ft_args(a, p));
  GALE_RETURN_IF_ERROR(validate_auto_settings_args(a, p));
  return Status::Ok();
}

}  // namespace gale
