// The two conversion drivers: HF directory -> Gale checkpoint, Gale checkpoint -> HF directory.
#include "train/hf_convert.h"

#include <cstring>
#include <filesystem>
#include <optional>

#include "ckpt/atomic_file.h"
#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "ckpt/model_checkpoint.h"
#include "train/hf_deepseek_v32.h"
#include "ckpt/safetensors.h"
#include "comm/communicator.h"
#include "train/arguments.h"
#include "train/checkpoint_args.h"
#include "train/hf_config.h"
#include "train/hf_files.h"
#include "train/hf_weights.h"
#include "train/lora_merge.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_gdn_names.h"
#include "train/model_setup.h"

namespace gale {

namespace {

// MindSpeed-LLM's --model-type-hf names for the architectures Gale converts.
Status check_model_type_hf(const std::string& given, const HfModel& m, const std::string& config_path) {
  if (given.empty()) return Status::Ok();
  const std::string family = given.rfind("llama", 0) == 0 ? "llama"
                             : given.rfind("qwen2", 0) == 0 ? "qwen2"
                             : given.rfind("qwen3", 0) == 0 ? "qwen3"
                             : given.rfind("mixtral", 0) == 0 ? "mixtral"
                             : given.rfind("mistral", 0) == 0 ? "mistral"
                             : given.rfind("gpt2", 0) == 0 ? "gpt2"
                             : given.rfind("bloom", 0) == 0 ? "bloom"
                             : given == "gemma" ? "gemma"  // not gemma2 (a different architecture)
                             : given == "gemma2" ? "gemma2"
                             : given == "gemma3" || given == "gemma3_text" ? "gemma3"
                             : given.rfind("gpt_oss", 0) == 0 || given.rfind("gpt-oss", 0) == 0 ? "gpt_oss"
                             : given.rfind("internlm2", 0) == 0 ? "internlm2"
                             : given.rfind("phi3", 0) == 0 ? "phi3"
                             : given == "baichuan2" ? "baichuan2"  // not baichuan (Baichuan-1: no NormHead)
                             : given == "chatglm3" ? "chatglm3"    // not glm4 (Glm4ForCausalLM, post-norms)
                                                           : "";
  const char* expected = m.arch == HfArchitecture::kGpt2    ? "gpt2"
                         : m.arch == HfArchitecture::kGemma ? "gemma"
                         : m.arch == HfArchitecture::kGemma2 ? "gemma2"
                         : m.arch == HfArchitecture::kGemma3 ? "gemma3"
                         : m.arch == HfArchitecture::kGptOss ? "gpt_oss"
                         : m.arch == HfArchitecture::kBloom ? "bloom"
                         : m.arch == HfArchitecture::kQwen2 ? "qwen2"
                         : m.arch == HfArchitecture::kQwen3 || m.arch == HfArchitecture::kQwen3Moe ||
                                   m.arch == HfArchitecture::kQwen3Next
                             ? "qwen3"
                         : m.arch == HfArchitecture::kMistral ? "mistral"
                         : m.arch == HfArchitecture::kMixtral ? "mixtral"
                         : m.arch == HfArchitecture::kInternLM2 ? "internlm2"
                         : m.arch == HfArchitecture::kPhi3    ? "phi3"
                         : m.arch == HfArchitecture::kBaichuan ? "baichuan2"
                         : m.arch == HfArchitecture::kChatGLM ? "chatglm3"
                                                              : "llama";
  if (family.empty())
    return InvalidArgument("--model-type-hf ", given, ": expected one of gpt2, bloom, llama, llama2, llama3, qwen2, qwen3, mistral, mixtral, gpt_oss, internlm2, phi3, gemma, gemma2, gemma3, baichuan2, chatglm3");
  if (family != expected)
    return InvalidArgument("--model-type-hf ", given, " does not match ", config_path, ", which describes a ",
                           hf_architecture_name(m.arch));
  return Status::Ok();
}

// --num-layer-list against --target-pipeline-parallel-size and the model's `num_layers`.
Status check_num_layer_list(const HfToGaleOptions& o, int64_t num_layers, const std::string& config_path,
                            const ConvertLog& log) {
  GALE_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> stages, parse_num_layer_list(o.num_layer_list));
  if (static_cast<int64_t>(stages.size()) != o.target_pipeline_parallel_size)
    return InvalidArgument("--num-layer-list ", o.num_layer_list, ": expected one count per target pipeline stage "
                           "(--target-pipeline-parallel-size ", o.target_pipeline_parallel_size, "), found ",
                           stages.size());
  int64_t total = 0;
  for (const auto& stage : stages) {
    if (stage[0] < 0)
      return InvalidArgument("--num-layer-list ", o.num_layer_list, ": expected layer counts >= 0, found ", stage[0]);
    total += stage[0];
  }
  if (total != num_layers)
    return InvalidArgument("--num-layer-list ", o.num_layer_list, " places ", total, " layers: expected the ",
                           num_layers, " layers of ", config_path);
  log(str_cat("--num-layer-list ", o.num_layer_list, ": the layers of the ", o.target_pipeline_parallel_size,
              " pipeline stages (the checkpoint holds whole tensors; train with the same --num-layer-list, or any "
              "other split)"));
  return Status::Ok();
}

// config.json + model.safetensors of `tensors` (HF names) in save_dir.
Status write_hf_directory(const HfModel& m, const std::vector<NamedTensor>& tensors, const std::string& save_dir,
                          const std::string& save_dtype, const ConvertLog& log) {
  std::error_code ec;
  std::filesystem::create_directories(save_dir, ec);
  if (ec) return FailedPrecondition("--save-dir ", save_dir, ": cannot create the directory (", ec.message(), ")");
  SafetensorsWriter sw;  // references the tensors' data until write()
  for (const NamedTensor& t : tensors) GALE_RETURN_IF_ERROR(sw.add(t.name, t.tensor));
  sw.set_metadata("format", "pt");
  const std::string weights = (std::filesystem::path(save_dir) / "model.safetensors").string();
  GALE_RETURN_IF_ERROR(sw.write(weights).status());
  const nlohmann::json config = hf_config_json(m, save_dtype == "bf16" ? "bfloat16" : "float32");
  GALE_RETURN_IF_ERROR(
      write_file_atomically((std::filesystem::path(save_dir) / "config.json").string(), config.dump(2) + "\n"));
  log(str_cat("saved ", tensors.size(), " tensors (", save_dtype, ") and config.json to ", save_dir));
  return Status::Ok();
}

}  // namespace

