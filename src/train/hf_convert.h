// `gale convert`: Hugging Face model directories to Gale checkpoints and back (docs/formats/hf-conversion.md).
//
//   HfToGaleOptions o{.load_dir = "llama-hf", .save_dir = "llama-gale"};
//   GALE_RETURN_IF_ERROR(convert_hf_to_gale(o, print));   // llama-gale/iter_0000000/ + tracker "0"
//   GaleToHfOptions b{.load_dir = "llama-gale", .save_dir = "llama-hf-out", .save_dtype = "bf16"};
//   GALE_RETURN_IF_ERROR(convert_gale_to_hf(b, print));   // config.json + model.safetensors
//
// The Gale checkpoint is an ordinary one (iteration 0, one shard holding every tensor whole; bf16
// when every HF weight is bf16, else f32: both exact),
// with the sections `gale pretrain --load` and `gale generate --use-checkpoint-args` read: "model",
// "args" (every model flag, Megatron's names, plus vocab_size = HF's unpadded vocabulary),
// "trainer" (iteration 0, nothing consumed) and "hf_source". Checkpoints saved by a parallel run
// convert back too: the reader assembles each tensor from its TP/PP pieces. DeepSeek-V3's
// multi-token-prediction layers (num_nextn_predict_layers) convert both ways as --mtp-num-layers
// (train/hf_weights.h); their copies of the embedding and lm_head must equal the main ones.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"
#include "train/arguments.h"

namespace gale {

using ConvertLog = std::function<void(const std::string& line)>;

struct HfToGaleOptions {
  std::string load_dir;  // HF model directory
  std::string save_dir;  // Gale checkpoint directory (created; an existing iteration 0 is replaced)
  int64_t make_vocab_size_divisible_by = 128;
  int64_t target_tensor_parallel_size = 1;  // pads the vocabulary for this TP size
  std::string model_type_hf;                // optional MindSpeed --model-type-hf; must match config.json
  // --mtp-num-layers (MindSpeed-LLM's DeepSeek-V3 converter flag): how many of DeepSeek-V3's
  // num_nextn_predict_layers multi-token-prediction layers to convert (the first N; 0 leaves them
  // out); kUnset: all of them.
  int64_t mtp_num_layers = kUnset;
  // MindSpeed-LLM's --target-pipeline-parallel-size and --num-layer-list (the layers of each
  // target pipeline stage): checked against the model (one count per stage, none negative,
  // summing to its layers) and reported; the checkpoint itself holds whole tensors under global
  // layer names, so it loads at that split as at any other.
  int64_t target_pipeline_parallel_size = 1;
  std::string num_layer_list;
};
Status convert_hf_to_gale(const HfToGaleOptions& o, const ConvertLog& log);

struct GaleToHfOptions {
  std::string load_dir;     // Gale checkpoint directory (follows latest_checkpointed_iteration.txt)
  std::string save_dir;     // written: config.json, model.safetensors
  std::string save_dtype = "fp32";  // "fp32" or "bf16"
  int64_t vocab_size = 0;   // real vocabulary rows; 0: the checkpoint's args vocab_size, else all padded rows
  LoraArgs lora;            // --lora-load set: merge these adapters into the weights (train/lora_merge.h)
  int64_t mtp_num_layers = kUnset;  // --mtp-num-layers: MTP layers to write (the first N; 0: none); kUnset: all
  // --use-ema: write the parameter EMA of --optimizer-selection fused_ema_adamw (the checkpoint's
  // optimizer.ema_params.<name>) instead of the trained weights; a checkpoint without it is an error.
  bool use_ema = false;
};
Status convert_gale_to_hf(const GaleToHfOptions& o, const ConvertLog& log);

// Megatron-LM's own checkpoints (train/megatron_checkpoint.h; `gale convert --load-model-type mg` /
// `--save-model-type mg`). Reading takes Megatron's legacy torch format at any TP/PP; writing
// produces it at target_tensor_parallel x target_pipeline_parallel.
enum class ModelFormat { kHf, kGale, kMegatron };
struct MegatronConvertOptions {
  ModelFormat from = ModelFormat::kMegatron, to = ModelFormat::kGale;
  std::string load_dir, save_dir;
  std::string save_dtype = "fp32";                // to hf
  int64_t make_vocab_size_divisible_by = 128;     // hf -> mg
  int64_t target_tensor_parallel_size = 1;        // -> mg
  int64_t target_pipeline_parallel_size = 1;      // -> mg
  int64_t target_expert_parallel_size = 1;        // -> mg: expert-parallel rank files (MoE models)
  int64_t vocab_size = 0;                         // real vocabulary rows (0: recorded, else all padded rows)
  std::string tokenizer_type;                     // -> mg: recorded in Megatron's args
};
// mg -> gale, mg -> hf, gale -> mg or hf -> mg (one side must be mg). hf -> mg writes Megatron's
// "release" checkpoint (as MindSpeed-LLM does: Megatron then loads the weights only); gale -> mg
// keeps the Gale checkpoint's iteration and consumed samples.
Status convert_megatron(const MegatronConvertOptions& o, const ConvertLog& log);

}  // namespace gale
