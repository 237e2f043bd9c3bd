// Megatron's torch_dcp checkpoints: DCP's flattened keys of the plain optimizer state dict rebuilt as nested values.
//
//   GALE_ASSIGN_OR_RETURN(DcpCheckpoint c, DcpCheckpoint::open(iter_dir));
//   GALE_ASSIGN_OR_RETURN(PyRef opt, megatron_dcp_unflatten(c, "optimizer", iter_dir));
//   opt->get("optimizer")->get("state")   // {0: {'exp_avg', 'exp_avg_sq', 'step'}, ...}, as torch.save kept it
//
// Megatron's save_checkpoint with --ckpt-format torch_dcp (megatron/training/checkpointing.py) saves
// generate_state_dict's dict with torch.distributed.checkpoint.save, and for that format the dict holds the plain
// optimizer.state_dict() and opt_param_scheduler.state_dict() (not torch_dist's sharded state dict). DCP's planner
// flattens nested dicts and lists that hold tensors into dotted keys (str of each dict key, each list index):
// `optimizer.state.0.exp_avg`, `optimizer.optimizer.param_groups.1.wd_mult`, `optimizer.fp32_from_fp16_params.0.3`;
// tensors stay tensors, every other leaf (a param group's 'params' list, 'betas', the scheduler's numbers) is a
// torch.save'd object. The flattening loses whether a level was a dict with int keys or a list; it is rebuilt by
// the layout of Megatron's non-distributed optimizers (train/megatron_torch_optimizer.h): a level whose children
// are all numbers is torch's {param index: state} dict under a key 'state', and a list everywhere else
// (param_groups, fp32_from_fp16_params and its per-group lists), whose indices must run 0..n-1.
// Megatron allows torch_dcp only with --use-torch-fsdp2 at TP 1 x PP 1, which forbids the distributed optimizer, so
// a torch_dcp checkpoint whose args record use_distributed_optimizer is refused.
#pragma once

#include <string>

#include "ckpt/dcp_reader.h"
#include "ckpt/pickle.h"
#include "core/status.h"

namespace gale {

// The value saved under `prefix` ("optimizer", "opt_param_scheduler"): the nested dict of every tensor and object
// key `prefix.<...>` of `c`; null when there is none. DataLoss names `dir` and the key when a list's indices do not
// run 0..n-1 or a key is both a leaf and a level.
StatusOr<PyRef> megatron_dcp_unflatten(const DcpCheckpoint& c, const std::string& prefix, const std::string& dir);

// Sets `root`'s 'optimizer' and 'opt_param_scheduler' (a torch-format rank file's dict holding the checkpoint's
// 'args') from the torch_dcp checkpoint `c` in `dir`, each when saved, for read_megatron_torch_optimizer; refused
// (Unimplemented, naming --no-load-optim) when the args record use_distributed_optimizer.
Status add_megatron_dcp_optimizer(const DcpCheckpoint& c, const std::string& dir, PyValue& root);

}  // namespace gale
