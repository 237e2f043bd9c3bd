// Loading a checkpoint's model for one-process inference, and its logits for a sequence.
#include "train/inference_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/model_checkpoint.h"
#include "kernels/cpu/fused_ops.h"
#include "model/hybrid_layers.h"
#include "train/arguments_gdn.h"
#include "train/checkpoint_args.h"
#include "train/data_setup.h"
#include "train/lora_merge.h"
#include "train/megatron_checkpoint.h"
#include "train/model_setup.h"

namespace gale {

Tensor InferenceModel::logits(std::span<const int32_t> ids) const { return next_logits(ids, nullptr); }

Tensor InferenceModel::next_logits(std::span<const int32_t> ids, KvCache* cache) const {
  MicroBatch mb;
  mb.B = 1;
  mb.S = static_cast<int64_t>(ids.size());
  mb.tokens.assign(ids.begin(), ids.end());
  mb.position_ids.resize(ids.size());  // with a cache, forward_logits moves them after the cached positions
  std::iota(mb.position_ids.begin(), mb.position_ids.end(), 0);
  return model->forward_logits(mb, Tensor(), cache).view({mb.S, config.vocab});
}

void add_inference_model_args(ArgParser& parser, Arguments& args) {
  add_model_args(parser, args.model);
  add_hybrid_args(parser, args.model);  // --is-hybrid-model: Mamba layers with their decoding state
  add_gdn_size_args(parser, args.model);  // the sizes of a hybrid model's Gated DeltaNet layers ('G')
  add_moe_args(parser, args.moe);
  add_tokenizer_args(parser, args.tokenizer);
  add_lora_args(parser, args.lora);
  parser.group("mixed precision");
  parser.add_flag("--bf16", &args.training.bf16,
                  "compute with bf16 weights and GEMM inputs, as `gale pretrain --bf16` (Megatron's generation scripts "
                  "pass it)");
  parser.add_flag("--fp16", &args.training.fp16,
                  "compute with f16 weights and GEMM inputs, as `gale pretrain --fp16` (no loss scaling in inference)");
  parser.group("checkpoint");
  parser.add("--load", &args.checkpoint.load, "checkpoint directory written by `gale pretrain --save` (required)");
  parser.add_flag("--use-ema", &args.checkpoint.use_ema,
                  "run the parameter EMA that `gale pretrain --optimizer-selection fused_ema_adamw` saved (MindSpeed's "
                  "EMA weights) instead of the trained weights");
  parser.add_flag("--use-checkpoint-args", &args.checkpoint.use_checkpoint_args,
                  "take the model flags from the checkpoint (its metadata.json args) instead of the command line");
}

namespace {

// A hybrid Mamba model (its flags from the command line or the checkpoint): the layer pattern and
// the mixer's sizes as `gale pretrain` checks them (train/arguments_hybrid.cc), and what its
// inference does not do.
Status check_hybrid_inference(const Arguments& args) {
  const ModelArgs& m = args.model;
  if (!m.is_hybrid_model) return Status::Ok();
  std::string layers;
  GALE_RETURN_IF_ERROR(allocate_hybrid_layers(m.num_layers, m.hybrid_attention_ratio, m.hybrid_mlp_ratio,
                                              m.hybrid_override_pattern, &layers));
  GALE_RETURN_IF_ERROR(check_mamba_sizes(m.hidden_size, m.mamba_state_dim, m.mamba_head_dim, m.mamba_num_groups));
  if (args.training.fp16) return Unimplemented("--is-hybrid-model with --fp16: not supported yet (as in gale pretrain)");
  if (!args.lora.lora_load.empty())
    return Unimplemented("--is-hybrid-model with --lora-load: not supported yet (hybrid models train no LoRA adapters)");
  GALE_RETURN_IF_ERROR(check_hybrid_moe_layers(layers, args.moe.enabled()));
  if (!m.noop_layers_flag.empty())  // as gale pretrain (train/arguments_hybrid.cc): MindSpeed's MambaStack has none
    return InvalidArgument("--noop-layers with --is-hybrid-model: expected no --noop-layers, found '", m.noop_layers_flag,
                           "'");
  return Status::Ok();
}

}  // namespace

Status validate_inference_model_args(Arguments& args, const ArgParser& parser) {
  if (args.checkpoint.load.empty()) return InvalidArgument("--load is required (the checkpoint to read the model from)");
  if (args.training.bf16 && args.training.fp16) return InvalidArgument("--fp16 and --bf16 are exclusive: give one of them");
  GALE_RETURN_IF_ERROR(validate_lora_merge_args(args.lora, parser));
  if (args.checkpoint.use_ema && !args.lora.lora_load.empty())
    return InvalidArgument("--use-ema with --lora-load: not supported yet (the EMA of LoRA adapters is not merged)");
  if (args.checkpoint.use_checkpoint_args) return Status::Ok();  // checked when the checkpoint is read
  GALE_RETURN_IF_ERROR(validate_model_args(args.model, parser));
  GALE_RETURN_IF_ERROR(validate_moe_args(args, parser));
  GALE_RETURN_IF_ERROR(validate_gdn_args(args.model, parser));  // the --linear-* sizes need 'G' layers
  return check_hybrid_inference(args);
}

StatusOr<std::unique_ptr<InferenceModel>> load_inference_model(Arguments& args, int64_t seed, bool keep_mtp_layers) {
  auto m = std::make_unique<InferenceModel>();
  // A Megatron checkpoint (torch, torch_dist or torch_dcp format) is read through a temporary Gale copy.
  std::optional<TemporaryGaleCheckpoint> megatron_copy;
  GALE_ASSIGN_OR_RETURN(CheckpointFormat format, detect_checkpoint_format(args.checkpoint.load));
  if (format != CheckpointFormat::kGale && format != CheckpointFormat::kNone) {
    GALE_ASSIGN_OR_RETURN(MegatronCheckpoint mc, read_megatron_checkpoint(args.checkpoint.load));
    GALE_ASSIGN_OR_RETURN(TemporaryGaleCheckpoint copy, TemporaryGaleCheckpoint::write(mc, args.checkpoint.load));
    megatron_copy.emplace(std::move(copy));
  }
  GALE_ASSIGN_OR_RETURN(CheckpointReader reader,
                        CheckpointReader::open(megatron_copy ? megatron_copy->dir() : args.checkpoint.load));
  if (args.checkpoint.use_ema) GALE_RETURN_IF_ERROR(check_checkpoint_has_ema(reader, "--use-ema"));
  if (args.checkpoint.use_checkpoint_args) {
    GALE_ASSIGN_OR_RETURN(nlohmann::json saved, reader.section("args"));
    const std::string where = reader.directory() + "/metadata.json";
    GALE_ASSIGN_OR_RETURN(args.model, model_args_from_json(saved, where));
    GALE_ASSIGN_OR_RETURN(args.moe, moe_args_from_json(saved, where, args.model.num_layers));
  }
  GALE_RETURN_IF_ERROR(check_hybrid_inference(args));
  GALE_ASSIGN_OR_RETURN(m->tokenizer, build_pretrain_tokenizer(args));
  if (!args.checkpoint.use_checkpoint_args)
    args.model.padded_vocab_size =
        pad_vocab_size(m->tokenizer->vocab_size(), args.model.make_vocab_size_divisible_by, 1);
  else if (m->tokenizer->vocab_size() > args.model.padded_vocab_size)
    return InvalidArgument("the tokenizer has ", m->tokenizer->vocab_size(), " tokens but the checkpoint ",
                           reader.directory(), " has a vocabulary of ", args.model.padded_vocab_size);
  args.training.seed = seed;
  Arguments base = args;
  base.lora = LoraArgs{};  // --lora-load: the adapters are merged into the base weights below
  // Multi-token prediction is a training objective: as Megatron's inference, the model is built
  // without its MTP layers (from --mtp-num-layers or the checkpoint's args) and their tensors in
  // the checkpoint are not read; speculative decoding keeps them to draft tokens.
  if (!keep_mtp_layers) base.model.mtp_num_layers = kUnset;
  m->config = model_config_from_args(base);
  m->ops = std::make_unique<OpTable>(reference_ops());
  GALE_RETURN_IF_ERROR(install_all_fused_kernels(*m->ops, detected_isa()));  // the same results (tests/kernels), faster
  m->model = std::make_unique<GPTModel>(m->config, single_process_partition(m->config), m->ops.get());
  ParamBuffer& pb = m->model->params();
  // --softmax-type learnable: a model without sink logits would skip the checkpoint's and run another model.
  if (m->config.softmax_type != SoftmaxType::kLearnable)
    for (int64_t l = 0; l < m->config.num_layers; ++l)
      if (reader.has_tensor(str_cat("decoder.layers.", l, ".self_attention.core_attention.softmax_offset")))
        return InvalidArgument("checkpoint ", reader.directory(), " has attention sink logits (",
                               str_cat("decoder.layers.", l, ".self_attention.core_attention.softmax_offset"),
                               "): expected --softmax-type learnable (or --use-checkpoint-args), found --softmax-type ",
                               args.model.softmax_type);
  GALE_RETURN_IF_ERROR(load_parameters(reader, pb, args.checkpoint.use_ema));
  pb.refresh_gemm_copy();  // --bf16 / --fp16: the GEMM copy of the loaded weights
  if (!args.lora.lora_load.empty()) {
    GALE_ASSIGN_OR_RETURN(LoraMerge merge, LoraMerge::open(args.lora));
    for (int id = 0; id < pb.size(); ++id)
      if (merge.adapts(pb.spec(id).name)) {
        Tensor w = pb.param(id);
        GALE_RETURN_IF_ERROR(merge.merge_into(pb.spec(id).name, w));
      }
    pb.refresh_gemm_copy();  // of the merged weights
  }
  return m;
}

double token_log_prob(const float* row, int64_t vocab, int32_t next_id) {
  const float max = *std::max_element(row, row + vocab);
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
  return static_cast<double>(row[next_id]) - max - std::log(sum);
}

}  // namespace gale
