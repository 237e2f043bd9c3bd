// A checkpoint's model on one process for inference (`gale generate`, `gale evaluate`).
//
// The model is the one the command line's model flags describe (the same flags `gale pretrain`
// was given) or, with --use-checkpoint-args (Megatron's flag), the one the checkpoint's
// metadata.json "args" records (train/checkpoint_args.h: `gale pretrain` and `gale convert` write
// them), with its parameters read from --load and the tokenizer of the tokenizer flags. It
// runs in fp32 on the fused kernels of the best ISA the CPU has (level 1 and flash attention: the
// reference results within the tolerances tests/kernels checks) and keeps nothing for backward.
// With --lora-load (and the --lora-r / --lora-alpha / --lora-target-modules it was trained with)
// the adapters are merged into the base weights at load (train/lora_merge.h). A checkpoint trained
// with --mtp-num-layers loads too: the model is built without the multi-token-prediction layers and
// their tensors are ignored (as Megatron's inference does), unless they draft tokens for
// speculative decoding (keep_mtp_layers). With --use-ema the weights are the
// parameter EMA a `gale pretrain --optimizer-selection fused_ema_adamw` checkpoint holds
// (optimizer.ema_params.<name>; ckpt/model_checkpoint.h ema_weight_name); a checkpoint without it
// is an error.
// A hybrid Mamba model (--is-hybrid-model) runs too: its Mamba layers keep their decoding state in
// the KvCache (model/mamba_state.h); --fp16 and --lora-load with it are refused, as in training.
// So does a Gated DeltaNet model (--experimental-attention-variant gdn, its flags from the
// checkpoint's args under --use-checkpoint-args): its GDN layers keep their convolution and delta
// rule states; --lora-load with it is refused.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"
#include "core/tensor.h"
#include "model/gpt_model.h"
#include "tokenizer/tokenizer.h"
#include "train/arg_parser.h"
#include "train/arguments.h"

namespace gale {

struct InferenceModel {
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<OpTable> ops;  // the model keeps a pointer to it
  std::unique_ptr<GPTModel> model;

  // Logits [S, V_padded] of one sequence of ids (S ≤ config.max_positions): row s predicts ids[s + 1].
  Tensor logits(std::span<const int32_t> ids) const;
  // Logits [n, V_padded] of the next n = ids.size() tokens of one sequence whose earlier tokens are in
  // `cache` (make_kv_cache(config, model->partition(), 1, ...)); their keys and values join it.
  // logits(ids) is next_logits(ids, nullptr): the whole sequence, nothing cached.
  Tensor next_logits(std::span<const int32_t> ids, KvCache* cache) const;
};

// --load, --use-ema, --use-checkpoint-args, the model flags (with the MoE and LoRA flags) and the tokenizer flags, in the
// parser's current group order.
void add_inference_model_args(ArgParser& parser, Arguments& args);

// Command-line checks (a usage error): --load given, the model (and MoE) flags consistent (unless
// they come from the checkpoint).
Status validate_inference_model_args(Arguments& args, const ArgParser& parser);

// Builds the tokenizer and the model and loads the parameters of the checkpoint at
// args.checkpoint.load (errors name the file or tensor). `seed` is the model's seed (dropout is off).
// With --use-checkpoint-args the padded vocabulary is the checkpoint's; a tokenizer with more
// tokens than it is an error. With `keep_mtp_layers` (`gale generate --num-speculative-tokens`) a
// model with --mtp-num-layers keeps its MTP layers, read from the checkpoint, to draft tokens.
StatusOr<std::unique_ptr<InferenceModel>> load_inference_model(Arguments& args, int64_t seed,
                                                               bool keep_mtp_layers = false);

// log p(ids[s + 1] | ids[0..s]) from one row of logits over the tokenizer's `vocab` (the padded
// rows beyond it are not part of the distribution).
double token_log_prob(const float* logits_row, int64_t vocab, int32_t next_id);

}  // namespace gale
