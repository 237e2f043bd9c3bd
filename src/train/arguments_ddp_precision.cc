// Megatron's DDP precision flags and --create-all-gather-group (features/feature_ddp_precision.cc
// validates them; train/ddp_precision.h says what the engine makes of them).
#include "train/arguments.h"

namespace gale {

void add_ddp_precision_args(ArgParser& p, ParallelArgs& a) {
  p.group("distributed data parallel precision");
  p.add_flag("--ddp-reduce-scatter-with-fp32-accumulation", &a.ddp_reduce_scatter_with_fp32_accumulation,
             "Megatron: with the distributed optimizer, reduce-scatter the gradients as an all-to-all of the buffer's "
             "(bf16 with --grad-reduce-in-bf16) values followed by a local fp32 sum in rank order, rounded once; "
             "turned off with a warning when the gradients already accumulate and reduce in fp32");
  p.add_list("--ddp-param-name-patterns-for-fp32-local-accumulation",
             &a.ddp_param_name_patterns_for_fp32_local_accumulation,
             "Megatron: parameter-name patterns (Python fnmatch: * ? [seq] [!seq]; 'all' matches every parameter) "
             "whose gradients accumulate across micro-batches in fp32 even with bf16 gradient reduction; not when "
             "the gradients already accumulate in fp32",
             1);
  p.add_flag("--create-all-gather-group", &a.create_all_gather_group,
             "Megatron: a separate communicator over the data-parallel ranks (and the expert-data-parallel ones) for "
             "the distributed optimizer's parameter all-gathers, so they can overlap the gradient reduce-scatters");
}

}  // namespace gale
