// The multi-latent attention flags (Megatron names and defaults) and their checks.
#include "train/arguments.h"

namespace gale {

void add_mla_args(ArgParser& p, ModelArgs& a) {
  p.group("multi-latent attention");
  p.add_flag("--multi-latent-attention,--multi-head-latent-attention", &a.multi_latent_attention,
             "DeepSeek-style multi-latent attention: queries and keys/values through low-rank latents "
             "(model/mla_attention.h)");
  p.add("--q-lora-rank", &a.q_lora_rank, "rank of the query latent; unset: a direct query projection");
  p.add("--kv-lora-rank", &a.kv_lora_rank, "rank of the key/value latent");
  p.add("--qk-head-dim,--qk-nope-head-dim", &a.qk_head_dim,
        "query/key head dimension without the position-embedding part (MindSpeed-LLM: --qk-nope-head-dim)");
  p.add("--qk-pos-emb-head-dim,--qk-rope-head-dim", &a.qk_pos_emb_head_dim,
        "query/key head dimension of the rotary part (the key's is shared by all heads; even; MindSpeed-LLM: "
        "--qk-rope-head-dim)");
  p.add("--v-head-dim", &a.v_head_dim, "value head dimension");
  p.add_flag("--qk-layernorm", &a.qk_layernorm,
             "--normalization on every query and key head over head_dim, before RoPE (Megatron-Core's "
             "q_layernorm/k_layernorm); with --multi-latent-attention on the query and key/value latents");
  p.add_choice("--rope-type", &a.rope_type, {"rope", "yarn"},
               "MLA's RoPE type (default: yarn with --multi-latent-attention; standard attention's YaRN is "
               "--position-embedding-type yarn)");
  p.add_flag("--mla-down-proj-fusion", &a.mla_down_proj_fusion,
             "fused q/kv down projection and fused input layernorm (Megatron's FusedMLASelfAttention): the layer's "
             "input norm and [linear_q_down_proj; linear_kv_down_proj] as one norm pass + one GEMM "
             "(model/mla_down_proj.h); needs --q-lora-rank; checkpoints keep the unfused names");
  p.add_unsupported("--cache-mla-latents",
                    "caching MLA's latents (Gale's KV cache holds every head's expanded keys and values)");
  p.group("DeepSeek sparse attention");
  p.add("--experimental-attention-variant", &a.experimental_attention_variant,
        "dsa: DeepSeek-V3.2 sparse attention on MLA (a lightning indexer picks each query's top-k keys; "
        "model/dsa_indexer.h); gdn (or its deprecated spelling gated_delta_net): Gated DeltaNet linear attention "
        "in the layers --linear-attention-freq selects (model/gated_delta_net.h); gdn2: Gated DeltaNet-2 (channel-wise "
        "decay, erase and write gates) in those layers, or in a hybrid model's 'G' layers");
  p.add("--dsa-indexer-n-heads", &a.dsa_indexer_n_heads, "DSA indexer heads (required with dsa)");
  p.add("--dsa-indexer-head-dim", &a.dsa_indexer_head_dim,
        "DSA indexer head dimension (required with dsa; at least --qk-pos-emb-head-dim: RoPE on its first dims)");
  p.add("--dsa-indexer-topk", &a.dsa_indexer_topk, "keys each query attends to under DSA (required with dsa)");
  p.add("--dsa-indexer-loss-coeff", &a.dsa_indexer_loss_coeff,
        "coefficient of the indexer's KL loss against the main attention (default 0: no loss; the indexer then "
        "does not learn)");
  p.add_flag("--dsa-indexer-use-sparse-loss", &a.dsa_indexer_use_sparse_loss,
             "the indexer's KL loss over the selected top-k keys only (default: over every visible key)");
  add_gdn_args(p, a);
}

Status validate_dsa_args(ModelArgs& m, const ArgParser& p) {
  GALE_RETURN_IF_ERROR(validate_gdn_args(m, p));  // normalises gated_delta_net to gdn
  const std::string& v = m.experimental_attention_variant;
  if (!v.empty() && v != "dsa" && v != "gdn" && v != "gdn2")
    return InvalidArgument("--experimental-attention-variant: expected dsa, gdn (or gated_delta_net) or gdn2, found ", v);
  if (v != "dsa") {
    for (const char* flag : {"--dsa-indexer-n-heads", "--dsa-indexer-head-dim", "--dsa-indexer-topk",
                             "--dsa-indexer-loss-coeff", "--dsa-indexer-use-sparse-loss"})
      if (p.was_set(flag)) return InvalidArgument(flag, " needs --experimental-attention-variant dsa");
    return Status::Ok();
  }
  struct Size {
    const char* flag;
    int64_t value;
  };
  for (const Size& s : {Size{"--dsa-indexer-n-heads", m.dsa_indexer_n_heads},
                        Size{"--dsa-indexer-head-dim", m.dsa_indexer_head_dim},
                        Size{"--dsa-indexer-topk", m.dsa_indexer_topk}})
    if (s.value == kUnset || s.value <= 0)
      return InvalidArgument(s.flag, ": expected a positive integer with --experimental-attention-variant dsa, found ",
                             s.value == kUnset ? std::string("none") : std::to_string(s.value));
  if (!(m.dsa_indexer_loss_coeff >= 0.0))
    return InvalidArgument("--dsa-indexer-loss-coeff: expected a non-negative number, found ", m.dsa_indexer_loss_coeff);
  return Status::Ok();
}

Status check_dsa_model_args(const ModelArgs& m) {
  if (!m.multi_latent_attention)
    return InvalidArgument("--experimental-attention-variant dsa needs --multi-latent-attention (DSA runs on MLA), "
                           "found no --multi-latent-attention");
  if (!m.qk_layernorm)
    return InvalidArgument("--experimental-attention-variant dsa needs --qk-layernorm (as MindSpeed), found no "
                           "--qk-layernorm");
  if (m.dsa_indexer_head_dim < m.qk_pos_emb_head_dim)
    return InvalidArgument("--dsa-indexer-head-dim: expected at least --qk-pos-emb-head-dim (", m.qk_pos_emb_head_dim,
                           ": RoPE on its first dims), found ", m.dsa_indexer_head_dim);
  return Status::Ok();
}

// --mla-down-proj-fusion's requirements: Megatron's (MLA, a query latent, and under TP the latent
// widths divisible by the TP size, which its column-parallel fused projection splits) and Gale's
// (no FP8 / QAT emulation of the fused GEMM yet).
static Status validate_mla_down_proj_fusion(const Arguments& a) {
  const ModelArgs& m = a.model;
  if (!m.mla_down_proj_fusion) return Status::Ok();
  if (!m.multi_latent_attention)
    return InvalidArgument("--mla-down-proj-fusion requires --multi-latent-attention");
  if (m.q_lora_rank == kUnset)
    return InvalidArgument("--mla-down-proj-fusion requires --q-lora-rank (Megatron's FusedMLASelfAttention needs "
                           "q_lora_rank set), found no --q-lora-rank");
  const int64_t tp = a.parallel.tensor_model_parallel_size;
  if (tp > 1 && m.q_lora_rank > 0 && m.q_lora_rank % tp != 0)
    return InvalidArgument("--mla-down-proj-fusion: q_lora_rank must be divisible by tensor model parallel size when "
                           "using MLA down projection fusion (found --q-lora-rank ", m.q_lora_rank,
                           ", --tensor-model-parallel-size ", tp, ")");
  if (tp > 1 && (m.kv_lora_rank + m.qk_pos_emb_head_dim) % tp != 0)
    return InvalidArgument("--mla-down-proj-fusion: kv_lora_rank + qk_pos_emb_head_dim must be divisible by tensor "
                           "model parallel size when using MLA down projection fusion (found --kv-lora-rank ",
                           m.kv_lora_rank, " + --qk-pos-emb-head-dim ", m.qk_pos_emb_head_dim,
                           ", --tensor-model-parallel-size ", tp, ")");
  if (!m.fp8_format.empty())
    return Unimplemented("--mla-down-proj-fusion with --fp8-format ", m.fp8_format,
                         ": not supported yet (the fused GEMM has no FP8 emulation); drop one of the two");
  if (!m.qat_scheme.empty())
    return Unimplemented("--mla-down-proj-fusion with --qat-scheme ", m.qat_scheme,
                         ": not supported yet (the fused GEMM reads the master weights); drop one of the two");
  return Status::Ok();
}

Status validate_mla_args(Arguments& a, const ArgParser& p) {
  ModelArgs& m = a.model;
  GALE_RETURN_IF_ERROR(validate_dsa_args(m, p));
  // Megatron main's per-token mode sums the indexer's KL over rows (no 1/rows) and reduces it over
  // the cp group instead of averaging (dsa.py); Gale's indexer loss has only the default scale.
  if (a.training.calculate_per_token_loss && m.experimental_attention_variant == "dsa" && m.dsa_indexer_loss_coeff > 0.0)
    return Unimplemented("--calculate-per-token-loss with --dsa-indexer-loss-coeff ", m.dsa_indexer_loss_coeff,
                         ": not supported yet (Megatron sums the indexer's KL loss over the query rows in that mode; "
                         "Gale's indexer loss is the mean over rows)");
  GALE_RETURN_IF_ERROR(validate_mla_down_proj_fusion(a));
  if (!m.multi_latent_attention) {
    for (const char* flag : {"--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim"})
      if (p.was_set(flag)) return InvalidArgument(flag, " needs --multi-latent-attention");
    if (m.rope_type == "yarn")
      return InvalidArgument("--rope-type yarn needs --multi-latent-attention (standard attention's YaRN is "
                             "--position-embedding-type yarn)");
    if (m.rotary_scaling_factor != 1.0 && m.position_embedding_type != "yarn")
      return InvalidArgument("--rotary-scaling-factor needs --multi-latent-attention or --position-embedding-type yarn, "
                             "found --position-embedding-type ", m.position_embedding_type);
    return Status::Ok();
  }
  if (m.q_lora_rank != kUnset && m.q_lora_rank <= 0)
    return InvalidArgument("--q-lora-rank: expected a positive integer (or no flag for a direct query projection), found ",
                           m.q_lora_rank);
  struct Size {
    const char* flag;
    int64_t value;
  };
  for (const Size& s : {Size{"--kv-lora-rank", m.kv_lora_rank}, Size{"--qk-head-dim", m.qk_head_dim},
                        Size{"--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim}, Size{"--v-head-dim", m.v_head_dim}})
    if (s.value <= 0) return InvalidArgument(s.flag, ": expected a positive integer, found ", s.value);
  if (m.qk_pos_emb_head_dim % 2 != 0)
    return InvalidArgument("--qk-pos-emb-head-dim: expected an even number (RoPE rotates pairs), found ",
                           m.qk_pos_emb_head_dim);
  if (m.group_query_attention)
    return InvalidArgument("--group-query-attention: not applicable with --multi-latent-attention (every head has "
                           "its own keys and values from the latent)");
  if (!(m.rotary_scaling_factor >= 1.0))
    return InvalidArgument("--rotary-scaling-factor: expected at least 1 (YaRN's context extension), found ",
                           m.rotary_scaling_factor);
  if (m.rotary_percent != 1.0)
    return InvalidArgument("--rotary-percent: expected 1 with --multi-latent-attention (RoPE rotates the whole "
                           "--qk-pos-emb-head-dim part), found ", m.rotary_percent);
  if (m.rotary_base <= 0) return InvalidArgument("--rotary-base: expected a positive integer, found ", m.rotary_base);
  for (const std::string& t : a.lora.lora_target_modules)
    if (t == "linear_qkv")
      return InvalidArgument("--lora-target-modules linear_qkv: MLA has no linear_qkv (its projections are "
                             "linear_q_*/linear_kv_*); expected linear_proj, linear_fc1 or linear_fc2");
  return Status::Ok();
}

}  // namespace gale
