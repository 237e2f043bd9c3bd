// A model chunk's parameters and per-parameter optimizer state as checkpoint pieces, at any TP layout.
//
// Each ParamSpec says how this rank's local tensor maps into the global one (model/params.h): a
// tensor-parallel shard is `split_blocks` boxes of the global tensor (one for an ordinary
// column/row-parallel weight, two for SwiGLU's [gate; up] fc1, five of unequal sizes for a Mamba
// mixer's [z | x | B | C | dt] in_proj). Saving adds those boxes under the
// parameter's global name; loading reads the same boxes back from whatever pieces were saved, so
// a checkpoint written at TP2·PP2 loads at TP1·PP4 (docs/formats/checkpoint.md).
//
// Training-loop use (every rank, then one collective commit):
//   CheckpointWriter w(args.save, iteration, *world);
//   GALE_RETURN_IF_ERROR(add_parameters(w, model.params()));
//   for (auto& [state, flat] : optimizer.state()) GALE_RETURN_IF_ERROR(add_parameter_state(w, model.params(), state,
//   flat)); GALE_RETURN_IF_ERROR(w.commit(sections));
// and on --load:
//   GALE_ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::open(args.load));
//   GALE_RETURN_IF_ERROR(load_parameters(r, model.params()));
//   for (auto& [state, flat] : optimizer.state()) GALE_RETURN_IF_ERROR(load_parameter_state(r, model.params(), state,
//   flat));
#pragma once

#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "ckpt/tensor_box.h"
#include "model/params.h"

namespace gale {

// One box of a parameter's local shard: where it sits in the global tensor and in the local one.
struct ShardBox {
  Box global;  // coordinates in the global tensor
  Box local;   // the same elements' coordinates in the local tensor (same shape)
};
// The boxes that make up this rank's local shard of `spec` (one per split block; one box for a
// replicated parameter).
std::vector<ShardBox> shard_boxes(const ParamSpec& spec);

// Checkpoint name of per-parameter optimizer state: "optimizer.<state>.<parameter name>".
std::string optimizer_state_name(const std::string& state, const std::string& param_name);

// Adds every parameter's local shard to `w`. Parameters replicated over TP (split_dim < 0) are
// added only by TP rank 0 (split_rank == 0), so each element is written once per model replica;
// callers with data parallelism add from one data-parallel rank only. The data is referenced
// until w.commit().
Status add_parameters(CheckpointWriter& w, const ParamBuffer& params);
// Adds one flat per-parameter state buffer (same offsets as `params`, e.g. Optimizer::state()'s
// "exp_avg") under optimizer_state_name(state, name), with the parameters' boxes.
Status add_parameter_state(CheckpointWriter& w, const ParamBuffer& params, const std::string& state,
                           const Tensor& flat);

// Reads every parameter's local shard from `r` into `params`; errors name the tensor (missing,
// saved with another global shape, partly saved) and the checkpoint.
// `use_ema`: each parameter is read from its EMA, ema_weight_name(r, name), instead.
// --fp8-recipe delayed's state buffers (ParamSpec::fp8_state_buffer) absent from the checkpoint
// keep their initial values (a run saved without FP8 loads into an FP8 run).
Status load_parameters(const CheckpointReader& r, ParamBuffer& params, bool use_ema = false);

// --use-ema: the tensor a weight `name` is read from: the parameter EMA that --optimizer-selection
// fused_ema_adamw saves, optimizer_state_name("ema_params", name), when the checkpoint has it, else
// `name` itself (buffers without a gradient, e.g. the MoE router's expert bias, have no EMA).
std::string ema_weight_name(const CheckpointReader& r, const std::string& name);
// --use-ema: Ok when the checkpoint holds the parameter EMA (its "optimizer" section records
// ema_decay), else FailedPrecondition naming `flag`, the directory and how it should have been saved.
Status check_checkpoint_has_ema(const CheckpointReader& r, const std::string& flag);
// Reads one flat per-parameter state buffer saved by add_parameter_state.
Status load_parameter_state(const CheckpointReader& r, const ParamBuffer& params, const std::string& state,
                            Tensor& flat);

}  // namespace gale
