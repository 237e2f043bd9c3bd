// Megatron's torch_dist and torch_dcp checkpoint directories as the state dict of one torch-format rank file.
//
//   GALE_ASSIGN_OR_RETURN(MegatronDistState s, read_megatron_dist_state(iter_dir, CheckpointFormat::kMegatronTorchDist));
//   s.root->get("args"), s.root->get("iteration"), s.root->get("model")   // {name: global tensor}
//
// torch_dist (--ckpt-format torch_dist, Megatron's default; docs/formats/megatron-checkpoint.md):
// `common.pt` (a torch.save of the state dict's non-sharded part: args, checkpoint_version,
// iteration, ...) and a PyTorch Distributed Checkpoint (.metadata + __R_I.distcp, ckpt/dcp_reader.h)
// of Megatron's sharded state dict, whose tensors are global whatever TP/PP saved them: the layers
// stacked along a leading dimension of num_layers (`decoder.layers.self_attention.linear_qkv.weight`
// of shape [L, ...]) or, for non-homogeneous models, one key per global layer
// (`decoder.layers.7.mlp...`); SwiGLU's fc1 is [all gate rows; all up rows] and the fused QKV is
// Megatron-Core's [q heads; k; v] per query group, as the torch reader's merged tensors.
// torch_dcp (--ckpt-format torch_dcp): a plain DCP of generate_state_dict's dict: objects `args`,
// `iteration`, `checkpoint_version`, tensors `model.<name>` with global layer numbers; read only when
// saved at TP 1 x PP 1 (local tensors of several ranks share a key there and only one copy is kept).
// The result has the shape of a torch-format rank file: {'args', 'checkpoint_version', 'iteration',
// 'num_floating_point_operations_so_far', 'model': {torch-format name with the global layer number:
// tensor}}; `_extra_state` objects, optimizer, RNG and rerun-state entries are left out of it. With
// `with_optimizer`, torch_dist: `optimizer` holds Megatron's optimizer state
// (train/megatron_dist_optimizer.h), its tensors named as 'model's are; torch_dcp: the root gets the plain
// 'optimizer' and 'opt_param_scheduler' state dicts (train/megatron_dcp_optimizer.h), read as a torch-format rank
// file's by train/megatron_torch_optimizer.h. Errors name
// the directory and key: a missing common.pt or .distcp file, a stacked tensor whose leading
// dimension is not num_layers, an unsupported dtype, a torch_dcp saved at TP/PP > 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/pickle.h"
#include "core/status.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_dist_optimizer.h"

namespace gale {

struct MegatronDistState {
  PyRef root;                     // as a torch-format rank file's dict
  std::string where;  // the file holding args (common.pt, or .metadata for torch_dcp)
  std::optional<MegatronOptimizerState> optimizer;  // with_optimizer: tensors by torch-format name
};

StatusOr<MegatronDistState> read_megatron_dist_state(const std::string& dir, CheckpointFormat format,
                                                     bool with_optimizer = false);

// Slice `i` of a tensor stacked along dim 0 (a copy): torch_dist's stacked layers and experts.
Tensor slice0(const Tensor& t, int64_t i);

// The args Namespace of the torch_dist / torch_dcp checkpoint in iteration directory `dir` (`where` names its file).
StatusOr<PyRef> read_megatron_dist_args(const std::string& dir, CheckpointFormat format, std::string* where);

}  // namespace gale
