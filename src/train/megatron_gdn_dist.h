// Gated DeltaNet (-2) layers in Megatron's torch_dist checkpoints: the per-section sharded keys joined back into whole tensors.
//
// Megatron-Core's GatedDeltaNet.sharded_state_dict (megatron/core/ssm/gated_delta_net/common.py) splits
// in_proj.weight with _split_tensor_factory into one sharded tensor per in_proj_split_names section,
//   <layer>.self_attention.in_proj.weight.{query, key, value, z, beta, alpha}     (GDN)
//   <layer>.self_attention.in_proj.weight.{query, key, value, z, f, b, w}         (GDN2)
// and conv1d.weight into <layer>.self_attention.conv1d.weight.{query, key, value}; each is the global
// section (TP rank r holds its r-th 1/TP), so the whole tensor of the torch format at TP 1 (Gale's
// layout, train/megatron_gdn_names.h) is their row concatenation in that order. dt_bias and A_log are
// sharded along dim 0 and out_proj by columns under their own keys: global already. Since a GDN model
// sets linear_attention_freq, Megatron keys its layers one by one (decoder.layers.<i>.), never stacked.
//
//   GALE_RETURN_IF_ERROR(join_megatron_gdn_dist_sections(*gdn, model_dict, dir));
#pragma once

#include <string>
#include <vector>

#include "ckpt/pickle.h"
#include "core/status.h"
#include "train/megatron_gdn_names.h"

namespace gale {

// The section names Megatron gives in_proj.weight's (GDN or GDN2) and conv1d.weight's sharded keys.
std::vector<std::string> megatron_gdn_in_proj_section_names(bool gdn2);
std::vector<std::string> megatron_gdn_conv_section_names();

// Replaces, in `model` (a kDict of torch_dist's global tensors by name), every layer's in_proj.weight.<section>
// and conv1d.weight.<section> keys by in_proj.weight / conv1d.weight, the sections' row concatenation in
// Megatron's order (conv1d keeps Megatron's [C, 1, K]). Errors (DataLoss naming `where` and the key): a
// section missing, one whose rows are not the args' size for it (naming both), a section name the variant does
// not have (a GDN2 checkpoint's f / b / w under GDN args, ...), sections beside an unsplit in_proj.weight.
Status join_megatron_gdn_dist_sections(const MegatronGdnSizes& s, PyValue& model, const std::string& where);

}  // namespace gale
