// MindSpeed's dist-train configuration: the "dist_config" of --mm-model read and validated.
//
// --dist-train with MindSpeed-MM's --mm-model model.json gives the rank map of
// parallel/dist_train_layout.h.
// The file is MindSpeed-MM's model JSON; Gale reads only its "dist_config" object:
//   {"dist_config": {"model_name": "gpt", "use_multiparam_send_recv": false,
//     "model_config": [
//       {"name": "encoder", "model_index": 0, "world_size": 1, "tensor_model_parallel_size": 1,
//        "pipeline_model_parallel_size": 1, "context_parallel_size": 1, "forward_only": false,
//        "num_layers": 2},
//       {"name": "decoder", "model_index": 1, "world_size": 2, "tensor_model_parallel_size": 2,
//        "num_layers": 2, "main_dp": true}]}}
// MindSpeed's keys and rules (dist_train_config.py): name (a unique identifier), model_index (0, 1,
// ... without gaps; the sub-worlds take the job's ranks in that order), world_size (> 0, a multiple
// of TP·PP·CP), the three sizes (default 1), forward_only and main_dp (booleans; at most one
// main_dp), no other key, none starting with '_'; the world sizes sum to the job's. Gale's model is
// one GPT decoder cut along its layers, so each entry also gives "num_layers", the transformer
// layers of that sub-world (consecutive; they sum to --num-layers, and each divides by its PP);
// MindSpeed-MM's sub-models (a ViT, an LLM) carry their own layer counts in their model configs.
// Data-parallel sizes (world_size / (TP·PP)) may differ when each is a multiple of the smallest
// (MindSpeed's main_dp, which must then name a sub-world of the smallest DP; see
// parallel/dist_train_layout.h). Not supported yet (Unimplemented, "not supported yet"):
// context_parallel_size that differs between sub-worlds (or with DP sizes that differ),
// use_multiparam_send_recv true, DP sizes that are not multiples of the
// smallest, and forward_only sub-worlds after a trainable one (only a leading run of sub-worlds may be
// forward-only; the last, holding the loss, may not).
#pragma once

#include <string>

#include "core/status.h"
#include "parallel/dist_train_layout.h"

namespace gale {

// The dist_config of the JSON text `text` (from `path`, named in errors) for a job of `world_size`
// ranks and a model of `num_layers` transformer layers. Errors name the file, the field (e.g.
// "model_config[1].world_size" with its entry's name), what was expected and what was found.
StatusOr<DistTrainLayout> parse_dist_train_config(const std::string& text, const std::string& path,
                                                  int64_t world_size, int64_t num_layers);

// The same, reading the file at `path`.
StatusOr<DistTrainLayout> load_dist_train_config(const std::string& path, int64_t world_size, int64_t num_layers);

// The tensor-parallel size the vocabulary is padded for under --dist-train: the least common
// multiple of the sub-worlds' TP sizes, so every sub-world pads it to the same size.
int64_t dist_train_vocab_tp(const DistTrainLayout& layout);

// One line per sub-world for the start-up log: its name, ranks, sizes and layers.
std::string render_dist_train_layout(const DistTrainLayout& layout);

}  // namespace gale
