// --auto-settings' search: every TP × CP × PP × DP layout of the target world that Gale can run
// for this model, predicted by the fitted models (train/auto_settings_model.h), those that fit the
// memory limit ranked by predicted step time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/auto_settings_model.h"

namespace gale {

// The target's world and the model's divisibility constraints.
struct AutoSearchSpace {
  int64_t world_size = 1;
  int64_t num_layers = 1, num_attention_heads = 1, num_query_groups = 1, ffn_hidden_size = 1;
  int64_t seq_length = 1, micro_batch_size = 1, global_batch_size = 1;
  std::string cp_algo = "megatron_cp_algo";  // ulysses_cp_algo: CP must divide the heads
  double memory_limit_bytes = 0;             // per rank
};

struct AutoCandidate {
  AutoLayout layout;
  AutoPrediction prediction;
  bool fits = false;  // predicted peak <= the memory limit
};

struct AutoSearchResult {
  std::vector<AutoCandidate> ranked;       // fitting ones, fastest first (ties: smaller peak, then TP, PP)
  std::vector<AutoCandidate> over_memory;  // runnable but predicted above the limit, smallest peak first
  std::vector<std::string> excluded;       // "tp=3 cp=1 pp=1 dp=2: ..." why a layout cannot run
};

// Why `l` cannot run this model ("" when it can): TP divides the heads, query groups and FFN
// size; PP divides the layers; CP splits the sequence into 2·CP chunks (Ulysses: divides the
// heads / TP); the global batch is a multiple of micro-batch × DP.
std::string layout_exclusion(const AutoSearchSpace& s, const AutoLayout& l);

AutoSearchResult search_layouts(const AutoModels& m, const AutoSearchSpace& s);

}  // namespace gale
