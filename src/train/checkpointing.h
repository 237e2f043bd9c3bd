// Saving and loading training checkpoints: model parameters, optimizer state, scheduler and
// trainer state, in Megatron's directory layout (iter_XXXXXXX/, latest_checkpointed_iteration.txt)
// with Gale's sharded safetensors format (docs/formats/checkpoint.md).
//
// Every tensor is stored by its global (unsharded) name and shape, each rank writing the pieces it
// owns, so a checkpoint loads at any tensor/pipeline/data-parallel layout.
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
// `*loaded` is false when there is no checkpoint to load (a warning is printed, as Megatron does)
// unless --exit-on-missing-checkpoint makes that an error.
Status load_checkpoint(const Arguments& args, Engine& engine, TrainerState& state, bool* loaded);

}  // namespace gale
