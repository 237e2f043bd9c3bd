// Megatron-Core's MLA state-dict names <-> Gale's, and the down projections' TP layouts.
#include "train/megatron_mla_names.h"

#include <algorithm>
#include <cstring>

namespace gale {

namespace {

const char* const kAttn = "self_attention.";

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// DeepSeek sparse attention's indexer: Megatron-Core main builds it inside DSAttention, the MLA's
// core_attention; Gale keeps it under self_attention.indexer (model/dsa_indexer.h).
const char* const kMegatronIndexer = "self_attention.core_attention.indexer.";
const char* const kGaleIndexer = "self_attention.indexer.";
const char* const kIndexerTensors[] = {"linear_wq_b.weight", "linear_wk.weight", "k_norm.weight", "k_norm.bias",
                                       "linear_weights_proj.weight"};

bool megatron_indexer_tensor(const std::string& rest) {
  for (const char* t : kIndexerTensors)
    if (rest == std::string(kMegatronIndexer) + t) return true;
  return false;
}

// Local spec's norm names -> Gale's (Transformer Engine's fused names).
const std::pair<const char*, const char*> kNormRenames[] = {
    {"self_attention.q_layernorm.weight", "self_attention.linear_q_up_proj.layer_norm_weight"},
    {"self_attention.q_layernorm.bias", "self_attention.linear_q_up_proj.layer_norm_bias"},
    {"self_attention.kv_layernorm.weight", "self_attention.linear_kv_up_proj.layer_norm_weight"},
    {"self_attention.kv_layernorm.bias", "self_attention.linear_kv_up_proj.layer_norm_bias"}};

// "decoder.layers.<i>.<rest>" (also mtp.layers.<k>.transformer_layer.<rest>): the prefix and rest.
bool split_layer_name(const std::string& name, std::string* prefix, std::string* rest) {
  const size_t at = name.find(kAttn);
  if (at == std::string::npos || at == 0 || name[at - 1] != '.') return false;
  *prefix = name.substr(0, at);
  *rest = name.substr(at);
  return true;
}

// Megatron's fused linear_qkv_down_proj.weight (FusedMLASelfAttention), merged over `tp` ranks,
// into Gale's linear_q_down_proj.weight [Cq, H] and linear_kv_down_proj.weight [Ckv + R, H]. Column-
// parallel (Transformer Engine's LayerNormColumnParallelLinear): rank r saved its Cq/tp query rows
// then its (Ckv + R)/tp key/value rows, merged as [q_0; kv_0; q_1; kv_1; ...] (Cq + Ckv + R rows in
// all). Duplicated (TELinear): tp identical copies of [q; kv].
Status split_fused_down_proj(const std::string& name, const std::string& prefix, const Tensor& t, int64_t q_lora,
                             int64_t kv_rows, int64_t tp, const std::string& where,
                             std::map<std::string, Tensor>& out) {
  const int64_t whole = q_lora + kv_rows, rows = t.ndim() == 2 ? t.shape()[0] : -1;
  if (q_lora <= 0)
    return DataLoss(where, ": tensor '", name, "' (the fused q/kv down projection) in a checkpoint whose args have no "
                    "q_lora_rank (Megatron's FusedMLASelfAttention requires it)");
  tp = std::max<int64_t>(tp, 1);
  const bool duplicated = tp > 1 && rows == tp * whole;
  if (rows != whole && !duplicated)
    return DataLoss(where, ": tensor '", name, "' has shape ", t.shape_string(), "; expected ", whole,
                    " rows (q_lora_rank + kv_lora_rank + qk_pos_emb_head_dim in args), split over or duplicated on the ",
                    tp, " tensor-parallel ranks");
  const int64_t row_bytes = t.nbytes() / rows;
  if (duplicated)
    for (int64_t r = 1; r < tp; ++r)
      if (std::memcmp(t.raw(), static_cast<const char*>(t.raw()) + r * whole * row_bytes,
                      static_cast<size_t>(whole * row_bytes)) != 0)
        return DataLoss(where, ": tensor '", name, "' of shape ", t.shape_string(), ": expected ", whole,
                        " rows, or the same ", whole, " rows on every tensor-parallel rank; rank ", r,
                        "'s differ from rank 0's");
  const int64_t parts = duplicated ? 1 : tp;
  if (q_lora % parts != 0 || kv_rows % parts != 0)
    return DataLoss(where, ": tensor '", name, "': q_lora_rank ", q_lora, " and kv_lora_rank + qk_pos_emb_head_dim ",
                    kv_rows, " must be divisible by the ", parts, " tensor-parallel ranks that split it");
  const int64_t qp = q_lora / parts, kvp = kv_rows / parts;
  Tensor q = Tensor::empty({q_lora, t.shape()[1]}, t.dtype()), kv = Tensor::empty({kv_rows, t.shape()[1]}, t.dtype());
  const char* src = static_cast<const char*>(t.raw());
  for (int64_t r = 0; r < parts; ++r) {
    const char* block = src + r * (qp + kvp) * row_bytes;
    std::memcpy(static_cast<char*>(q.raw()) + r * qp * row_bytes, block, static_cast<size_t>(qp * row_bytes));
    std::memcpy(static_cast<char*>(kv.raw()) + r * kvp * row_bytes, block + qp * row_bytes,
                static_cast<size_t>(kvp * row_bytes));
  }
  out.emplace(prefix + "self_attention.linear_q_down_proj.weight", std::move(q));
  out.emplace(prefix + "self_attention.linear_kv_down_proj.weight", std::move(kv));
  return Status::Ok();
}

// The pre-refactor AbsorbedMLASelfAttention's linear_k_up_proj.weight [NH·Dn, Ckv] and
// linear_v_up_proj.weight [NH·Dv, Ckv] (heads in order, TP-merged) as linear_kv_up_proj.weight, per
// head [k_h; v_h] (as Megatron main's _combine_split_kv_up_weights).
StatusOr<Tensor> combine_split_kv_up(const std::string& prefix, const Tensor& k, const Tensor& v, int64_t heads,
                                     int64_t dn, int64_t dv, const std::string& where) {
  const int64_t ckv = k.ndim() == 2 ? k.shape()[1] : -1;
  if (heads <= 0 || k.ndim() != 2 || v.ndim() != 2 || k.shape()[0] != heads * dn || v.shape()[0] != heads * dv ||
      v.shape()[1] != ckv || k.dtype() != v.dtype())
    return DataLoss(where, ": tensors '", prefix, "self_attention.linear_k_up_proj.weight' ", k.shape_string(), " and '",
                    prefix, "self_attention.linear_v_up_proj.weight' ", v.shape_string(), ": expected [",
                    heads * dn, ", kv_lora_rank] and [", heads * dv,
                    ", kv_lora_rank] (num_attention_heads x qk_head_dim and x v_head_dim in args)");
  Tensor out = Tensor::empty({heads * (dn + dv), ckv}, k.dtype());
  const int64_t row = ckv * dtype_size(k.dtype());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t h = 0; h < heads; ++h) {
    std::memcpy(dst + h * (dn + dv) * row, static_cast<const char*>(k.raw()) + h * dn * row, static_cast<size_t>(dn * row));
    std::memcpy(dst + (h * (dn + dv) + dn) * row, static_cast<const char*>(v.raw()) + h * dv * row,
                static_cast<size_t>(dv * row));
  }
  return out;
}

}  // namespace

