// Megatron-Core's multi-token-prediction state-dict names: parsing, the tensors Gale knows, the _extra_state keys.
#include "train/megatron_mtp_names.h"

#include <algorithm>
#include <cctype>

namespace gale {

bool megatron_mtp_layer_of(const std::string& name, int64_t* k, std::string* rest) {
  static const std::string kPrefix = "mtp.layers.";
  if (name.rfind(kPrefix, 0) != 0) return false;
  const size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos) return false;
  const std::string digits = name.substr(kPrefix.size(), dot - kPrefix.size());
  if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return false;
  *k = std::stoll(digits);
  *rest = name.substr(dot + 1);
  static const std::string kMain = "mtp_model_layer.";  // Megatron main's module name (torch format)
  if (rest->rfind(kMain, 0) == 0) *rest = "transformer_layer." + rest->substr(kMain.size());
  return true;
}

bool megatron_mtp_tensor(const std::string& rest, const std::function<bool(const std::string&)>& layer_tensor) {
  for (const char* norm : {"enorm.", "hnorm.", "final_layernorm."})
    for (const char* p : {"weight", "bias"})
      if (rest == std::string(norm) + p) return true;
  if (rest == "eh_proj.weight") return true;
  static const std::string kLayer = "transformer_layer.";
  return rest.rfind(kLayer, 0) == 0 && layer_tensor(rest.substr(kLayer.size()));
}

std::vector<std::string> megatron_mtp_extra_state_keys(int64_t k, const std::vector<std::string>& linears) {
  const std::string prefix = str_cat("mtp.layers.", k, ".");
  std::vector<std::string> out = {prefix + "eh_proj._extra_state"};
  for (const std::string& linear : linears) out.push_back(str_cat(prefix, "transformer_layer.", linear, "._extra_state"));
  return out;
}

Status check_megatron_mtp_target(const ModelArgs& model, const MoeArgs& moe) {
  if (model.mtp_num_layers == kUnset || model.mtp_num_layers <= 0) return Status::Ok();
  const std::string what = str_cat("writing Megatron's torch format of a model with --mtp-num-layers ",
                                   model.mtp_num_layers, " and ");
  if (moe.enabled())
    return Unimplemented(what, "--num-experts ", moe.num_experts, ": not supported yet (expected dense MTP layers; "
                         "Megatron's MoE MTP layers would need their experts renumbered per expert-parallel rank)");
  if (model.multi_latent_attention)
    return Unimplemented(what, "--multi-latent-attention: not supported yet (expected MTP layers with standard "
                         "attention)");
  if (model.is_hybrid_model)
    return Unimplemented(what, "--hybrid-override-pattern '", model.hybrid_override_pattern,
                         "': not supported yet (expected a GPT model; Megatron's hybrid MTP depths are "
                         "mtp_model_layer.layers.<j>)");
  return Status::Ok();
}

}  // namespace gale
