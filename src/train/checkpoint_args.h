// The model description a checkpoint's metadata.json records ("model" and the model flags in "args"), and reading it back.
//
// "model" is what `--load` compares with the running model (a mismatch is a one-line error);
// "args" holds the model flags under Megatron's argument names (num_layers, hidden_size,
// ffn_hidden_size, num_attention_heads, kv_channels, group_query_attention, num_query_groups,
// seq_length, max_position_embeddings, position_embedding_type, rotary_base, rotary_percent,
// normalization, norm_epsilon, swiglu, untie_embeddings_and_output_weights, add_bias_linear,
// add_qkv_bias, make_vocab_size_divisible_by, padded_vocab_size, noop_layers, and mtp_num_layers /
// mtp_loss_scaling_factor, sliding_window and --use-mup's use_mup / mup_* when set), so a checkpoint
// alone says how to rebuild its model
// (`gale generate --use-checkpoint-args`, `gale convert`).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "train/arg_parser.h"
#include "train/arguments.h"

namespace gale {

// metadata.json "model": the shape-defining fields of the model configuration.
nlohmann::json checkpoint_model_section(const ModelConfig& c);

// The model flags of `m` under Megatron's argument names (validated flags; padded_vocab_size set).
nlohmann::json model_flags_json(const ModelArgs& m);

// The inverse of model_flags_json: ModelArgs (num_kv_heads and padded_vocab_size set) from a
// checkpoint's "args" section. A missing or mistyped key is InvalidArgument naming `where` (the
// metadata file) and the key, e.g. "ckpt/iter_0000000/metadata.json: args has no 'norm_epsilon'".
// A Gated DeltaNet model's args (experimental_attention_variant "gdn", linear_attention_freq an int
// or the 0/1 list, the linear_* sizes) are checked as the flags are (validate_gdn_args); so are a
// DeepSeek sparse attention model's ("dsa", the dsa_indexer_* sizes: validate_dsa_args and
// check_dsa_model_args). Other variants are refused. A hybrid model with Gated DeltaNet layers ('G' in
// hybrid_override_pattern) records the linear_* sizes too; args without them (saved before Gale
// recorded them) are InvalidArgument naming the missing key.
StatusOr<ModelArgs> model_args_from_json(const nlohmann::json& args, const std::string& where);

// Unimplemented for a Gated DeltaNet-2 model converted to or from Hugging Face's format (`where`: the
// checkpoint whose args `m` are; no Hugging Face architecture holds it) and for a hybrid model with
// Gated DeltaNet layers ('G'), in every format. Ok otherwise: a Gated DeltaNet model is Hugging Face's
// Qwen3NextForCausalLM, Megatron's torch format holds GDN and GDN2 models (train/megatron_gdn_names.h's
// refuse_megatron_variant), and DeepSeek sparse attention converts to both.
Status refuse_variant_conversion(const ModelArgs& m, const std::string& where);

// The MoE flags that shape the model (num_experts, moe_router_topk, moe_ffn_hidden_size,
// moe_layer_freq, moe_router_pre_softmax), added to an "args" object; nothing for a dense model.
void add_moe_flags_json(const MoeArgs& moe, nlohmann::json* args);

// Their inverse: a dense MoeArgs when "args" has no num_experts; otherwise the recorded flags with
// the layer pattern derived for `num_layers`. Errors name `where` and the key.
StatusOr<MoeArgs> moe_args_from_json(const nlohmann::json& args, const std::string& where, int64_t num_layers);

// Megatron's --use-checkpoint-args for `gale pretrain` (its load_args_from_checkpoint), applied
// before the flags are validated. With a checkpoint in --load (the tracker's iteration, or
// --ckpt-step's), the model flags come from its "args" section as Megatron takes them:
//  - a value given on the command line wins for --num-layers, --hidden-size, --ffn-hidden-size,
//    --seq-length, --num-attention-heads, --kv-channels and --max-position-embeddings;
//  - the checkpoint's value replaces the command line's for group_query_attention,
//    num_query_groups, position_embedding_type, rotary_base, rotary_percent, sliding_window (when
//    recorded), rotary_interleaved,
//    add_bias_linear, add_qkv_bias, squared_relu, swiglu, untie_embeddings_and_output_weights,
//    apply_layernorm_1p, normalization, attention_dropout, hidden_dropout, the MoE shape
//    (num_experts, moe_layer_freq, moe_ffn_hidden_size, moe_router_topk, moe_router_pre_softmax,
//    moe_shared_expert_intermediate_size) and tokenizer_type, and for tokenizer_model unless
//    --no-use-tokenizer-model-from-checkpoint-args; beyond Megatron's list, Gale also takes the
//    model-shape switches it records only when on (attention_output_gate, qk_l2_norm, quick_geglu;
//    absent: off);
//  - with --use-mp-args-from-checkpoint-args also for the tensor, pipeline and expert parallel sizes.
// Keys a checkpoint does not record keep the command line's value, as in Megatron; every other
// flag (norm epsilon, MLA, MTP, routing rules, ...) is the command line's. Returns Megatron's
// start-up lines ("Setting num_layers to 2 from checkpoint", or that no checkpoint provided
// arguments). Errors: --use-checkpoint-args without --load, an unreadable checkpoint.
StatusOr<std::vector<std::string>> apply_checkpoint_args(Arguments& a, const ArgParser& p);

}  // namespace gale