bool megatron_mla_column_parallel(const std::string& rest) {
  for (const char* p : {"linear_q_proj.weight", "linear_q_down_proj.weight", "linear_q_up_proj.weight",
                        "linear_kv_down_proj.weight", "linear_kv_up_proj.weight", "linear_qkv_down_proj.weight",
                        "linear_k_up_proj.weight", "linear_v_up_proj.weight"})
    if (rest == std::string(kAttn) + p) return true;
  return false;
}

bool megatron_mla_tensor(const std::string& rest) {
  if (megatron_mla_column_parallel(rest)) return true;
  for (const auto& [local, fused] : kNormRenames)
    if (rest == local || rest == fused) return true;
  return rest == "self_attention.linear_qkv_down_proj.layer_norm_weight" ||
         rest == "self_attention.linear_qkv_down_proj.layer_norm_bias" || megatron_indexer_tensor(rest);
}

Status megatron_mla_to_gale(const nlohmann::json& args, int64_t tp, const std::string& where,
                            std::map<std::string, Tensor>& tensors) {
  const int64_t q_lora = args.value("q_lora_rank", int64_t{0});  // None (absent): no query latent
  const int64_t kv_rows = args.value("kv_lora_rank", int64_t{0}) + args.value("qk_pos_emb_head_dim", int64_t{0});
  if (q_lora == 0 && args.value("qk_layernorm", false))
    return Unimplemented(where, ": a multi-latent-attention model with qk_layernorm and no query latent (q_lora_rank "
                         "None): not supported yet (Megatron norms only the key/value latent there; Gale's "
                         "--qk-layernorm without --q-lora-rank also norms the input of linear_q_proj)");
  std::map<std::string, Tensor> out;
  std::map<std::string, std::pair<Tensor, Tensor>> split_kv_up;  // layer prefix -> (k_up, v_up)
  for (auto& [name, t] : tensors) {
    std::string prefix, rest;
    if (!split_layer_name(name, &prefix, &rest)) {
      out.emplace(name, std::move(t));
      continue;
    }
    if (rest == "self_attention.linear_k_up_proj.weight" || rest == "self_attention.linear_v_up_proj.weight") {
      (rest == "self_attention.linear_k_up_proj.weight" ? split_kv_up[prefix].first : split_kv_up[prefix].second) = t;
      continue;
    }
    for (const auto& [local, fused] : kNormRenames)
      if (rest == local) rest = fused;
    if (megatron_indexer_tensor(rest)) rest = kGaleIndexer + rest.substr(std::strlen(kMegatronIndexer));
    if (rest == "self_attention.linear_qkv_down_proj.layer_norm_weight" ||
        rest == "self_attention.linear_qkv_down_proj.layer_norm_bias") {  // the folded input_layernorm
      const bool weight = rest.size() >= 6 && rest.compare(rest.size() - 6, 6, "weight") == 0;
      out.emplace(prefix + (weight ? "input_layernorm.weight" : "input_layernorm.bias"), std::move(t));
      continue;
    }
    if (rest == "self_attention.linear_qkv_down_proj.weight") {  // --mla-down-proj-fusion's [q_down; kv_down]
      for (const char* unfused : {"self_attention.linear_q_down_proj.weight", "self_attention.linear_kv_down_proj.weight"})
        if (tensors.count(prefix + unfused))
          return DataLoss(where, ": tensor '", name, "' (the fused q/kv down projection) next to '", prefix, unfused,
                          "': expected one of the fused or the unfused layout");
      GALE_RETURN_IF_ERROR(split_fused_down_proj(name, prefix, t, q_lora, kv_rows, tp, where, out));
      continue;
    }
    const bool q_down = rest == "self_attention.linear_q_down_proj.weight";
    if (q_down || rest == "self_attention.linear_kv_down_proj.weight") {
      const int64_t whole = q_down ? q_lora : kv_rows;
      const int64_t rows = t.ndim() == 2 ? t.shape()[0] : -1;
      if (rows != whole && (tp <= 1 || rows != tp * whole))
        return DataLoss(where, ": tensor '", name, "' has shape ", t.shape_string(), "; expected ", whole,
                        " rows (", q_down ? "q_lora_rank" : "kv_lora_rank + qk_pos_emb_head_dim",
                        " in args), split over or duplicated on the ", tp, " tensor-parallel ranks");
      if (rows != whole) {  // duplicated on each rank (Transformer Engine's spec): merged as tp copies
        const size_t bytes = static_cast<size_t>(t.nbytes() / tp);
        for (int64_t r = 1; r < tp; ++r)
          if (std::memcmp(t.raw(), static_cast<const char*>(t.raw()) + r * bytes, bytes) != 0)
            return DataLoss(where, ": tensor '", name, "' of shape ", t.shape_string(), ": expected ", whole,
                            " rows, or the same ", whole, " rows on every tensor-parallel rank (a duplicated down "
                            "projection); rank ", r, "'s differ from rank 0's");
        Tensor one = Tensor::empty({whole, t.shape()[1]}, t.dtype());
        std::memcpy(one.raw(), t.raw(), bytes);
        t = one;
      }
    }
    out.emplace(prefix + rest, std::move(t));
  }
  for (const auto& [prefix, kv] : split_kv_up) {
    const std::string combined = prefix + "self_attention.linear_kv_up_proj.weight";
    if (!kv.first.defined() || !kv.second.defined() || out.count(combined))
      return DataLoss(where, ": layer '", prefix, "': expected linear_kv_up_proj.weight or both of Megatron's earlier "
                      "linear_k_up_proj.weight and linear_v_up_proj.weight, found ",
                      out.count(combined) ? "the combined and a split one" : "only one of the split ones");
    GALE_ASSIGN_OR_RETURN(out[combined], combine_split_kv_up(prefix, kv.first, kv.second,
                                                             args.value("num_attention_heads", int64_t{0}),
                                                             args.value("qk_head_dim", int64_t{0}),
                                                             args.value("v_head_dim", int64_t{0}), where));
  }
  tensors = std::move(out);
  return Status::Ok();
}

