// Megatron's hybrid layer allocation (--is-hybrid-model): which decoder layers are Mamba, attention, MLP or MoE.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

// The layer symbols of a hybrid model (Megatron's mamba_hybrid_layer_allocation Symbols).
inline constexpr char kHybridMamba = 'M';
inline constexpr char kHybridAttention = '*';
inline constexpr char kHybridMlp = '-';
// A MoE layer (Megatron-Core's Symbols.MOE, Nemotron-H MoE): pre_mlp_layernorm and the MoE MLP of
// --num-experts (model/moe_layer.h), no attention. The ratios never allocate one; only a pattern does.
inline constexpr char kHybridMoe = 'E';
// A Gated DeltaNet layer (Megatron-Core main's Symbols.GDN, hybrid_layer_specs' gdn_layer): the GDN
// mixer of model/gated_delta_net.h in self-attention's place (its norm fused into
// self_attention.in_proj), no MLP; its sizes are the --linear-* flags (GdnConfig).
inline constexpr char kHybridGatedDeltaNet = 'G';
// Multi-latent attention and DeepSeek sparse attention layers (Symbols.MLA, DS_ATTENTION): Megatron's
// rule applied ('*' does not mix with '+' or 'D'); '+' is Megatron main's mla_layer (input_layernorm,
// MLA of ModelConfig::mla without q/kv layernorms, no MLP), 'D' is refused as not supported yet.
inline constexpr char kHybridMla = '+';
inline constexpr char kHybridDsa = 'D';

// True for one of the layer symbols above (M, G, *, +, D, -, E).
bool is_hybrid_layer_symbol(char s);

// The layer types of a `num_layers`-layer hybrid model, one symbol per layer, as Megatron's
// allocate_layers computes them:
//   attention: round(L·attention_ratio) layers (round half to even, as Python's round) spread so
//     that the Mamba runs between them are even, starting and ending with Mamba: walking the layers
//     with a budget x = m / (a + 1) (m Mamba layers, a attention layers), a layer is attention
//     when x < 0.5 (then x += m / (a + 1)), else x −= 1;
//   MLP: round(L·mlp_ratio) of the remaining Mamba layers, by the same walk over them with
//     x = (m − mlp) / mlp;
//   `override_pattern` (non-empty: --hybrid-override-pattern) replaces the result; its decoder
//     layers (in Megatron main's unified format, the symbols before the first '/' without the '|'
//     stage boundaries: model/hybrid_pattern.h) must be L symbols from {M, G, *, +, D, -, E} and, when either ratio is positive, as many layers of each
//     type; '*' with '+' or 'D' is refused (as Megatron), and so are '+' and 'D' (not supported yet).
// Errors name the flag, what was expected and what was found.
Status allocate_hybrid_layers(int64_t num_layers, double attention_ratio, double mlp_ratio,
                              const std::string& override_pattern, std::string* layers);

// One flag per layer of `layers` (allocate_hybrid_layers' result): 1 for a MoE layer ('E'), else 0
// (MoeArgs::layer_pattern / MoeConfig::pattern of a hybrid model).
std::vector<int> hybrid_moe_layer_flags(const std::string& layers);

// One flag per layer of `layers`: 1 for a Gated DeltaNet layer ('G'), else 0 (GdnConfig::pattern of
// a hybrid model).
std::vector<int> hybrid_gdn_layer_flags(const std::string& layers);

// 'E' layers and --num-experts go together: MoE layers need experts (`moe_enabled`), and experts
// need MoE layers to live in (Megatron would silently build none).
Status check_hybrid_moe_layers(const std::string& layers, bool moe_enabled);

// The Mamba mixer's sizes (d_inner = 2·hidden): --mamba-state-dim, --mamba-head-dim and
// --mamba-num-groups positive, the head dimension dividing d_inner and the groups the heads.
Status check_mamba_sizes(int64_t hidden, int64_t state_dim, int64_t head_dim, int64_t num_groups);

}  // namespace gale
