// Megatron-Core's multi-token-prediction (MTP) state-dict names in its torch-format checkpoints, and what Gale writes of them.
//
// Megatron-Core's GPT MTP block (megatron/core/transformer/multi_token_prediction.py) saves, per depth
// k = 0 .. mtp_num_layers - 1 (all on the last pipeline stage, the last virtual chunk):
//   mtp.layers.<k>.enorm.{weight,bias}, hnorm.{weight,bias}        norms of the embedding / the hidden state
//   mtp.layers.<k>.eh_proj.weight [H, 2H]                          column-parallel: TP splits its rows
//   mtp.layers.<k>.transformer_layer.<a decoder layer's names>     split over TP as a decoder layer's
//   mtp.layers.<k>.final_layernorm.{weight,bias}
// with `_extra_state` None entries for eh_proj and the inner layer's linears. These are Gale's own parameter
// names (model/gpt_model.h). Megatron main's legacy torch format names the inner layer `mtp_model_layer`
// (its sharded torch_dist keys keep `transformer_layer`); both read as `transformer_layer`.
//
//   int64_t k; std::string rest;
//   if (megatron_mtp_layer_of("mtp.layers.1.mtp_model_layer.mlp.linear_fc1.weight", &k, &rest))
//     ...  // k = 1, rest = "transformer_layer.mlp.linear_fc1.weight"
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/arguments.h"

namespace gale {

// "mtp.layers.<k>.<rest>": k and rest (a leading "mtp_model_layer." of rest read as "transformer_layer.");
// false for other names.
bool megatron_mtp_layer_of(const std::string& name, int64_t* k, std::string* rest);

// Whether `rest` (of mtp.layers.<k>.<rest>, as megatron_mtp_layer_of gives it) is a tensor of Gale's GPT MTP
// layer: the norms, eh_proj.weight, or transformer_layer.<r> for which `layer_tensor(r)` holds (a decoder
// layer's tensor names, Transformer Engine's fused norm names already renamed by `local_name`).
bool megatron_mtp_tensor(const std::string& rest, const std::function<bool(const std::string&)>& layer_tensor);

// The `_extra_state` keys Megatron saves for MTP depth k: eh_proj's and those of the inner layer's
// `linears` (a decoder layer's, as train/megatron_moe_names.h lists them).
std::vector<std::string> megatron_mtp_extra_state_keys(int64_t k, const std::vector<std::string>& linears);

// Refuses (Unimplemented, naming --mtp-num-layers and what the model has) the MTP models Gale does not
// write in Megatron's torch format yet: MoE MTP layers (experts renumbered per expert rank), multi-latent
// attention and hybrid (Mamba) MTP depths. Ok for no MTP and for dense GPT MTP layers.
Status check_megatron_mtp_target(const ModelArgs& model, const MoeArgs& moe);

}  // namespace gale