StatusOr<std::string> megatron_mla_local_name(const std::string& rest) {
  if (starts_with(rest, "self_attention.linear_q_proj.layer_norm_"))
    return Unimplemented("tensor '", rest, "': Gale's --qk-layernorm norm before linear_q_proj (without "
                         "--q-lora-rank) has no counterpart in Megatron's multi-latent attention; writing it to "
                         "Megatron's format is not supported");
  for (const auto& [local, fused] : kNormRenames)
    if (rest == fused) return std::string(local);
  if (starts_with(rest, kGaleIndexer)) return kMegatronIndexer + rest.substr(std::strlen(kGaleIndexer));
  return rest;
}

std::vector<std::string> megatron_mla_linears(const ModelArgs& model) {
  std::vector<std::string> out;
  const bool q_latent = model.q_lora_rank != kUnset && model.q_lora_rank > 0;
  for (const char* l : {"linear_q_proj", "linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj",
                        "linear_kv_up_proj", "linear_proj"}) {
    const bool q = !std::strcmp(l, "linear_q_proj"), q_lora = !std::strcmp(l, "linear_q_down_proj") ||
                                                              !std::strcmp(l, "linear_q_up_proj");
    if ((q && q_latent) || (q_lora && !q_latent)) continue;
    out.push_back(std::string(kAttn) + l);
  }
  if (model.experimental_attention_variant == "dsa")  // the indexer's duplicated linears
    for (const char* l : {"linear_wq_b", "linear_wk", "linear_weights_proj"})
      out.push_back(std::string(kMegatronIndexer) + l);
  return out;
}

