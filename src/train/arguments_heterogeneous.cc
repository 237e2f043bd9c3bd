// Megatron's heterogeneous layer flags (--heterogeneous-layers-config-path / -encoded-json) and their checks.
#include <fstream>
#include <sstream>

#include "train/arguments.h"
#include "train/heterogeneous_config.h"

namespace gale {

void add_heterogeneous_args(ArgParser& p, ModelArgs& a) {
  p.group("heterogeneous architecture");
  p.add("--heterogeneous-layers-config-path", &a.heterogeneous_layers_config_path,
        "a Llama-Nemotron NAS (DeciLM) config.json whose block_configs give each layer's attention (usual with its "
        "own query groups, no_op or replace_with_linear) and MLP (its own FFN size, no_op or replace_with_linear); "
        "train/heterogeneous_config.h");
  p.add("--heterogeneous-layers-config-encoded-json", &a.heterogeneous_layers_config_encoded_json,
        "the same configuration as a JSON string (kept in checkpoints); read instead of the path when given");
}

Status validate_heterogeneous_args(Arguments& a, const ArgParser& p) {
  ModelArgs& m = a.model;
  const bool from_json = !m.heterogeneous_layers_config_encoded_json.empty();
  if (!from_json && m.heterogeneous_layers_config_path.empty()) return Status::Ok();
  const std::string source =
      from_json ? "--heterogeneous-layers-config-encoded-json"
                : "--heterogeneous-layers-config-path " + m.heterogeneous_layers_config_path;
  if (!from_json) {  // Megatron reads the file into the encoded JSON, which the checkpoint keeps
    std::ifstream in(m.heterogeneous_layers_config_path, std::ios::binary);
    if (!in) return InvalidArgument(source, ": cannot read the file");
    std::ostringstream text;
    text << in.rdbuf();
    m.heterogeneous_layers_config_encoded_json = text.str();
  }
  HeteroModelShape shape{m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size};
  GALE_ASSIGN_OR_RETURN(const std::vector<HeteroLayer> layers,
                        parse_heterogeneous_layers(m.heterogeneous_layers_config_encoded_json, shape, source));
  // Tensor parallelism splits each layer's query groups and FFN columns evenly, or with MindSpeed's
  // --unaligned-linear unevenly in whole groups (model/layer_shares.h: every rank at least one group
  // and one column, as the flags' split); a linear replacement's H output rows always evenly.
  const int64_t tp = a.parallel.tensor_model_parallel_size;
  const bool uneven = a.parallel.unaligned_linear;
  for (size_t i = 0; i < layers.size(); ++i) {
    const HeteroLayer& l = layers[i];
    if (l.attention == SubBlock::kBlock && uneven && l.kv_heads < tp)
      return InvalidArgument(source, ": block_configs[", i, "].attention: --unaligned-linear keeps every query group "
                             "whole on one rank: the layer's ", l.kv_heads,
                             " query groups must be at least --tensor-model-parallel-size ", tp);
    if (l.attention == SubBlock::kBlock && !uneven && l.kv_heads % tp != 0)
      return InvalidArgument(source, ": block_configs[", i, "].attention: the layer's ", l.kv_heads,
                             " query groups must be divisible by --tensor-model-parallel-size ", tp);
    if (l.mlp == SubBlock::kBlock && uneven && l.ffn < tp)
      return InvalidArgument(source, ": block_configs[", i, "].ffn: --unaligned-linear: the layer's FFN size ", l.ffn,
                             " must be at least --tensor-model-parallel-size ", tp);
    if (l.mlp == SubBlock::kBlock && !uneven && l.ffn % tp != 0)
      return InvalidArgument(source, ": block_configs[", i, "].ffn: the layer's FFN size ", l.ffn,
                             " must be divisible by --tensor-model-parallel-size ", tp);
    if ((l.attention == SubBlock::kLinear || l.mlp == SubBlock::kLinear) && m.hidden_size % tp != 0)
      return InvalidArgument(source, ": block_configs[", i, "]: a replace_with_linear sub-block needs --hidden-size ",
                             m.hidden_size, " divisible by --tensor-model-parallel-size ", tp);
  }
  // Context parallelism: ring / all-gather attention need nothing per layer; a Ulysses head split
  // (--cp-comm-type a2a / a2a+p2p, ulysses_cp_algo, hybrid_cp_algo) splits each layer's groups per TP
  // rank as the flags' (arguments_parallel.cc): a multiple of the degree D, or dividing it.
  const ParallelArgs& par = a.parallel;
  const std::string& algo = par.context_parallel_algo;
  const int64_t ulysses = par.context_parallel_size <= 1   ? 1
                          : algo == "ulysses_cp_algo"      ? par.context_parallel_size
                          : algo == "hybrid_cp_algo"       ? par.ulysses_degree_in_cp
                                                           : 1;
  if (ulysses > 1 && uneven)
    return Unimplemented(source, " with --unaligned-linear and a Ulysses head split of context parallelism: not "
                         "supported yet (each layer's uneven heads per TP rank would need their own check)");
  for (size_t i = 0; i < layers.size() && ulysses > 1; ++i) {
    const HeteroLayer& l = layers[i];
    if (l.attention != SubBlock::kBlock) continue;
    const int64_t per_rank = l.kv_heads / tp;
    if (par.use_ulysses_allgather_kv && l.kv_heads != tp)
      return InvalidArgument(source, ": block_configs[", i, "].attention: --use-ulysses-allgather-kv all-gathers one "
                             "key/value head per TP rank: expected ", tp, " query groups, found ", l.kv_heads);
    if (per_rank % ulysses != 0 && ulysses % per_rank != 0)
      return InvalidArgument(source, ": block_configs[", i, "].attention: the Ulysses head split of context "
                             "parallelism (degree ", ulysses, ") needs the layer's ", per_rank,
                             " query groups per TP rank to be a multiple of the degree or to divide it");
  }
  // MoE and --experimental-attention-variant gdn: Megatron's gpt_builder picks the experimental-
  // attention block spec, then the MoE decoder block spec, ahead of the heterogeneous one, and its
  // TransformerBlock then applies each layer's query groups (to the full-attention layers; a GDN
  // mixer is sized by the --linear-* flags) and FFN size (a dense layer's; MoE layers keep
  // --moe-ffn-hidden-size), but builds every attention and MLP: no_op and replace_with_linear
  // entries would be silently dropped, so Gale refuses them. (DSA needs MLA, refused below.)
  const bool variant = !m.experimental_attention_variant.empty();
  if (par.expert_model_parallel_size > 1 || a.moe.enabled() || variant)
    for (size_t i = 0; i < layers.size(); ++i)
      if (layers[i].attention != SubBlock::kBlock || layers[i].mlp != SubBlock::kBlock)
        return InvalidArgument(source, ": block_configs[", i, "]: with ",
                               variant ? "--experimental-attention-variant " + m.experimental_attention_variant
                                       : std::string("--num-experts"),
                               " Megatron builds its ", variant ? "experimental-attention" : "MoE decoder",
                               " block spec instead of the heterogeneous one, which has no no_op or replace_with_linear "
                               "sub-blocks: expected only per-layer query groups and FFN sizes, found a ",
                               layers[i].attention != SubBlock::kBlock ? "attention" : "ffn", " that is ",
                               (layers[i].attention != SubBlock::kBlock ? layers[i].attention : layers[i].mlp) ==
                                       SubBlock::kNoOp
                                   ? "no_op"
                                   : "replace_with_linear");
  // Refused as Megatron refuses (training/argument_utils.py) or builds something else.
  if (m.multi_latent_attention)
    return InvalidArgument(source, " with --multi-latent-attention: Megatron asserts \"Multi latent attention with "
                           "heterogeneous layers is not supported.\"");
  if (m.is_hybrid_model)
    return InvalidArgument(source, " with --is-hybrid-model: Megatron's hybrid (Mamba) model builds its layers from "
                           "--hybrid-layer-pattern and never reads block_configs");
  // --experimental-attention-variant gdn (checked above): the GDN layers as the flags size them,
  // the full-attention layers with their own query groups, every layer its own FFN size.
  // --mtp-num-layers: as Megatron's gpt_builder, each MTP layer is the usual decoder layer with the
  // flags' query groups and FFN size (model/gpt_model.cc registers it past block_configs' layers).
  // What the heterogeneous layers do not handle yet.
  for (const char* flag :
       {"--smart-swap", "--compress-activation", "--compress-dense", "--lora-target-modules",
        "--tp-2d", "--qat-scheme", "--qad-enable", "--use-ascend-mc2", "--use-ascend-coc", "--tp-comm-overlap",
        "--automated-pipeline", "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
        "--schedules-method", "--dualpipev-dw-detach", "--recompute-in-advance", "--recompute-in-bubble",
        "--use-custom-fsdp", "--use-torch-fsdp2", "--layerzero", "--auto-parallel", "--auto-settings", "--dist-train",
        "--fp8-format", "--pipeline-model-parallel-layout"})
    if (p.was_set(flag)) return Unimplemented(source, " with ", flag, ": not supported yet");
  // --stage dpo: the reference model copies the policy's config, its layers included (train/pretrain.cc).
  return Status::Ok();
}

}  // namespace gale
