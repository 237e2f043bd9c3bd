// Saving and loading training checkpoints: model parameters, optimizer state, scheduler and
// trainer state, in Megatron's directory layout (iter_XXXXXXX/, latest_checkpointed_iteration.txt)
// with Gale's sharded safetensors format (docs/formats/checkpoint.md).
//
// Every tensor is stored by its global (unsharded) name and shape, each rank writing the pieces it
// owns, so a checkpoint loads at any tensor/pipeline/data-parallel layout.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "model/gpt_model.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "train/arguments.h"
#include "train/trainer.h"

namespace gale {

// What this rank holds and how it relates to the other ranks (decides who writes which piece).
struct CheckpointContext {
  Comm world;           // all ranks that write/read the checkpoint
  int64_t dp_rank = 0;  // only data-parallel rank 0 writes model and (non-distributed) optimizer state
};

// Writes <args.checkpoint.save>/iter_<iteration>/ and updates the tracker (collective).
Status save_checkpoint(const Arguments& args, const CheckpointContext& ctx, const GPTModel& model,
                       const Optimizer& optimizer, const LrScheduler& scheduler, const TrainerState& state);

// Loads <args.checkpoint.load> into the model (and, unless --finetune / --no-load-optim, the
// optimizer, scheduler and trainer state). Returns false in `*loaded` when there is no checkpoint
// to load (a warning is printed, as Megatron does) unless --exit-on-missing-checkpoint.
Status load_checkpoint(const Arguments& args, const CheckpointContext& ctx, GPTModel& model, Optimizer& optimizer,
                       LrScheduler& scheduler, TrainerState& state, bool* loaded);

}  // namespace gale