Status convert_hf_to_gale(const HfToGaleOptions& o, const ConvertLog& log) {
  if (o.make_vocab_size_divisible_by <= 0)
    return InvalidArgument("--make-vocab-size-divisible-by: expected a positive integer, found ",
                           o.make_vocab_size_divisible_by);
  if (o.target_tensor_parallel_size <= 0)
    return InvalidArgument("--target-tensor-parallel-size: expected a positive integer, found ",
                           o.target_tensor_parallel_size);
  GALE_ASSIGN_OR_RETURN(HfFiles hf, HfFiles::open(o.load_dir));
  GALE_ASSIGN_OR_RETURN(HfModel m, hf_model_from_config(hf.config(), hf.config_path(), o.make_vocab_size_divisible_by,
                                                        o.target_tensor_parallel_size));
  GALE_RETURN_IF_ERROR(check_model_type_hf(o.model_type_hf, m, hf.config_path()));
  if (o.mtp_num_layers != kUnset) {
    if (o.mtp_num_layers < 0 || o.mtp_num_layers > m.mtp_layers_in_files)
      return InvalidArgument("--mtp-num-layers ", o.mtp_num_layers, ": expected 0 to the ", m.mtp_layers_in_files,
                             " multi-token-prediction layers of ", hf.config_path(), " (num_nextn_predict_layers)");
    m.mtp_layers = o.mtp_num_layers;
    m.model.mtp_num_layers = m.mtp_layers > 0 ? m.mtp_layers : kUnset;
  }
  GALE_RETURN_IF_ERROR(refuse_deepseek_v32_mtp(m.model, m.mtp_layers, hf.config_path()));
  if (!o.num_layer_list.empty()) GALE_RETURN_IF_ERROR(check_num_layer_list(o, m.model.num_layers, hf.config_path(), log));
  for (const std::string& w : m.warnings) log("warning: " + w);
  const char* arch_name = hf_is_deepseek_v32(m.model) ? kDeepseekV32Name : hf_architecture_name(m.arch);
  log(str_cat("converting ", arch_name, " from ", o.load_dir, ": ", m.model.num_layers,
              " layers, hidden ", m.model.hidden_size, ", ", m.model.num_attention_heads, " heads (",
              m.model.num_kv_heads, " key/value), vocabulary ", m.vocab_size, " padded to ", m.model.padded_vocab_size));
  if (m.moe.enabled())
    log(str_cat("experts: ", m.moe.num_experts, " per layer, top-", m.moe.moe_router_topk, ", ffn ",
                m.moe.moe_ffn_hidden_size, " (router_aux_loss_coef ", m.moe.moe_aux_loss_coeff,
                " is a training flag: pass --moe-aux-loss-coeff to gale pretrain)"));
  if (hf_is_deepseek_v32(m.model))
    log(str_cat("DeepSeek sparse attention: indexer ", m.model.dsa_indexer_n_heads, " heads of ",
                m.model.dsa_indexer_head_dim, ", top-", m.model.dsa_indexer_topk,
                " keys (bf16/fp32 scores: DeepSeek's fp8 indexer kernel can pick other keys at near-ties)"));
  if (m.arch == HfArchitecture::kDeepseekV3)
    log(str_cat("multi-latent attention: q_lora_rank ", m.model.q_lora_rank, ", kv_lora_rank ", m.model.kv_lora_rank,
                ", YaRN factor ", m.model.rotary_scaling_factor, "; ",
                !m.moe.enabled()
                    ? str_cat("dense (first_k_dense_replace >= ", m.model.num_layers, " layers: no experts)")
                    : str_cat("shared expert: ffn ", m.moe.moe_shared_expert_intermediate_size, ", ungated; MoE layers ",
                              m.moe.moe_layer_freq, ", routing sigmoid + expert bias, scaling ",
                              m.moe.moe_router_topk_scaling_factor,
                              m.moe.moe_router_group_topk != kUnset
                                  ? str_cat(", best ", m.moe.moe_router_group_topk, " of ",
                                            m.moe.moe_router_num_groups, " groups")
                                  : std::string())));
  else if (m.moe.enabled() && m.moe.moe_shared_expert_intermediate_size != kUnset)
    log(str_cat("shared expert: ffn ", m.moe.moe_shared_expert_intermediate_size, ", gated; MoE layers ",
                m.moe.moe_layer_freq, ", routing ",
                m.moe.moe_router_pre_softmax ? "--moe-router-pre-softmax (norm_topk_prob false)"
                                             : "Megatron's default (norm_topk_prob true)"));
  if (m.arch == HfArchitecture::kQwen3Next)
    log(str_cat(m.model.linear_attention_pattern.empty()
                    ? std::string("gated full attention in every layer (--attention-output-gate, no Gated DeltaNet)")
                    : "Gated DeltaNet layers (1) and gated full attention (0): " + m.model.linear_attention_freq,
                "; --rotary-percent ", m.model.rotary_percent, ", --apply-layernorm-1p",
                m.moe.enabled() ? std::string() : std::string("; no experts (every MLP dense)")));
  if (m.arch == HfArchitecture::kGptOss)
    log(str_cat("gpt-oss: attention sinks (--softmax-type learnable), biases (--add-bias-linear, router included), "
                "--quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7, ",
                m.model.sliding_window != kUnset
                    ? str_cat("--sliding-window ", m.model.sliding_window,
                              m.model.window_attn_pattern.empty() ? std::string(" in every layer")
                                                                  : " --window-attn-skip-freq " + m.model.window_attn_skip_freq)
                    : std::string("no sliding window"),
                ", --position-embedding-type ", m.model.position_embedding_type));
  if ((m.arch == HfArchitecture::kQwen2 || m.arch == HfArchitecture::kQwen3) && m.model.sliding_window != kUnset)
    log(str_cat("--sliding-window ", m.model.sliding_window,
                m.model.window_attn_pattern.empty() ? std::string(" in every layer")
                                                    : " --window-attn-skip-freq " + m.model.window_attn_skip_freq,
                " (1: sliding_attention)"));
  if (m.arch == HfArchitecture::kInternLM2 || m.arch == HfArchitecture::kPhi3)
    log(str_cat(m.arch == HfArchitecture::kInternLM2 ? "InternLM2: attention.wqkv copied as Megatron's grouped linear_qkv"
                                                     : "Phi-3: qkv_proj regrouped per key/value group, gate_up_proj as linear_fc1",
                !unset(m.model.rotary_seq_len_interpolation_factor)
                    ? str_cat(", --rotary-seq-len-interpolation-factor ", m.model.rotary_seq_len_interpolation_factor)
                    : std::string(),
                m.model.sliding_window != kUnset ? str_cat(", --sliding-window ", m.model.sliding_window) : std::string()));
  if (m.arch == HfArchitecture::kBaichuan)
    log("Baichuan2: W_pack regrouped per head; lm_head (a NormHead) normalised per row once, as its eval forward "
        "does: Gale trains a plain output layer from there");
  if (m.arch == HfArchitecture::kChatGLM)
    log(str_cat("ChatGLM: query_key_value regrouped per group, --rotary-percent 0.5 --rotary-interleaved "
                "(MindSpeed-LLM's --use-glm-rope), --rotary-base ", m.model.rotary_base, ", --kv-channels ",
                m.model.kv_channels, m.model.add_qkv_bias ? ", --add-qkv-bias" : ""));
  if (m.arch == HfArchitecture::kGemma)
    log(str_cat("gemma: ", m.model.gelu_tanh ? "--gelu-tanh" : "--geglu",
                " --add-rmsnorm-offset --input-embeds-norm, head_dim ", m.model.kv_channels, ", ",
                m.model.untie_embeddings_and_output_weights ? "untied" : "tied", " embeddings"));
  if (m.arch == HfArchitecture::kGemma2 || m.arch == HfArchitecture::kGemma3) {
    const ModelArgs& a = m.model;
    log(str_cat(m.arch == HfArchitecture::kGemma3 ? "gemma3: " : "gemma2: ", a.gelu_tanh ? "--gelu-tanh" : "--geglu",
                " --add-rmsnorm-offset --input-embeds-norm --post-norm ",
                a.qk_layernorm ? "--qk-layernorm " : "", "--query-pre-attn-scalar ",
                a.query_pre_attn_scalar, ", --attn-logit-softcapping ",
                unset(a.attn_logit_softcapping) ? std::string("none") : str_cat(a.attn_logit_softcapping),
                ", --output-logit-softcapping ",
                unset(a.output_logit_softcapping) ? std::string("none") : str_cat(a.output_logit_softcapping), ", ",
                a.sliding_window == kUnset ? std::string("no sliding window")
                : a.window_attn_pattern.empty()
                    ? str_cat("--sliding-window ", a.sliding_window, " in every layer")
                    : str_cat("--sliding-window ", a.sliding_window, " --window-attn-skip-freq ",
                              a.window_attn_skip_freq, " (1: sliding_attention)"),
                ", head_dim ", a.kv_channels, ", ", a.untie_embeddings_and_output_weights ? "untied" : "tied",
                " embeddings"));
  }
  if (m.arch == HfArchitecture::kQwen3Moe)
    log(str_cat("no shared expert; MoE layers ", m.moe.moe_layer_freq, ", routing ",
                m.moe.moe_router_pre_softmax ? "--moe-router-pre-softmax (norm_topk_prob false)"
                                             : "Megatron's default (norm_topk_prob true)"));
  if (m.mtp_layers_in_files > 0)
    log(m.mtp_layers > 0
            ? str_cat("multi-token prediction: ", m.mtp_layers, " of the ", m.mtp_layers_in_files,
                      " MTP layers (model.layers.", m.model.num_layers, "...) -> mtp.layers.* (--mtp-num-layers ",
                      m.mtp_layers, ")")
            : str_cat("multi-token prediction: the ", m.mtp_layers_in_files,
                      " MTP layers are left out (--mtp-num-layers 0)"));
  // DeepSeek-V3 repeats the embedding and lm_head in each MTP layer; Gale's MTP layers share the
  // main ones, so the copies must equal them (read before the model, so only two are held at once).
  const int64_t V = m.vocab_size, H = m.model.hidden_size;
  for (const auto& [copy, original] : hf_mtp_shared_copies(m)) {
    if (!hf.has(copy)) continue;  // not repeated in these files: nothing to check
    GALE_ASSIGN_OR_RETURN(Tensor a, hf.read(copy, {V, H}));
    GALE_ASSIGN_OR_RETURN(Tensor b, hf.read(original, {V, H}));
    if (std::memcmp(a.data<float>(), b.data<float>(), a.nbytes()) != 0)
      return FailedPrecondition(hf.file_of(copy), ": tensor '", copy, "' differs from '", original,
                                "' (Gale's multi-token-prediction layers share the main embedding and output "
                                "layer; convert with --mtp-num-layers 0 to leave them out)");
  }
  // bf16 weights stay bf16 (exactly: the mapping only copies), halving the memory and the files.
  const DType store = hf.all_bf16() ? DType::kBF16 : DType::kF32;
  GALE_ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors,
                        gale_tensors_from_hf(
                            m, [&](const std::string& name, const Shape& shape) { return hf.read(name, shape); },
                            store));
  for (const std::string& name : hf.unread())
    if (!hf_tensor_ignorable(m, name))
      return FailedPrecondition(o.load_dir, ": tensor '", name, "' has no place in a ", arch_name,
                                " built from ", hf.config_path(), " (an option Gale does not support?)");

  Arguments args;
  args.model = m.model;
  args.moe = m.moe;
  const ModelConfig config = model_config_from_args(args);
  Comm self = make_self_communicator("world");
  CheckpointWriter w(o.save_dir, 0, *self);
  for (const NamedTensor& t : tensors) GALE_RETURN_IF_ERROR(w.add(t.name, t.tensor));
  nlohmann::json sections;
  sections["gale_trainer_state_version"] = 1;
  sections["model"] = checkpoint_model_section(config);
  sections["args"] = model_flags_json(m.model);
  add_moe_flags_json(m.moe, &sections["args"]);
  sections["args"]["vocab_size"] = m.vocab_size;
  sections["args"]["tensor_model_parallel_size"] = m.target_tensor_parallel;
  sections["trainer"] = {{"iteration", 0},
                         {"consumed_train_samples", 0},
                         {"consumed_valid_samples", 0},
                         {"num_floating_point_operations_so_far", 0.0}};
  sections["hf_source"] = {{"architecture", arch_name},
                           {"directory", o.load_dir},
                           {"torch_dtype", m.torch_dtype}};
  // InternLM2's dynamic NTK rope_scaling (read as plain RoPE), written back by `gale convert` to HF.
  if (!m.internlm2_dynamic_rope.is_null()) sections["hf_source"]["rope_scaling"] = m.internlm2_dynamic_rope;
  GALE_RETURN_IF_ERROR(w.commit(sections));
  log(str_cat("saved ", tensors.size(), " tensors (", dtype_name(store), ", ",
              store == DType::kBF16 ? "the source's precision" : "exact for every source precision", ") to ",
              w.final_dir()));
  return Status::Ok();
}

