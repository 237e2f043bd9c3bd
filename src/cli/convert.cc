// `gale convert`: MindSpeed-LLM's convert_ckpt.py for Hugging Face <-> Gale checkpoints (see train/hf_convert.h).
#include <cstdio>

#include "cli/subcommands.h"
#include "train/arg_parser.h"
#include "train/hf_convert.h"
#include "train/lora_merge.h"

namespace gale::cli {

int run_convert(int argc, char** argv) {
  ArgParser p("gale convert",
              "Convert a Hugging Face model directory (GPT-2, LLaMA, Qwen2, Qwen3, Mistral, Mixtral, Qwen2-MoE, DeepSeek-V3) to a Gale checkpoint, or back; or read Megatron-LM's own checkpoints (torch, torch_dist, torch_dcp) and write its torch format");
  std::string load_type, save_type;
  HfToGaleOptions to_gale;
  GaleToHfOptions to_hf;
  std::string load_dir, save_dir;
  int64_t target_pp = 1, target_ep = 1;
  p.group("conversion");
  p.add_choice("--load-model-type", &load_type, {"hf", "gale", "mg", "megatron"},
               "what --load-dir holds: hf, gale, or mg (alias megatron: a Megatron-LM checkpoint, --ckpt-format torch, torch_dist or torch_dcp)");
  p.add_choice("--save-model-type", &save_type, {"hf", "gale", "mg", "megatron"},
               "what to write to --save-dir: gale, hf, or mg (alias megatron: Megatron-LM's torch format)");
  std::string tokenizer_type;
  p.add("--tokenizer-type", &tokenizer_type, "-> mg: the tokenizer_type recorded in Megatron's args (Megatron compares it)");
  p.add("--load-dir", &load_dir, "directory to read: an HF model (config.json + safetensors) or a Gale checkpoint");
  p.add("--save-dir", &save_dir, "directory to write");
  p.add("--model-type-hf", &to_gale.model_type_hf, "optional check of the HF family: gpt2, bloom, llama, llama2, llama3, qwen2, qwen3, mistral, mixtral, gpt_oss, internlm2, phi3, gemma, gemma2, gemma3, baichuan2, chatglm3");
  p.add("--make-vocab-size-divisible-by", &to_gale.make_vocab_size_divisible_by,
        "hf -> gale: pad the vocabulary to a multiple of this times the target TP size");
  p.add("--target-tensor-parallel-size", &to_gale.target_tensor_parallel_size,
        "hf -> gale: the TP size the vocabulary is padded for (the checkpoint loads at any TP it divides); -> mg: "
        "the tensor-parallel size of the Megatron checkpoint written");
  p.add("--target-pipeline-parallel-size", &target_pp,
        "-> mg: the pipeline-parallel size of the Megatron checkpoint written (layers split evenly); otherwise "
        "accepted for compatibility (and checked against --num-layer-list): Gale checkpoints load at any "
        "pipeline-parallel size");
  p.add("--target-expert-parallel-size", &target_ep,
        "-> mg: the expert-parallel size of the Megatron checkpoint written (a MoE model's experts split over "
        "mp_rank_TT[_PPP]_EEE files)");
  p.add("--num-layer-list", &to_gale.num_layer_list,
        "hf -> gale (MindSpeed-LLM): the layers of each target pipeline stage, comma-separated (e.g. 4,6,6,4), "
        "checked against the model; Gale checkpoints load at any split");
  int64_t mtp_num_layers = kUnset;
  p.add("--mtp-num-layers", &mtp_num_layers,
        "DeepSeek-V3 multi-token prediction: convert the first N MTP layers (0: leave them out; default: all of "
        "num_nextn_predict_layers, or of the checkpoint's mtp_num_layers)");
  p.add_choice("--save-dtype", &to_hf.save_dtype, {"fp32", "bf16"}, "gale -> hf: dtype of model.safetensors");
  p.add("--vocab-size", &to_hf.vocab_size,
        "gale -> hf: real vocabulary rows to keep (default: recorded by the conversion, else all padded rows)");
  p.add_flag("--use-ema", &to_hf.use_ema,
             "gale -> hf: write the parameter EMA kept by `gale pretrain --optimizer-selection fused_ema_adamw` "
             "(MindSpeed's EMA weights) instead of the trained weights");
  add_lora_args(p, to_hf.lora);
  Status s = p.parse(argc, argv);
  if (s.ok() && p.help_requested()) {
    std::printf("%s", p.help_text().c_str());
    return 0;
  }
  if (s.ok() && load_type.empty()) s = InvalidArgument("--load-model-type is required (hf, gale or mg)");
  if (s.ok() && save_type.empty()) s = InvalidArgument("--save-model-type is required (gale, hf or mg)");
  if (load_type == "megatron") load_type = "mg";
  if (save_type == "megatron") save_type = "mg";
  const bool megatron = load_type == "mg" || save_type == "mg";
  if (s.ok() && load_type == "mg" && save_type == "mg")
    s = InvalidArgument("--load-model-type mg --save-model-type mg: expected one side hf or gale (re-sharding a "
                        "Megatron checkpoint: convert it to gale, then to mg at the new sizes)");
  if (s.ok() && megatron && (!to_hf.lora.lora_load.empty() || to_hf.use_ema || p.was_set("--mtp-num-layers") ||
                             !to_gale.num_layer_list.empty() || !to_gale.model_type_hf.empty()))
    s = InvalidArgument("--lora-load, --use-ema, --mtp-num-layers, --num-layer-list and --model-type-hf are not "
                        "supported with Megatron checkpoints (mg) yet");
  if (s.ok() && load_dir.empty()) s = InvalidArgument("--load-dir is required");
  if (s.ok() && save_dir.empty()) s = InvalidArgument("--save-dir is required");
  const bool from_hf = load_type == "hf", to_hf_dir = save_type == "hf";
  const bool merge_gale = !from_hf && !to_hf_dir && !to_hf.lora.lora_load.empty();  // LoRA merge, gale -> gale
  if (s.ok() && !megatron && from_hf == to_hf_dir && !merge_gale)
    s = InvalidArgument("--load-model-type ", load_type, " --save-model-type ", save_type,
                        ": expected one side hf and the other gale (or gale to gale with --lora-load)");
  if (s.ok() && target_pp <= 0) s = InvalidArgument("--target-pipeline-parallel-size: expected a positive integer");
  if (s.ok() && target_ep != 1 && save_type != "mg")
    s = InvalidArgument("--target-expert-parallel-size ", target_ep, ": only for --save-model-type mg (Gale "
                        "checkpoints load at any expert-parallel size), found --save-model-type ", save_type);
  if (s.ok() && !from_hf && !to_gale.num_layer_list.empty())
    s = InvalidArgument("--num-layer-list describes the pipeline stages of a checkpoint written from hf: expected "
                        "--load-model-type hf, found ", load_type, " (a Gale checkpoint holds whole tensors whatever "
                        "split it was trained with)");
  if (s.ok() && p.was_set("--mtp-num-layers") && mtp_num_layers < 0)
    s = InvalidArgument("--mtp-num-layers: expected a non-negative integer, found ", mtp_num_layers);
  if (s.ok() && to_hf.use_ema && (from_hf || !to_hf_dir))
    s = InvalidArgument("--use-ema: exports a Gale checkpoint's parameter EMA, expected --load-model-type gale "
                        "--save-model-type hf, found ", load_type, " -> ", save_type);
  if (s.ok() && to_hf.use_ema && !to_hf.lora.lora_load.empty())
    s = InvalidArgument("--use-ema with --lora-load: not supported yet (the EMA of LoRA adapters is not merged)");
  if (s.ok()) s = validate_lora_merge_args(to_hf.lora, p);
  if (s.ok() && from_hf && !to_hf.lora.lora_load.empty())
    s = InvalidArgument("--lora-load: merging LoRA adapters needs --load-model-type gale (the base they were trained on)");
  if (!s.ok()) {
    std::fprintf(stderr, "gale convert: error: %s\n", s.message().c_str());
    return 2;
  }
  auto log = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  if (megatron) {
    MegatronConvertOptions mo;
    auto format = [](const std::string& t) {
      return t == "hf" ? ModelFormat::kHf : t == "mg" ? ModelFormat::kMegatron : ModelFormat::kGale;
    };
    mo.from = format(load_type);
    mo.to = format(save_type);
    mo.load_dir = load_dir;
    mo.save_dir = save_dir;
    mo.save_dtype = to_hf.save_dtype;
    mo.make_vocab_size_divisible_by = to_gale.make_vocab_size_divisible_by;
    mo.target_tensor_parallel_size = to_gale.target_tensor_parallel_size;
    mo.target_pipeline_parallel_size = target_pp;
    mo.target_expert_parallel_size = target_ep;
    mo.vocab_size = to_hf.vocab_size;
    mo.tokenizer_type = tokenizer_type;
    s = convert_megatron(mo, log);
  } else if (merge_gale) {
    s = merge_lora_checkpoint(load_dir, save_dir, to_hf.lora, log);
  } else if (from_hf) {
    to_gale.load_dir = load_dir;
    to_gale.save_dir = save_dir;
    to_gale.mtp_num_layers = mtp_num_layers;
    to_gale.target_pipeline_parallel_size = target_pp;
    s = convert_hf_to_gale(to_gale, log);
  } else {
    to_hf.load_dir = load_dir;
    to_hf.save_dir = save_dir;
    to_hf.mtp_num_layers = mtp_num_layers;
    s = convert_gale_to_hf(to_hf, log);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "gale convert: error: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace gale::cli
