// Gated DeltaNet (-2) tensors in Megatron's torch checkpoints: per-section TP merging and cutting, args.
#include "train/megatron_gdn_names.h"

#include <numeric>

#include "train/checkpoint_args.h"
#include "train/megatron_tp_split.h"

namespace gale {

namespace {

const char* const kMixer[] = {"self_attention.in_proj.weight", "self_attention.conv1d.weight",
                              "self_attention.dt_bias",        "self_attention.A_log",
                              "self_attention.out_norm.weight", "self_attention.out_proj.weight"};

// Rank-local sections: each whole section's 1/tp.
std::vector<int64_t> local_sections(const std::vector<int64_t>& whole, int64_t tp) {
  std::vector<int64_t> out;
  for (int64_t n : whole) out.push_back(n / tp);
  return out;
}

// The row sections of a mixer tensor (whole model); empty for out_proj / out_norm (not row-sectioned).
std::vector<int64_t> row_sections(const std::string& rest, const MegatronGdnSizes& s) {
  if (rest == "self_attention.in_proj.weight") return s.in_proj_sections();
  if (rest == "self_attention.conv1d.weight") return s.conv_sections();
  if (rest == "self_attention.dt_bias") return {s.gdn2 ? s.qk_dim() : s.NV};
  if (rest == "self_attention.A_log") return {s.gdn2 ? s.NK : s.NV};
  return {};
}

int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

}  // namespace

std::vector<int64_t> MegatronGdnSizes::in_proj_sections() const {
  const int64_t QK = qk_dim(), VD = v_dim();
  if (gdn2) return {QK, QK, VD, VD, QK, QK, VD};  // q, k, v, z, f, b, w
  return {QK, QK, VD, VD, NV, NV};                 // q, k, v, z, β, α
}

StatusOr<std::optional<MegatronGdnSizes>> megatron_gdn_sizes(const nlohmann::json& args, const std::string& where) {
  auto v = args.find("experimental_attention_variant");
  if (v == args.end() || !v->is_string() || (*v != "gdn" && *v != "gdn2")) return std::optional<MegatronGdnSizes>();
  if (args.value("is_hybrid_model", false)) return std::optional<MegatronGdnSizes>();
  MegatronGdnSizes s;
  s.gdn2 = *v == "gdn2";
  const std::pair<const char*, int64_t*> keys[] = {{"linear_num_key_heads", &s.NK},
                                                   {"linear_num_value_heads", &s.NV},
                                                   {"linear_key_head_dim", &s.DK},
                                                   {"linear_value_head_dim", &s.DV},
                                                   {"linear_conv_kernel_dim", &s.K}};
  for (const auto& [key, dest] : keys) {
    auto it = args.find(key);
    if (it == args.end() || !it->is_number_integer() || it->get<int64_t>() <= 0)
      return DataLoss(where, ": args '", key, "' of a Gated DeltaNet model: expected a positive int, found ",
                      it == args.end() ? std::string("none") : it->dump());
    *dest = it->get<int64_t>();
  }
  return std::optional<MegatronGdnSizes>(s);
}

std::optional<MegatronGdnSizes> megatron_gdn_sizes_of(const ModelArgs& m) {
  const std::string& v = m.experimental_attention_variant;
  if ((v != "gdn" && v != "gdn2") || m.is_hybrid_model) return std::nullopt;
  MegatronGdnSizes s;
  s.gdn2 = v == "gdn2";
  s.NK = m.linear_num_key_heads;
  s.NV = m.linear_num_value_heads;
  s.DK = m.linear_key_head_dim;
  s.DV = m.linear_value_head_dim;
  s.K = m.linear_conv_kernel_dim;
  return s;
}

bool megatron_gdn_mixer_tensor(const std::string& rest) {
  for (const char* n : kMixer)
    if (rest == n) return true;
  return false;
}

bool megatron_gdn_tensor(const std::string& rest) {
  static const char* const kFused[] = {
      "self_attention.in_proj.layer_norm_weight",   "self_attention.in_proj.layer_norm_bias",
      "self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias",
      "mlp.linear_fc1.layer_norm_weight",           "mlp.linear_fc1.layer_norm_bias"};
  for (const char* n : kFused)
    if (rest == n) return true;
  return megatron_gdn_mixer_tensor(rest);
}

StatusOr<Tensor> megatron_gdn_merge_tp(const std::string& rest, const std::vector<Tensor>& parts,
                                       const MegatronGdnSizes& s, const std::string& where) {
  const Tensor& first = parts[0];
  for (const Tensor& p : parts)
    if (p.shape() != first.shape() || p.dtype() != first.dtype())
      return DataLoss(where, ": tensor '", rest, "' has shape ", first.shape_string(), " on tensor-parallel rank 0 but ",
                      p.shape_string(), " (", dtype_name(p.dtype()), ") on another");
  const int64_t tp = static_cast<int64_t>(parts.size());
  if (rest == "self_attention.out_norm.weight") return first.clone();
  if (rest == "self_attention.out_proj.weight") return megatron_merge_tp(parts, MegatronSplit::kColumns, rest, where);
  const std::vector<int64_t> whole = row_sections(rest, s), local = local_sections(whole, tp);
  if (first.ndim() == 0 || first.shape()[0] != total(local) || total(local) * tp != total(whole))
    return DataLoss(where, ": tensor '", rest, "' has shape ", first.shape_string(), " on each of ", tp,
                    " tensor-parallel ranks; expected ", total(whole) / tp, " rows (1/", tp, " of the ", total(whole),
                    " the args' Gated DeltaNet sizes give)");
  Shape shape = first.shape();
  shape[0] = total(whole);
  const bool conv = rest == "self_attention.conv1d.weight";
  if (conv && (first.ndim() != 3 || first.shape()[1] != 1 || first.shape()[2] != s.K))
    return DataLoss(where, ": tensor '", rest, "' has shape ", first.shape_string(), ", expected [", total(local),
                    ", 1, ", s.K, "] (linear_conv_kernel_dim ", s.K, ")");
  if (conv) shape = {total(whole), s.K};  // Gale's [C, K]
  Tensor out = Tensor::empty(shape, first.dtype());
  // Section j of the whole tensor is rank 0's section j, rank 1's, ...
  int64_t dst = 0, src = 0;
  for (int64_t n : local) {
    for (int64_t t = 0; t < tp; ++t, dst += n) megatron_copy_rows(parts[t], src, n, out, dst);
    src += n;
  }
  return out;
}

StatusOr<Tensor> megatron_gdn_cut_tp(const std::string& rest, const Tensor& whole, const MegatronGdnSizes& s,
                                     int64_t tp, int64_t t) {
  if (s.NK % tp || s.NV % tp)
    return InvalidArgument("--target-tensor-parallel-size ", tp, ": expected it to divide the Gated DeltaNet key heads (",
                           s.NK, ") and value heads (", s.NV, ")");
  if (rest == "self_attention.out_norm.weight") return whole;
  if (rest == "self_attention.out_proj.weight") return megatron_cut_tp(whole, MegatronSplit::kColumns, tp, t, rest);
  const std::vector<int64_t> sections = row_sections(rest, s), local = local_sections(sections, tp);
  if (whole.ndim() == 0 || whole.shape()[0] != total(sections))
    return InvalidArgument("tensor '", rest, "' of shape ", whole.shape_string(), ": expected ", total(sections),
                           " rows (the model's Gated DeltaNet sizes)");
  Shape shape = whole.shape();
  shape[0] = total(local);
  const bool conv = rest == "self_attention.conv1d.weight";
  Tensor out = Tensor::empty(shape, whole.dtype());
  int64_t src = 0, dst = 0;
  for (size_t j = 0; j < sections.size(); ++j) {
    megatron_copy_rows(whole, src + t * local[j], local[j], out, dst);
    src += sections[j];
    dst += local[j];
  }
  if (conv) out = out.view({total(local), 1, s.K});  // Megatron's Conv1d weight [C, 1, K]
  return out;
}

std::vector<std::string> megatron_gdn_linears() { return {"self_attention.in_proj", "self_attention.out_proj"}; }

void megatron_gdn_args(const ModelArgs& m, PyValue& ns) {
  ns.set("experimental_attention_variant", PyValue::str(m.experimental_attention_variant));
  PyRef list = PyValue::list();  // Megatron's parsed --linear-attention-freq: one 0/1 per layer
  for (int v : m.linear_attention_pattern) list->items.push_back(PyValue::integer(v));
  ns.set("linear_attention_freq", list);
  ns.set("linear_conv_kernel_dim", PyValue::integer(m.linear_conv_kernel_dim));
  ns.set("linear_key_head_dim", PyValue::integer(m.linear_key_head_dim));
  ns.set("linear_value_head_dim", PyValue::integer(m.linear_value_head_dim));
  ns.set("linear_num_key_heads", PyValue::integer(m.linear_num_key_heads));
  ns.set("linear_num_value_heads", PyValue::integer(m.linear_num_value_heads));
  ns.set("transformer_impl", PyValue::str("transformer_engine"));
}

Status refuse_megatron_variant(const ModelArgs& m, const std::string& where) {
  if (megatron_gdn_sizes_of(m)) return Status::Ok();
  return refuse_variant_conversion(m, where);
}

}  // namespace gale
