// DeepSeek-V3.2's lightning indexer in Hugging Face's config.json and weights <-> Gale's DSA flags and tensors.
#include "train/hf_deepseek_v32.h"

namespace gale {

namespace {

// DeepSeek's and transformers' indexer k_norm: nn.LayerNorm(index_head_dim, eps=1e-6).
constexpr double kKNormEps = 1e-6;

// config.json's positive integer `key`, `fallback` when absent or null.
Status positive_key(const nlohmann::json& config, const std::string& path, const char* key, int64_t fallback,
                    int64_t* out) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    *out = fallback;
    return Status::Ok();
  }
  if (!it->is_number_integer() || it->get<int64_t>() <= 0)
    return InvalidArgument(path, ": '", key, "' = ", it->dump(), ": expected a positive integer");
  *out = it->get<int64_t>();
  return Status::Ok();
}

}  // namespace

Status read_deepseek_v32_indexer(const nlohmann::json& config, const std::string& path, HfModel& out) {
  ModelArgs& m = out.model;
  GALE_RETURN_IF_ERROR(positive_key(config, path, "index_n_heads", 64, &m.dsa_indexer_n_heads));
  GALE_RETURN_IF_ERROR(positive_key(config, path, "index_head_dim", 128, &m.dsa_indexer_head_dim));
  GALE_RETURN_IF_ERROR(positive_key(config, path, "index_topk", 2048, &m.dsa_indexer_topk));
  if (m.dsa_indexer_head_dim < m.qk_pos_emb_head_dim)
    return InvalidArgument(path, ": 'index_head_dim' = ", m.dsa_indexer_head_dim, ": expected at least qk_rope_head_dim (",
                           m.qk_pos_emb_head_dim, "): the indexer rotates its first qk_rope_head_dim dims");
  if (m.norm_epsilon != kKNormEps)
    return Unimplemented(path, ": 'rms_norm_eps' = ", m.norm_epsilon, " with the DeepSeek-V3.2 indexer is not supported "
                         "yet (DeepSeek's indexer k_norm is a LayerNorm with eps 1e-6; Gale's uses the model's "
                         "--norm-epsilon for both)");
  m.experimental_attention_variant = "dsa";
  m.dsa_indexer_loss_coeff = 0.0;  // a training flag (Megatron's None): pass --dsa-indexer-loss-coeff to train it
  m.dsa_indexer_use_sparse_loss = false;
  return Status::Ok();
}

Status deepseek_v32_from_args(const ModelArgs& m, const std::string& where) {
  if (m.q_lora_rank == kUnset || m.q_lora_rank <= 0)
    return Unimplemented(where, ": a DeepSeek sparse attention model is written as ", kDeepseekV32Name,
                         " only with --q-lora-rank (its indexer's wq_b reads the query latent)");
  if (m.norm_epsilon != kKNormEps)
    return Unimplemented(where, ": a DeepSeek sparse attention model is written as ", kDeepseekV32Name,
                         " only with --norm-epsilon 1e-06 (DeepSeek's indexer k_norm is a LayerNorm with eps 1e-6), "
                         "found ", m.norm_epsilon);
  return refuse_deepseek_v32_mtp(m, m.mtp_num_layers == kUnset ? 0 : m.mtp_num_layers, where);
}

void add_deepseek_v32_config(const ModelArgs& m, nlohmann::json* out) {
  nlohmann::json& j = *out;
  j["architectures"] = {kDeepseekV32Name};
  j["model_type"] = "deepseek_v32";
  j["index_n_heads"] = m.dsa_indexer_n_heads;
  j["index_head_dim"] = m.dsa_indexer_head_dim;
  j["index_topk"] = m.dsa_indexer_topk;
}

std::vector<IndexerPair> deepseek_v32_indexer_pairs(const ModelArgs& m) {
  const int64_t NI = m.dsa_indexer_n_heads, DI = m.dsa_indexer_head_dim, H = m.hidden_size, Cq = m.q_lora_rank;
  return {{"self_attn.indexer.wq_b.weight", "self_attention.indexer.linear_wq_b.weight", {NI * DI, Cq}},
          {"self_attn.indexer.wk.weight", "self_attention.indexer.linear_wk.weight", {DI, H}},
          {"self_attn.indexer.k_norm.weight", "self_attention.indexer.k_norm.weight", {DI}},
          {"self_attn.indexer.k_norm.bias", "self_attention.indexer.k_norm.bias", {DI}},
          {"self_attn.indexer.weights_proj.weight", "self_attention.indexer.linear_weights_proj.weight", {NI, H}}};
}

Status refuse_deepseek_v32_mtp(const ModelArgs& m, int64_t mtp_layers, const std::string& where) {
  if (!hf_is_deepseek_v32(m) || mtp_layers <= 0) return Status::Ok();
  return Unimplemented(where, ": ", mtp_layers, " multi-token-prediction layer(s) of a DeepSeek sparse attention model "
                       "(--experimental-attention-variant dsa): converting them is not supported yet (pass "
                       "--mtp-num-layers 0 to leave them out)");
}

}  // namespace gale
