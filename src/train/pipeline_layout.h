// Megatron's --pipeline-model-parallel-layout: the layout string parsed into the layers of every (pipeline rank, virtual stage).
//
// The string lists the stages in Megatron's order, stage k = virtual stage k / PP of pipeline rank
// k mod PP, separated by '|'. Each stage lists its layers: E the embedding, t a transformer
// decoder layer, m a multi-token-prediction layer, L the loss. `x*n` repeats one symbol n times,
// `(...)*n` repeats a group (which may contain '|'), commas are ignored, and a stage may be empty.
// Example, DeepSeek-V3's 61 layers with one MTP layer at PP 16 x VPP 2 (Megatron's docs):
// "Et*3|(tt|)*29,m|L". The number of stages divided by PP is the virtual pipeline size.
//
// Rules (Megatron's PipelineParallelLayerLayout, plus Gale's placement): the stage count is a
// multiple of --pipeline-model-parallel-size; E exactly once, as the first layer of the first stage;
// L exactly once, as the last layer of the last stage; as many t as --num-layers and m as
// --mtp-num-layers (none without it), every m after every t. Gale runs MTP beside the loss, so
// every m must be in the last stage (Megatron's "standalone" MTP on another rank is refused).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

// The stages of `text` as written, in order, each a string of the symbols E, t, m, L (repeats
// unrolled, commas dropped). Errors name the flag and what was found.
StatusOr<std::vector<std::string>> parse_pipeline_layout(const std::string& text);

// The decoder layers of each [pipeline rank][virtual stage] of `text` checked against the rules
// above, for PP pipeline ranks, num_layers decoder layers and mtp_layers MTP layers (0: none).
StatusOr<std::vector<std::vector<int64_t>>> pipeline_layout_layers(const std::string& text, int64_t pp,
                                                                   int64_t num_layers, int64_t mtp_layers);

}  // namespace gale