Status convert_gale_to_hf(const GaleToHfOptions& o, const ConvertLog& log) {
  if (o.save_dtype != "fp32" && o.save_dtype != "bf16")
    return InvalidArgument("--save-dtype: expected fp32 or bf16, found '", o.save_dtype, "'");
  GALE_ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::open(o.load_dir));
  if (o.use_ema) GALE_RETURN_IF_ERROR(check_checkpoint_has_ema(r, "--use-ema"));
  const std::string where = r.directory() + "/metadata.json";
  GALE_ASSIGN_OR_RETURN(nlohmann::json args, r.section("args"));
  GALE_ASSIGN_OR_RETURN(ModelArgs model, model_args_from_json(args, where));
  // Gated DeltaNet models are written as Qwen3NextForCausalLM (hf_model_from_args); only Megatron's
  // formats refuse them.
  if (model.experimental_attention_variant != "gdn") GALE_RETURN_IF_ERROR(refuse_variant_conversion(model, where));
  GALE_ASSIGN_OR_RETURN(MoeArgs moe, moe_args_from_json(args, where, model.num_layers));
  if (model.is_hybrid_model)
    return Unimplemented(r.directory(), ": a hybrid Mamba model (--is-hybrid-model) is not written in Hugging Face's "
                         "format yet");
  if (o.mtp_num_layers != kUnset) {
    const int64_t saved = model.mtp_num_layers == kUnset ? 0 : model.mtp_num_layers;
    if (o.mtp_num_layers < 0 || o.mtp_num_layers > saved)
      return InvalidArgument("--mtp-num-layers ", o.mtp_num_layers, ": expected 0 to the ", saved,
                             " multi-token-prediction layers of ", where, " (mtp_num_layers)");
    model.mtp_num_layers = o.mtp_num_layers > 0 ? o.mtp_num_layers : kUnset;
  }
  int64_t vocab = o.vocab_size;
  if (vocab == 0 && args.contains("vocab_size") && args["vocab_size"].is_number_integer())
    vocab = args["vocab_size"].get<int64_t>();
  if (vocab == 0) {
    vocab = model.padded_vocab_size;
    log(str_cat("warning: ", where, " does not record the tokenizer's vocabulary size; keeping all ", vocab,
                " rows of the padded vocabulary (pass --vocab-size to drop the padding)"));
  }
  GALE_ASSIGN_OR_RETURN(HfModel m, hf_model_from_args(model, moe, vocab, where));
  // InternLM2 and Phi-3 are LLaMA-shaped in Gale's flags: the architecture converted from, when it still fits.
  if (auto source = r.section("hf_source"); source.ok()) {
    const std::string note = hf_keep_source_architecture(&m, *source);
    if (!note.empty()) log("warning: " + note);
  }
  if (o.use_ema) log("writing the parameter EMA (optimizer.ema_params.*) instead of the trained weights");
  log(str_cat("converting ", r.directory(), " (iteration ", r.iteration(), ") to ",
              hf_is_deepseek_v32(m.model) ? kDeepseekV32Name : hf_architecture_name(m.arch),
              ": vocabulary ", m.model.padded_vocab_size, " -> ", m.vocab_size,
              m.mtp_layers > 0 ? str_cat(", ", m.mtp_layers, " MTP layers (num_nextn_predict_layers)") : std::string()));
  std::optional<LoraMerge> merge;
  if (!o.lora.lora_load.empty()) {
    GALE_ASSIGN_OR_RETURN(LoraMerge opened, LoraMerge::open(o.lora));
    merge.emplace(std::move(opened));
    log(str_cat("merging the LoRA adapters of ", merge->directory(), " (r ", o.lora.lora_r, ", alpha ",
                o.lora.lora_alpha, ")"));
  }
  const bool to_bf16 = o.save_dtype == "bf16";
  GALE_ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors,
                        hf_tensors_from_gale(
                            m,
                            [&](const std::string& name, const Shape& shape) -> StatusOr<Tensor> {
                              GALE_ASSIGN_OR_RETURN(
                                  Tensor t, r.read(o.use_ema ? ema_weight_name(r, name) : name, shape, DType::kF32));
                              if (merge && merge->adapts(name)) GALE_RETURN_IF_ERROR(merge->merge_into(name, t));
                              return t;
                            },
                            to_bf16 ? DType::kBF16 : DType::kF32));
  return write_hf_directory(m, tensors, o.save_dir, o.save_dtype, log);
}

