// Megatron's heterogeneous layer configuration (Llama-Nemotron NAS config.json's block_configs) read into per-layer sub-blocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace gale {

// The model flags the configuration is checked against and fills in.
struct HeteroModelShape {
  int64_t num_layers = 0;  // --num-layers
  int64_t hidden = 0;      // --hidden-size
  int64_t heads = 0;       // --num-attention-heads
  int64_t kv_heads = 0;    // --num-query-groups (or the heads without GQA): a kBlock attention's default
  int64_t ffn = 0;         // --ffn-hidden-size: a kBlock MLP's default
};

// Parses `json` (the text of a DeciLM / Llama-Nemotron NAS config.json, or any JSON object with
// "block_configs") as Megatron's HeterogeneousTransformerConfig does, one HeteroLayer per entry:
//   attention: "no_op", "replace_with_linear" (booleans, default false; not both), and for the usual
//     attention "num_query_groups", else "n_heads_in_group" (query groups = heads / n_heads_in_group,
//     which must divide the heads); null or absent: --num-query-groups;
//   "ffn" (or "mlp"): "no_op", "replace_with_linear", and for the usual MLP "ffn_hidden_size", else
//     "ffn_mult": F = the multiple of 256 at or above int(2·ffn_mult·H/3); null or absent: --ffn-hidden-size.
// A size given for a no-op or linear sub-block, a non-positive size, sparsity or per-layer attention
// windows ("sparsify", "window_length", "num_sink_tokens", "unshifted_sink",
// "use_prefill_window_in_sink_attention" set), a block count other than --num-layers and
// top-level "num_hidden_layers" / "hidden_size" / "num_attention_heads" that differ from the flags
// are errors naming `source` (the flag), the layer index and the field. Other keys are ignored (as
// Megatron).
StatusOr<std::vector<HeteroLayer>> parse_heterogeneous_layers(const std::string& json, const HeteroModelShape& shape,
                                                             const std::string& source);

}  // namespace gale
