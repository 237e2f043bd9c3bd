// MindSpeed's LayerZeRO configuration file (--layerzero-config FILE.yaml): the keys Gale reads,
// accepts without effect, or refuses.
//
// The file is MindSpeed's flat YAML mapping; Gale reads the subset it uses: `key: value` lines
// (quotes around a value dropped), `key:` followed by `- item` lines (a list), `#` comments and
// blank lines. Keys (MindSpeed's LayerzeroConfig):
//   zero3_size          required, an integer ≥ 1 that divides the data-parallel size: the ZeRO-3
//                       sub-groups are zero3_size consecutive data-parallel ranks
//   param_dtype,        the runtime parameter / gradient precision; MindSpeed's default fp16.
//   reduce_dtype        Gale's LayerZeRO runs in fp32: fp32 is accepted, fp16 and bf16 (and the
//                       default, when the key is absent) refused, not supported yet
//   transformer_layers  the wrapped layer classes: accepted, Gale's units are always the embedding,
//                       each transformer layer and the head
//   forward_prefetch, backward_prefetch, limit_all_gathers, autocast_input, autocast_output:
//                       accepted without effect (Gale gathers each unit just before its use,
//                       blocking, one at a time, in fp32)
//   ignored_modules     must be empty: every parameter is managed (refused otherwise)
//   offload_grads       false; true is refused (not supported yet)
//   ckpt_load_path      refused: Gale's LayerZeRO checkpoints are in the common format, resumed with --load
// Any other key is an error naming it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

struct LayerZeroConfig {
  int64_t zero3_size = 0;
  std::vector<std::string> accepted_without_effect;  // the keys given that change nothing in Gale
};

// Reads and checks `path` (the messages name --layerzero-config, the file and the key).
StatusOr<LayerZeroConfig> read_layerzero_config(const std::string& path);

// The same from the file's text (`path` only for messages).
StatusOr<LayerZeroConfig> parse_layerzero_config(const std::string& text, const std::string& path);

}  // namespace gale
