// --fake-process-group (Megatron main): the flag, Megatron's checks and forced settings, and what a
// fake run (one process playing rank $RANK of $WORLD_SIZE, comm/fake_communicator.h) refuses.
#pragma once

#include "core/status.h"
#include "train/arg_parser.h"
#include "train/arguments.h"

namespace gale {

struct FakeProcessGroupArgs {
  bool fake_process_group = false;  // Megatron's default
};

// Added by `gale pretrain` after add_all_pretrain_args.
void add_fake_process_group_args(ArgParser& p, FakeProcessGroupArgs& a);

// Run before validate_all_pretrain_args (so that Megatron's own refusal of the flex dispatcher is
// the one a user sees): Megatron's check and its forced --no-check-for-nan-in-loss-and-grad (with
// its start-up warning), then Gale's refusals (--save, --load, --dist-train, --automated-pipeline,
// --use-multiparameter-pipeline-model-parallel, --auto-settings, --auto-parallel), each a one-line
// error naming the flag.
Status validate_fake_process_group(const FakeProcessGroupArgs& f, Arguments& a, const ArgParser& p);

}  // namespace gale
