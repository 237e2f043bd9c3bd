// Saving and loading training checkpoints: model parameters, optimizer state, scheduler and
// trainer state, in Megatron's directory layout (iter_XXXXXXX/, latest_checkpointed_iteration.txt)
// with Gale's sharded safetensors format (docs/formats/checkpoint.md).
//
// Every tensor is stored by its global (unsharded) name and shape, each rank writing the pieces it
// owns, so a checkpoint loads at any tensor/pipeline/data-parallel layout. Optimizer state too:
// "optimizer.<state>.<param name>" with the parameter's global shape; with the distributed
// optimizer every data-parallel rank writes the boxes its shards cover (optim/shard_boxes.h), and
// a rank of any layout, sharded or not, reads back the boxes it owns.
#pragma once

#include <string>

#include "train/arguments.h"
#include "train/engine.h"
#include "train/trainer.h"

namespace gale {

// Writes <args.checkpoint.save>/iter_<iteration>/ and updates the tracker (collective over the
// world: every rank writes the pieces it owns; data-parallel replicas write nothing twice).
Status save_checkpoint(const Arguments& args, const Engine& engine, const TrainerState& state);

// Loads <args.checkpoint.load> into the engine's model chunks (and, unless --finetune /
// --no-load-optim, the optimizer, scheduler and trainer state), at whatever layout it was saved.
// With LoRA (--lora-target-modules) --load gives only the frozen base weights, and --lora-load (if
// set) the adapters with, unless --no-load-optim, their optimizer and scheduler state, and the
// trainer state (iteration, consumed samples): an exact resume. save_checkpoint then writes only
// the adapters (and their optimizer state).
// `*loaded` is false when there is no checkpoint to load (a warning is printed, as Megatron does)
// unless --exit-on-missing-checkpoint makes that an error.
Status load_checkpoint(const Arguments& args, Engine& engine, TrainerState& state, bool* loaded);

}  // namespace gale
