// --data-parallel-random-init: per-rank initialisation seeds and the broadcast from rank 0.
#include "train/data_parallel_random_init.h"

#include <vector>

namespace gale {

uint64_t data_parallel_init_seed(uint64_t seed, int64_t dp_rank) { return seed + 10 * static_cast<uint64_t>(dp_rank); }

void broadcast_params_from_data_parallel_rank0(ParamBuffer& params, const Comm& dense, const Comm& expert) {
  std::vector<float> values;
  for (int id = 0; id < params.size(); ++id) {
    const ParamSpec& s = params.spec(id);
    const Comm& group = s.expert_parallel ? expert : dense;
    if (!group || group->size() == 1) continue;
    values.resize(static_cast<size_t>(s.local_numel()));
    params.read_values(s.offset, s.local_numel(), values.data());
    group->broadcast(values.data(), s.local_numel(), DType::kF32, 0);
    params.write_values(s.offset, s.local_numel(), values.data());
  }
}

}  // namespace gale