namespace {

bool is_model_tensor(const std::string& name) {
  for (const char* prefix : {"embedding.", "decoder.", "output_layer.", "mtp."})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

}  // namespace

Status convert_megatron(const MegatronConvertOptions& o, const ConvertLog& log) {
  if (o.save_dtype != "fp32" && o.save_dtype != "bf16")
    return InvalidArgument("--save-dtype: expected fp32 or bf16, found '", o.save_dtype, "'");
  if (o.from == ModelFormat::kMegatron) {
    GALE_ASSIGN_OR_RETURN(MegatronCheckpoint m, read_megatron_checkpoint(o.load_dir));
    log(str_cat("read Megatron's ", checkpoint_format_name(m.format), " checkpoint ", m.directory, " (iteration ", m.iteration, ", checkpoint_version ",
                m.checkpoint_version, ", TP ", m.tensor_parallel, " x PP ", m.pipeline_parallel,
                m.virtual_chunks > 1 ? str_cat(" x ", m.virtual_chunks, " virtual chunks") : std::string(), "): ",
                m.model.num_layers, " layers, hidden ", m.model.hidden_size, ", vocabulary ", m.vocab_size,
                " padded to ", m.model.padded_vocab_size, ", ", m.tensors.size(), " tensors"));
    if (o.to == ModelFormat::kGale) {
      GALE_RETURN_IF_ERROR(save_megatron_as_gale(m, o.save_dir, o.load_dir));
      log(str_cat("saved ", m.tensors.size(), " tensors to ", o.save_dir, " (iteration ", m.iteration, ")"));
      return Status::Ok();
    }
    const int64_t vocab = o.vocab_size > 0 ? o.vocab_size : m.vocab_size;
    GALE_ASSIGN_OR_RETURN(HfModel hm, hf_model_from_args(m.model, m.moe, vocab, m.directory));
    GALE_ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors,
                          hf_tensors_from_gale(hm, megatron_tensor_source(m),
                                               o.save_dtype == "bf16" ? DType::kBF16 : DType::kF32));
    return write_hf_directory(hm, tensors, o.save_dir, o.save_dtype, log);
  }
  if (o.to != ModelFormat::kMegatron) return InvalidArgument("convert_megatron: expected mg on one side");
  MegatronSaveOptions so;
  so.save_dir = o.save_dir;
  so.tensor_parallel = o.target_tensor_parallel_size;
  so.pipeline_parallel = o.target_pipeline_parallel_size;
  so.tokenizer_type = o.tokenizer_type;
  so.expert_parallel = o.target_expert_parallel_size;
  std::vector<NamedTensor> tensors;
  ModelArgs model;
  if (o.from == ModelFormat::kHf) {
    GALE_ASSIGN_OR_RETURN(HfFiles hf, HfFiles::open(o.load_dir));
    GALE_ASSIGN_OR_RETURN(HfModel m, hf_model_from_config(hf.config(), hf.config_path(), o.make_vocab_size_divisible_by,
                                                          o.target_tensor_parallel_size));
    GALE_RETURN_IF_ERROR(refuse_megatron_variant(m.model, hf.config_path()));  // Qwen3-Next: GDN converts
    if (m.mtp_layers > 0)
      return Unimplemented(o.load_dir, ": a ", hf_architecture_name(m.arch),
                           " model with multi-token prediction: writing it to Megatron's format is not supported yet");
    so.moe = m.moe;
    for (const std::string& w : m.warnings) log("warning: " + w);
    GALE_ASSIGN_OR_RETURN(tensors, gale_tensors_from_hf(
                                       m, [&](const std::string& name, const Shape& shape) { return hf.read(name, shape); },
                                       DType::kF32));
    model = m.model;
    so.vocab_size = o.vocab_size > 0 ? o.vocab_size : m.vocab_size;
    so.release = true;
  } else {
    GALE_ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::open(o.load_dir));
    const std::string where = r.directory() + "/metadata.json";
    GALE_ASSIGN_OR_RETURN(nlohmann::json args, r.section("args"));
    GALE_ASSIGN_OR_RETURN(model, model_args_from_json(args, where));
    GALE_RETURN_IF_ERROR(refuse_megatron_variant(model, where));
    GALE_ASSIGN_OR_RETURN(so.moe, moe_args_from_json(args, where, model.num_layers));
    for (const std::string& name : r.tensor_names()) {
      if (!is_model_tensor(name)) continue;
      GALE_ASSIGN_OR_RETURN(Shape shape, r.global_shape(name));
      GALE_ASSIGN_OR_RETURN(Tensor t, r.read(name, shape, DType::kF32));
      tensors.push_back({name, t});
    }
    so.vocab_size = o.vocab_size > 0 ? o.vocab_size : args.value("vocab_size", int64_t{0});
    so.iteration = r.iteration();
    if (auto t = r.section("trainer"); t.ok()) so.consumed_train_samples = t->value("consumed_train_samples", int64_t{0});
  }
  GALE_RETURN_IF_ERROR(write_megatron_checkpoint(so, model, tensors));
  log(str_cat("saved Megatron's torch checkpoint (checkpoint_version 3.0, ", so.release ? std::string("release") : str_cat("iteration ", so.iteration),
              ", TP ", so.tensor_parallel, " x PP ", so.pipeline_parallel,
              so.expert_parallel > 1 ? str_cat(" x EP ", so.expert_parallel) : std::string(), ", ", tensors.size(),
              " tensors) to ", o.save_dir, so.release ? std::string() : std::string(
              "; load it in Megatron with --no-load-optim --no-load-rng (or --finetune)")));
  return Status::Ok();
}

}  // namespace gale
