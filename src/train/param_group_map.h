// Megatron-LM main's --dump-param-to-param-group-map: the parameter -> optimizer param-group map, as a PyTorch
// Distributed Checkpoint directory.
//
//   GALE_RETURN_IF_ERROR(dump_param_group_map(engine, args, world));          // collective, at start-up
//   GALE_ASSIGN_OR_RETURN(ParamGroupMap m, read_param_group_map(dir));        // {name: group index}
//
// Megatron (megatron/core/optimizer/__init__.py get_megatron_optimizer, --optimizer adam or sgd) builds its param
// groups with _get_param_groups: each trainable parameter gets the key (override tuple, is_expert_parallel), where the
// override tuple is the sorted merge of the standard config overrides that match it — (('wd_mult', 0.0),) for biases
// and 1-D parameters (with --apply-wd-to-qk-layernorm: not the q/k layernorms), (('max_lr', --decoupled-lr)[,
// ('min_lr', --decoupled-min-lr)]) for the word embedding and the output layer — or None when none matches. The
// keys of all ranks are merged and sorted, None first, then by their tuples; the dense groups are numbered 0, 1, ...
// in that order, then the expert-parallel groups continue the count. Every parameter's global unique name
// (get_global_unique_param_name: its named_parameters() name in the wrapped model chunk — `module.` for the DDP
// wrapper, `module.module.` under --bf16/--fp16's Float16Module — with the global layer number and global expert
// index) maps to its group's index, and torch.distributed.checkpoint.save writes that dict to the directory.
//
// Gale writes what Megatron writes: `<dir>/.metadata` (Metadata with a BytesStorageMetadata per key and
// MetadataIndex(fqn) -> _StorageInfo(relative_path, offset, length)) and `<dir>/__0_0.distcp` holding each index as a
// torch.save'd int. Rank 0 writes every entry (torch's planner spreads the duplicated objects over the ranks' files;
// the keys and values are the same). Gale's names are Megatron-Core's (SequentialMLP experts; TEGroupedMLP's
// `mlp.experts.linear_fc1.weight<e>` with --moe-grouped-gemm; the tied output copy of the last pipeline stage as
// `output_layer.weight`). With virtual pipeline stages every chunk's layers carry their global number (Megatron
// renumbers only the last chunk's, an oversight that makes the others' names collide).
// Refused, naming the flag: --use-mup (µP's own lr overrides), optimizers other than adam and sgd and
// Megatron-FSDP (Megatron writes no map there), --use-torch-fsdp2 and --layerzero, and
// --overlap-param-gather-with-optimizer-step (its separate first-chunk groups).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "train/arguments.h"

namespace gale {

struct Engine;
class GPTModel;

using ParamGroupMap = std::map<std::string, int64_t>;

// One parameter's param-group key: Megatron's override tuple (sorted by name; empty = None) and is_expert_parallel.
struct ParamGroupKey {
  std::vector<std::pair<std::string, double>> overrides;
  bool expert_parallel = false;
  bool operator==(const ParamGroupKey& o) const {
    return overrides == o.overrides && expert_parallel == o.expert_parallel;
  }
};

// Megatron's order of group keys: None first, then the override tuples in Python's tuple order.
bool param_group_key_less(const ParamGroupKey& a, const ParamGroupKey& b);

// The arguments' refusal of the flag, or Ok (also Ok without the flag).
Status check_param_group_map_args(const Arguments& args);

// Megatron's global unique name of parameter `id` of `model` (see above).
std::string megatron_param_group_name(const GPTModel& model, int id, const Arguments& args);

// This chunk's trainable parameters with their names and keys, in registration order.
std::vector<std::pair<std::string, ParamGroupKey>> param_group_keys(const GPTModel& model, const Arguments& args);

// Numbers the groups of all ranks' (name, key) pairs as Megatron does and maps each name to its group.
ParamGroupMap assign_param_groups(const std::vector<std::pair<std::string, ParamGroupKey>>& all);

// Writes `map` as the distributed checkpoint directory `dir` (created; files replaced).
Status write_param_group_map(const std::string& dir, const ParamGroupMap& map);
// Reads it back with Gale's DCP reader (ckpt/dcp_reader.h): every object must be an int.
StatusOr<ParamGroupMap> read_param_group_map(const std::string& dir);

// Collective over `world`: gathers every rank's names and keys, numbers the groups and writes
// --dump-param-to-param-group-map (rank 0). Nothing without the flag.
Status dump_param_group_map(const Engine& engine, const Arguments& args, const Comm& world);

}  // namespace gale
