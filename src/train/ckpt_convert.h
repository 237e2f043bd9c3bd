// Megatron's checkpoint conversion in `gale pretrain` (--ckpt-convert-format, --ckpt-convert-save).
#pragma once

#include <string>

#include "comm/communicator.h"
#include "core/status.h"
#include "train/arguments.h"

namespace gale {

// As Megatron's setup_model_and_optimizer does with --ckpt-convert-format: the checkpoint in --load
// (Gale's format, its latest iteration) is written again in Megatron's legacy torch format to
// --ckpt-convert-save/torch at this run's tensor x pipeline parallel sizes (model weights, iteration
// and consumed samples, Megatron's args; no optimizer or RNG state: Megatron loads it with
// --finetune or --no-load-optim --no-load-rng), and the run ends. Rank 0 converts; every rank
// returns its status, and on success `*line` is Megatron's "> converted checkpoint: gale -> torch."
// A --load that already holds a Megatron checkpoint is refused (convert it with `gale convert`).
Status convert_checkpoint_for_megatron(const Arguments& args, const Comm& world, std::string* line);

}  // namespace gale
