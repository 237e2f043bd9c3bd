// The hybrid Mamba model's flags (--is-hybrid-model; Megatron names and defaults) and their checks.
#include "core/log.h"
#include "model/hybrid_layers.h"
#include "model/hybrid_pattern.h"
#include "train/arguments.h"

namespace gale {

void add_hybrid_args(ArgParser& p, ModelArgs& a) {
  p.group("hybrid Mamba model");
  p.add_flag("--is-hybrid-model", &a.is_hybrid_model,
             "Megatron's hybrid Mamba model (pretrain_mamba.py): the decoder's layers are Mamba-2 layers "
             "(model/mamba_mixer.h) as --hybrid-attention-ratio, --hybrid-mlp-ratio or --hybrid-override-pattern "
             "allocate them (model/hybrid_layers.h)");
  p.add("--hybrid-attention-ratio", &a.hybrid_attention_ratio, "target fraction of attention layers ('*')");
  p.add("--hybrid-mlp-ratio", &a.hybrid_mlp_ratio, "target fraction of MLP layers ('-')");
  p.add("--hybrid-override-pattern", &a.hybrid_override_pattern,
        "the layers' types, one symbol per layer: M (Mamba), G (Gated DeltaNet, sized by --linear-*), * (attention), "
        "- (MLP), E (MoE, with --num-experts), + (multi-latent attention, sized by the MLA flags; sets "
        "--multi-latent-attention); D (DeepSeek sparse attention) is refused (not supported yet), '*' with '+' or 'D' "
        "as Megatron; with '|' or '/' read as --hybrid-layer-pattern");
  // Megatron main's spelling: the same field, told apart by ArgParser::was_set
  // (resolve_hybrid_layer_pattern).
  p.add("--hybrid-layer-pattern", &a.hybrid_override_pattern,
        "Megatron main's name of --hybrid-override-pattern (deprecated there): the layers' symbols, --num-layers "
        "their count; '|' between pipeline stages (segment k on rank k mod --pipeline-model-parallel-size, virtual stage k / PP: "
        "interleaved when there are more segments than ranks), '/' before "
        "each multi-token-prediction depth's layers (any symbol but '|' and D; --mtp-num-layers their count)");
  p.add("--mtp-hybrid-override-pattern", &a.mtp_hybrid_override_pattern,
        "deprecated in Megatron main (kept for old checkpoints): one multi-token-prediction depth's layer symbols; "
        "with --mtp-num-layers N and a pattern without '/', the pattern becomes '<pattern>/<this>' repeated N times");
  p.add("--mamba-state-dim", &a.mamba_state_dim, "the Mamba mixer's state size d_state (N)");
  p.add("--mamba-head-dim", &a.mamba_head_dim, "the Mamba mixer's head dimension (P)");
  p.add("--mamba-num-groups", &a.mamba_num_groups, "the Mamba mixer's groups of B and C (G)");
  p.add_choice("--mamba-training-ssm-states-dtype", &a.mamba_training_ssm_states_dtype, {"fp32", "bf16"},
               "Dtype of the materialized inter-chunk SSM states in Mamba training: the states entering each "
               "128-position chunk of the scan are rounded to it (model/mamba_mixer.h); default: the parameters' "
               "(bf16 with --bf16, else fp32)");
}

namespace {

// Megatron main's checks of the pipeline flags against --hybrid-layer-pattern (arguments.py): the
// pattern's '|' give the pipeline layout, so the flags that give it another way are errors.
Status check_pattern_pipeline_flags(const ParallelArgs& par, const std::string& flag, bool pipes) {
  if (pipes)
    for (auto [set, other] : {std::pair{par.decoder_first_pipeline_num_layers != kUnset,
                                        "--decoder-first-pipeline-num-layers"},
                              std::pair{par.decoder_last_pipeline_num_layers != kUnset,
                                        "--decoder-last-pipeline-num-layers"}})
      if (set)
        return InvalidArgument("If ", flag, " contains pipe separators, ", other,
                               " should not be specified as the pipeline layout is explicitly defined (found it set)");
  if (par.num_layers_per_virtual_pipeline_stage != kUnset)
    return InvalidArgument("--num-layers-per-virtual-pipeline-stage should not be used with ", flag,
                           ". To specify virtual pipelining, describe a number of pipeline segments in ", flag,
                           " that is a multiple of --pipeline-model-parallel-size greater than 1");
  if (par.num_virtual_stages_per_pipeline_rank != kUnset)
    return InvalidArgument("--num-virtual-stages-per-pipeline-rank should not be used with ", flag,
                           ". Virtual pipeline stages are derived from the number of | segments in the pattern.");
  if (!par.pipeline_model_parallel_layout.empty())
    return InvalidArgument("--pipeline-model-parallel-layout should not be used with ", flag,
                           ". Pipeline stage layout is defined by | separators in the pattern.");
  for (auto [set, other] : {std::pair{par.account_for_embedding_in_pipeline_split,
                                      "--account-for-embedding-in-pipeline-split"},
                            std::pair{par.account_for_loss_in_pipeline_split, "--account-for-loss-in-pipeline-split"}})
    if (set)
      return InvalidArgument(other, " should not be used with ", flag,
                             ". Pipeline stage layout is defined by | separators in the pattern.");
  return Status::Ok();
}

}  // namespace

namespace {

// Megatron main's backward compatibility for --mtp-hybrid-override-pattern (arguments.py): with
// --mtp-num-layers N > 0 and a pattern without '/', the pattern becomes "<main>/<mtp>" with N
// depths; otherwise the flag is ignored (a GPT model's MTP layers repeat the decoder's layer).
// The flag is consumed (cleared) here, so a second validation of the same arguments does nothing.
Status convert_legacy_mtp_pattern(ModelArgs& m) {
  const std::string mtp = m.mtp_hybrid_override_pattern;
  if (mtp.empty()) return Status::Ok();
  m.mtp_hybrid_override_pattern.clear();
  warn_rank0("--mtp-hybrid-override-pattern is deprecated. For new hybrid models with MTP, use unified "
             "--hybrid-layer-pattern instead. Example: 'M*M*/MM/MM' means main='M*M*', MTP pattern='MM' with 2 "
             "depths. This argument is kept only for loading old checkpoints.");
  if (!m.is_hybrid_model) {
    warn_rank0("--mtp-hybrid-override-pattern is for Mamba/hybrid models only. For GPT models, MTP replicates the "
               "main transformer layer structure. This argument will be ignored.");
    return Status::Ok();
  }
  if (m.mtp_num_layers == kUnset || m.mtp_num_layers <= 0 ||
      m.hybrid_override_pattern.find(kHybridMtpSeparator) != std::string::npos)
    return Status::Ok();
  // Megatron would join an absent main pattern as "" (a model of no layers); Gale asks for it.
  if (m.hybrid_override_pattern.empty())
    return InvalidArgument("--mtp-hybrid-override-pattern '", mtp, "' with --mtp-num-layers ", m.mtp_num_layers,
                           ": expected the decoder's pattern in --hybrid-layer-pattern (the legacy MTP pattern is "
                           "appended to it as '/' depths), found none (--hybrid-attention-ratio / --hybrid-mlp-ratio "
                           "give no pattern to append to)");
  std::string unified = m.hybrid_override_pattern;
  for (int64_t k = 0; k < m.mtp_num_layers; ++k) unified += kHybridMtpSeparator + mtp;
  m.hybrid_override_pattern = unified;
  print_rank0(str_cat("Converted legacy MTP pattern to unified: ", unified));
  return Status::Ok();
}

}  // namespace

Status resolve_hybrid_layer_pattern(Arguments& a, const ArgParser& p) {
  ModelArgs& m = a.model;
  const bool layer = p.was_set("--hybrid-layer-pattern"), override = p.was_set("--hybrid-override-pattern");
  if (layer && override)  // Megatron main's assertion
    return InvalidArgument("--hybrid-override-pattern and --hybrid-layer-pattern cannot both be specified. "
                           "--hybrid-override-pattern is deprecated; use --hybrid-layer-pattern instead.");
  GALE_RETURN_IF_ERROR(convert_legacy_mtp_pattern(m));
  // Megatron main: multi-latent attention layers ('+') anywhere in the pattern, the MTP depths'
  // included, set --multi-latent-attention.
  if (m.is_hybrid_model && m.hybrid_override_pattern.find(kHybridMla) != std::string::npos)
    m.multi_latent_attention = true;
  const std::string& text = m.hybrid_override_pattern;
  // Megatron main reads --hybrid-override-pattern as --hybrid-layer-pattern; Gale keeps the older
  // rule (one symbol per --num-layers layer) for an override pattern without separators.
  if (!layer && !(override && has_hybrid_separators(text))) return Status::Ok();
  const std::string flag = layer ? "--hybrid-layer-pattern" : "--hybrid-override-pattern";
  if (!m.is_hybrid_model) return InvalidArgument(flag, " needs --is-hybrid-model");
  StatusOr<HybridLayerPattern> parsed = parse_hybrid_layer_pattern(text, flag);
  if (!parsed.ok()) return parsed.status();
  const HybridLayerPattern& pattern = *parsed;
  // Megatron main: the pattern's decoder layers are the layer count, whatever --num-layers says.
  const int64_t n = static_cast<int64_t>(pattern.layers.size());
  if (m.num_layers != kUnset && m.num_layers != n)
    warn_rank0(str_cat(flag, " is set; ignoring --num-layers (", m.num_layers,
                       ") and using the layer count derived from the pattern (", n, ")."));
  m.num_layers = n;
  const ParallelArgs& par = a.parallel;
  const bool pipes = pattern.stages.size() > 1;
  GALE_RETURN_IF_ERROR(check_pattern_pipeline_flags(par, flag, pipes));
  const int64_t pp = par.pipeline_model_parallel_size;
  if (pipes) {
    // The stages' layers (par.pipeline_layers) are set by validate_pipeline_split.
    StatusOr<std::vector<std::vector<int64_t>>> stages = hybrid_pattern_stage_layers(pattern, pp, flag);
    if (!stages.ok()) return stages.status();
    const int64_t segments = static_cast<int64_t>(pattern.stages.size()), vpp = segments / pp;
    if (vpp > 1 && pp == 1)  // Megatron: interleaving needs more than one pipeline rank
      return InvalidArgument(flag, " '", text, "' has ", segments, " pipe-delimited segments: with "
                             "--pipeline-model-parallel-size 1 they are virtual pipeline stages, and the interleaved "
                             "schedule needs --pipeline-model-parallel-size > 1 (give one segment per pipeline rank)");
    // vpp > 1 at PP > 1: segment k = v·PP + r is virtual stage v of rank r, run by the interleaved
    // schedule (validate_pipeline_split sets the VPP size and the stages' layers).
  } else if (pp > 1) {
    warn_rank0(str_cat("DEPRECATION: Using ", flag, " without pipe ('|') separators with --pipeline-model-parallel-"
                       "size > 1 is deprecated. Please add '|' separators to explicitly define pipeline stage "
                       "boundaries. Example: 'M*M*M*M*' with pp_size=2 should become 'M*M*|M*M*'."));
  }
  if (pattern.mtp_depths == 0) return Status::Ok();
  // Megatron main infers --mtp-num-layers from the MTP depths (warning when it was given otherwise).
  if (m.mtp_num_layers != kUnset && m.mtp_num_layers != pattern.mtp_depths)
    warn_rank0(str_cat("--mtp-num-layers (", m.mtp_num_layers, ") conflicts with MTP depth count (",
                       pattern.mtp_depths, ") in pattern '", text, "'. Using the inferred value (", pattern.mtp_depths,
                       ")."));
  m.mtp_num_layers = pattern.mtp_depths;
  // Each depth's layers (model/gpt_model.h): Megatron main's MTP block is a hybrid stack of any
  // layer symbols; the ones Gale builds in the decoder (validate_hybrid_args checks them with it).
  if (pattern.mtp.find(kHybridDsa) != std::string::npos)
    return Unimplemented(flag, " '", text, "': the DeepSeek sparse attention layers ('D') of the "
                         "multi-token-prediction block '", pattern.mtp, "': not supported yet (Gale's hybrid stack "
                         "builds M, G, *, +, - and E layers)");
  return Status::Ok();
}

namespace {

// Context parallelism of the Mamba layers (model/mamba_context_parallel.h; Megatron's
// MambaContextParallel asserts): each TP×CP rank holds whole heads, and whole groups or a share of
// one group's heads; the all-to-all moves Megatron's load-balanced chunks or an adaptive layout's positions.
Status check_hybrid_context_parallel(const Arguments& a) {
  const ParallelArgs& par = a.parallel;
  const ModelArgs& m = a.model;
  const int64_t cp = par.context_parallel_size, tp = par.tensor_model_parallel_size;
  if (cp <= 1) return Status::Ok();
  // adaptive_cp_algo / hybrid_adaptive_cp_algo: the all-to-alls place each position by the
  // micro-batch's layout (ContextSplit::global_position), so the Mamba layers take any layout.
  const int64_t heads = 2 * m.hidden_size / m.mamba_head_dim, heads_tp = heads / tp, groups_tp = m.mamba_num_groups / tp;
  if (heads_tp % cp != 0)
    return InvalidArgument("--context-parallel-size: expected a divisor of the Mamba mixer's heads per tensor-parallel "
                           "rank (2 x --hidden-size / --mamba-head-dim / --tensor-model-parallel-size = ", heads_tp,
                           ": each TP x CP rank scans whole heads), found ", cp);
  if (groups_tp % cp != 0 && cp % groups_tp != 0)
    return InvalidArgument("--mamba-num-groups: expected, per tensor-parallel rank (--mamba-num-groups / "
                           "--tensor-model-parallel-size = ", groups_tp, "), a multiple or a divisor of "
                           "--context-parallel-size (", cp, ": each TP x CP rank holds whole groups or a share of "
                           "one group's heads), found ", m.mamba_num_groups);
  return Status::Ok();
}

}  // namespace

Status validate_hybrid_args(const Arguments& a, const ArgParser& p) {
  const ModelArgs& m = a.model;
  // pretrain_mamba.py's --spec: the Mamba stack spec is the hybrid model Gale builds.
  const std::vector<std::string>& spec = a.megatron_compat.spec;
  const std::vector<std::string> mamba_spec = {"megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"};
  if (!spec.empty() && !(spec == mamba_spec && m.is_hybrid_model)) {
    std::string found;
    for (const std::string& s : spec) found += (found.empty() ? "" : " ") + s;
    return Unimplemented("--spec: custom layer specs are not supported yet (only megatron.core.models.mamba."
                         "mamba_layer_specs mamba_stack_spec, with --is-hybrid-model); found '", found, "'");
  }
  if (!m.is_hybrid_model) {
    for (const char* flag : {"--hybrid-attention-ratio", "--hybrid-mlp-ratio", "--hybrid-override-pattern",
                             "--hybrid-layer-pattern",
                             "--mamba-state-dim", "--mamba-head-dim", "--mamba-num-groups"})
      if (p.was_set(flag)) return InvalidArgument(flag, " needs --is-hybrid-model");
    return Status::Ok();
  }
  std::string layers;
  GALE_RETURN_IF_ERROR(allocate_hybrid_layers(m.num_layers, m.hybrid_attention_ratio, m.hybrid_mlp_ratio,
                                              m.hybrid_override_pattern, &layers));
  // The MTP depths' layers (with --mtp-num-layers, which resolve_hybrid_layer_pattern set from the
  // pattern's depths) are checked with the decoder's.
  if (m.mtp_num_layers != kUnset && m.mtp_num_layers > 0) layers += hybrid_pattern_mtp_layers(m.hybrid_override_pattern);
  GALE_RETURN_IF_ERROR(check_mamba_sizes(m.hidden_size, m.mamba_state_dim, m.mamba_head_dim, m.mamba_num_groups));
  // Tensor parallelism splits the mixer by groups and heads (Megatron's MambaMixer asserts d_inner,
  // ngroups and nheads divisible by the TP size; the groups divide the heads, which divide d_inner).
  const ParallelArgs& par = a.parallel;
  const int64_t tp = par.tensor_model_parallel_size;
  if (tp > 1 && m.mamba_num_groups % tp != 0)
    return InvalidArgument("--mamba-num-groups: expected a multiple of --tensor-model-parallel-size (", tp,
                           ": each rank holds ngroups / TP groups of the Mamba mixer), found ", m.mamba_num_groups);
  GALE_RETURN_IF_ERROR(check_hybrid_context_parallel(a));
  // 'G' layers (their flags' checks: train/arguments_gdn.cc): each TP rank holds NK/TP key heads and
  // NV/TP value heads, as Megatron's GatedDeltaNet splits them (NV is a multiple of NK).
  if (layers.find(kHybridGatedDeltaNet) != std::string::npos) {
    if (tp > 1 && m.linear_num_key_heads % tp != 0)
      return InvalidArgument("--linear-num-key-heads: expected a multiple of --tensor-model-parallel-size (", tp,
                             ": each rank holds 1/TP of the Gated DeltaNet heads of the 'G' layers), found ",
                             m.linear_num_key_heads);
    // Megatron-Core's GDN context parallelism (model/gdn_context_parallel.h) trades the sequence split
    // for a split of each TP rank's heads: CP must divide NK/TP (and so NV/TP).
    const int64_t cp = par.context_parallel_size;
    if (cp > 1 && m.linear_num_key_heads % (tp * cp) != 0)
      return InvalidArgument("--linear-num-key-heads: expected a multiple of --tensor-model-parallel-size × "
                             "--context-parallel-size (", tp, " × ", cp, " = ", tp * cp,
                             ": each rank holds 1/(TP·CP) of the Gated DeltaNet heads of the 'G' layers between the "
                             "all-to-alls), found ", m.linear_num_key_heads);
  }
  // What the Mamba layers do not handle yet.
  GALE_RETURN_IF_ERROR(check_hybrid_moe_layers(layers, a.moe.enabled()));  // 'E' layers: train/arguments_hybrid_moe.cc
  // Multi-latent attention layers ('+'; Megatron main's mla_layer spec: input_layernorm, then
  // MLASelfAttention without q/kv layernorms, no MLP). '+' sets --multi-latent-attention (as
  // Megatron main infers it); the '*' layers stay standard attention there, which Megatron then
  // runs without RoPE, so Gale asks for '+' instead.
  if (m.multi_latent_attention && layers.find(kHybridAttention) != std::string::npos)
    return InvalidArgument("--multi-latent-attention with --is-hybrid-model: expected the attention layers as "
                           "multi-latent attention layers ('+') in --hybrid-override-pattern, found '*' in '", layers,
                           "'");
  if (layers.find(kHybridMla) != std::string::npos && m.qk_layernorm)
    return InvalidArgument("--qk-layernorm with the multi-latent attention layers ('+') of --hybrid-override-pattern: "
                           "expected no --qk-layernorm (Megatron's hybrid MLA layer has no q/kv layernorms), found it set");
  // Megatron main builds a hybrid model's MTP block from the pattern's depths after '/' only (its
  // --mtp-num-layers then follows them); without them it warns and trains no MTP layers.
  if (m.mtp_num_layers != kUnset && m.mtp_num_layers > 0 && hybrid_pattern_mtp_depths(m.hybrid_override_pattern) == 0)
    return InvalidArgument("--mtp-num-layers ", m.mtp_num_layers, " with --is-hybrid-model: expected the MTP layers' "
                           "pattern after '/' in --hybrid-layer-pattern (e.g. 'M*M*/MM/MM': 2 depths of 'MM'), found "
                           "none in '", m.hybrid_override_pattern, "' (Megatron would build no MTP layers)");
  // MindSpeed's --noop-layers patches TransformerBlock's layer building only (NoopLayersFeature);
  // a hybrid model's MambaStack has no such layers, so MindSpeed would train the pattern's layers.
  if (!m.noop_layers_flag.empty())
    return InvalidArgument("--noop-layers with --is-hybrid-model: expected no --noop-layers (MindSpeed's NoopLayersFeature replaces "
                           "layers of the TransformerBlock; the hybrid stack, Megatron's MambaStack, builds its layers "
                           "from the pattern and would ignore the flag), found '", m.noop_layers_flag, "'");
  // Flags of features that reach into the transformer layers' saved state or parameters.
  for (const char* flag :
       {"--recompute-activation-function", "--recompute-norm", "--swap-attention", "--swap-layer-input",
        "--smart-swap", "--compress-activation", "--compress-dense", "--lora-target-modules", "--tp-2d",
        "--qat-scheme", "--qad-enable", "--use-ascend-mc2", "--use-ascend-coc", "--tp-comm-overlap",
        "--automated-pipeline", "--reuse-fp32-param", "--fp16", "--num-layers-per-virtual-pipeline-stage",
        "--num-virtual-stages-per-pipeline-rank", "--schedules-method", "--dualpipev-dw-detach",
        "--recompute-in-advance", "--recompute-in-bubble", "--moe-fb-overlap", "--use-custom-fsdp",
        "--use-torch-fsdp2", "--layerzero", "--auto-parallel", "--auto-settings", "--dist-train", "--fp8-format"})
    if (p.was_set(flag)) return Unimplemented("--is-hybrid-model with ", flag, ": not supported yet");
  // --stage dpo: the reference model copies the policy's config, its Mamba layers included
  // (train/pretrain.cc).
  return Status::Ok();
}

}  // namespace gale
