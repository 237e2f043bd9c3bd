// The size flags of Gated DeltaNet layers on their own, for gale generate / evaluate (train/arguments_gdn.cc).
#pragma once

#include "train/arg_parser.h"
#include "train/arguments.h"

namespace gale {

// The five size flags of add_gdn_args (--linear-conv-kernel-dim, --linear-{key,value}-head-dim,
// --linear-num-{key,value}-heads), without --linear-attention-freq: the inference commands' flags
// for a hybrid model's 'G' layers (checked by validate_gdn_args).
void add_gdn_size_args(ArgParser& p, ModelArgs& a);

}  // namespace gale
