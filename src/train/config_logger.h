// --config-logger-dir: Megatron's config logger (megatron/core/config_logger.py) for gale pretrain.
//
// Megatron writes, when TransformerConfig.config_logger_dir is set, one file per call of
// log_config_to_disk to <dir>/<prefix>.rank_<tp>_<dp>_<cp>_<pp>_<ep>.iter<n>.<json|pth>, n counting
// that prefix's calls on the rank from 0. Gale writes the same files at the same moments:
//   GPTModel (MambaModel with --is-hybrid-model)   each model chunk's constructor arguments: its
//                                                   TransformerConfig and the model's flags (JSON)
//   GPTModel_init_ckpt                             each chunk's state dict right after
//                                                   initialisation (torch.save of an OrderedDict)
//   DistributedDataParallel (FullyShardedDataParallel with --use-custom-fsdp)
//                                                   each chunk's DDP wrapper: TransformerConfig
//                                                   and DistributedDataParallelConfig (JSON)
//   DistributedOptimizer / FP32Optimizer / Float16OptimizerWithFloat16Params
//                                                   the optimizer's OptimizerConfig (JSON), once per
//                                                   parameter group Megatron builds (dense; experts)
//   input_and_logits                               every forward of a last pipeline stage: the
//                                                   input ids, position ids, attention mask (None:
//                                                   Gale builds none), the embedding output
//                                                   (first stage too, else None) and the logits
//                                                   [S, B, V/TP] (torch.save of an OrderedDict)
// The configs hold the dataclass fields Megatron fills from its args by name, with the values of
// this command line (or Megatron's defaults) and the derived sizes Gale resolved; fields without a
// command-line counterpart (callables, process groups) are left out. docs/formats/config-logger.md.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/pickle.h"
#include "core/status.h"
#include "train/arguments.h"

namespace gale {

struct Engine;
class GPTModel;
struct MicroBatch;
class Tensor;

class ConfigLogger {
 public:
  // `rank`: Megatron's parallel_state.get_all_ranks(), "<tp>_<dp>_<cp>_<pp>_<ep>".
  ConfigLogger(std::string dir, std::string rank) : dir_(std::move(dir)), rank_(std::move(rank)) {}
  // <dir>/<prefix>.rank_<rank>.iter<n>.json (python_json_dumps).
  Status write_json(const std::string& prefix, const nlohmann::ordered_json& value);
  // <dir>/<prefix>.rank_<rank>.iter<n>.pth (write_torch_file).
  Status write_torch(const std::string& prefix, const PyValue& value);
  const std::string& dir() const { return dir_; }

 private:
  std::string next_path(const std::string& prefix, const char* extension);
  std::string dir_, rank_;
  std::map<std::string, int64_t> counts_;
};

// `j` as Python's json.dumps writes it (separators ", " and ": ", keys in insertion order, floats
// as repr: 1.0, 0.003, 1e-05).
std::string python_json_dumps(const nlohmann::ordered_json& j);

// Megatron's TransformerConfig as core_transformer_config_from_args fills it, from `argv` (the
// command line, Megatron's defaults elsewhere) and `a` (the derived sizes and dtypes).
nlohmann::ordered_json megatron_transformer_config(const Arguments& a, const std::vector<std::string>& argv);

// `model`'s parameters as Megatron's state_dict() of that chunk on this rank: its local layer
// numbers (from 0 per pipeline stage and virtual chunk), local expert numbers, the last stage's
// tied output weight as output_layer.weight, `_extra_state` None entries of the linear layers;
// this rank's tensor-parallel pieces, f32. ZeRO-3 sharded values are refused.
StatusOr<PyRef> megatron_state_dict(const GPTModel& model, int64_t num_local_experts, int64_t ep_rank);

// Megatron's input_and_logits payload of one forward (GPTModel::ForwardObserver's arguments):
// input_ids and position_ids [B, S] int64 (None on a last stage that is not also the first, as
// Megatron's get_batch leaves them), attention_mask None, decoder_input [S, B, H] or None, logits
// [S, B, V/TP].
PyRef input_and_logits_payload(const MicroBatch& mb, const Tensor& decoder_input, const Tensor& logits,
                               bool first_stage);

// Writes the start-up files of every chunk of `engine` and the optimizer, then installs each
// chunk's forward observer writing input_and_logits; `logger` must outlive the engine's forwards.
Status start_config_logger(const Arguments& a, const std::vector<std::string>& argv, Engine& engine,
                           ConfigLogger* logger);

}  // namespace gale
