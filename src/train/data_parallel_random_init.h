// Megatron's --data-parallel-random-init: a different initialisation seed per data-parallel rank,
// then data-parallel rank 0's values on every rank (DDP's broadcast_params), as pretrain_gpt.py does.
//
// Megatron core_v0.12.1 seeds every RNG with seed + 100·(pipeline rank) + 10·(data-parallel rank)
// (_set_random_seed), builds the model, and, once the model is wrapped in DistributedDataParallel,
// broadcasts every parameter from rank 0 of its data-parallel group (the data×context group;
// expert parameters over the expert-data group). So the ranks draw different values, and training
// starts from data-parallel rank 0's, which are the values drawn without the flag. Gale's
// initialisation is a function of (seed, parameter name, global index) with no pipeline offset
// (the same values for any layout), so only the data-parallel term applies; its dropout masks are
// keyed by global token ids, not by a per-rank generator, and do not change either.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "model/params.h"

namespace gale {

// The initialisation seed of data-parallel rank `dp_rank`: seed + 10·dp_rank.
uint64_t data_parallel_init_seed(uint64_t seed, int64_t dp_rank);

// Every parameter (and buffer) of `params` takes the values of rank 0 of its group: `dense` (the
// data×context group) for dense parameters, `expert` (the expert-data group) for expert-parallel
// ones. Collective over both groups; call before any sharding of the values.
void broadcast_params_from_data_parallel_rank0(ParamBuffer& params, const Comm& dense, const Comm& expert);

}  // namespace gale