void megatron_mla_args(const ModelArgs& m, PyValue& ns) {
  const bool q_latent = m.q_lora_rank != kUnset && m.q_lora_rank > 0;
  ns.set("multi_latent_attention", PyValue::boolean(true));
  ns.set("q_lora_rank", q_latent ? PyValue::integer(m.q_lora_rank) : PyValue::none());
  ns.set("kv_lora_rank", PyValue::integer(m.kv_lora_rank));
  ns.set("qk_head_dim", PyValue::integer(m.qk_head_dim));
  ns.set("qk_pos_emb_head_dim", PyValue::integer(m.qk_pos_emb_head_dim));
  ns.set("v_head_dim", PyValue::integer(m.v_head_dim));
  ns.set("qk_layernorm", PyValue::boolean(m.qk_layernorm));
  ns.set("rope_type", PyValue::str(m.rope_type.empty() ? std::string("yarn") : m.rope_type));  // MLA's default
  ns.set("rotary_scaling_factor", PyValue::real(m.rotary_scaling_factor));
  ns.set("mscale", PyValue::real(m.mscale));
  ns.set("mscale_all_dim", PyValue::real(m.mscale_all_dim));
  if (m.experimental_attention_variant == "dsa") {  // the indexer's flags (Megatron: None loss coefficient when 0)
    ns.set("experimental_attention_variant", PyValue::str("dsa"));
    ns.set("dsa_indexer_n_heads", PyValue::integer(m.dsa_indexer_n_heads));
    ns.set("dsa_indexer_head_dim", PyValue::integer(m.dsa_indexer_head_dim));
    ns.set("dsa_indexer_topk", PyValue::integer(m.dsa_indexer_topk));
    ns.set("dsa_indexer_loss_coeff",
           m.dsa_indexer_loss_coeff > 0.0 ? PyValue::real(m.dsa_indexer_loss_coeff) : PyValue::none());
    ns.set("dsa_indexer_use_sparse_loss", PyValue::boolean(m.dsa_indexer_use_sparse_loss));
  }
}

bool megatron_mla_duplicated(const ModelArgs& model, const std::string& name) {
  if (model.experimental_attention_variant != "dsa") return false;
  const size_t at = name.find(kAttn);
  if (at == std::string::npos) return false;
  const std::string rest = name.substr(at);
  return rest == "self_attention.linear_q_down_proj.weight" || rest == "self_attention.linear_kv_down_proj.weight";
}

Status check_megatron_mla_tp(const ModelArgs& m, int64_t tp) {
  if (m.experimental_attention_variant == "dsa") return Status::Ok();  // duplicated down projections
  if (m.q_lora_rank != kUnset && m.q_lora_rank > 0 && m.q_lora_rank % tp)
    return InvalidArgument("--target-tensor-parallel-size ", tp, ": expected it to divide --q-lora-rank (",
                           m.q_lora_rank, "): Megatron's local spec splits linear_q_down_proj's rows");
  if ((m.kv_lora_rank + m.qk_pos_emb_head_dim) % tp)
    return InvalidArgument("--target-tensor-parallel-size ", tp, ": expected it to divide --kv-lora-rank + "
                           "--qk-pos-emb-head-dim (", m.kv_lora_rank + m.qk_pos_emb_head_dim,
                           "): Megatron's local spec splits linear_kv_down_proj's rows");
  return Status::Ok();
}

}  // namespace gale
