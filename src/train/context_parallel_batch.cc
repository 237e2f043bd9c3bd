// Cutting a micro-batch to this cp rank's positions (train/context_parallel_batch.h).
#include "train/context_parallel_batch.h"

#include <algorithm>
#include <memory>

#include "core/log.h"
#include "model/context_parallel.h"
#include "parallel/context_split.h"

namespace gale {

Status keep_context_parallel_positions(const ParallelState& ps, int64_t S, int64_t window,
                                       AdaptiveCpPlanner* adaptive, MicroBatch* mb) {
  if (ps.cp_size() <= 1) return Status::Ok();
  GALE_ASSIGN_OR_RETURN(ContextSplit split, make_context_split(S, ps.cp_size(), ps.coords().cp));
  if (adaptive) {
    const CpMaskSpec mask{mb->B, S, mb->document_ids.empty() ? nullptr : mb->document_ids.data(), window};
    const int64_t before = adaptive->layouts_computed();
    const std::shared_ptr<const CpLayout> ring = adaptive->layout_for(mask);
    const int64_t ulysses = ps.cp_size() / adaptive->ring_size();
    split.layout = ulysses > 1 ? std::make_shared<const CpLayout>(hybrid_cp_layout(ring, ulysses)) : ring;
    if (before == 0 && adaptive->layouts_computed() == 1) {  // the first layout, against Megatron's split
      const CpLayout& l = *ring;
      const CpLayout megatron = load_balanced_cp_layout(mask, adaptive->ring_size());
      int64_t busiest = 0, megatron_busiest = 0;
      for (int64_t r = 0; r < l.cp_size; ++r) {
        busiest = std::max(busiest, l.nonempty_in_row(r));
        megatron_busiest = std::max(megatron_busiest, megatron.nonempty_in_row(r));
      }
      print_rank0(str_cat("adaptive cp: the first micro-batch's layout has ", l.nonempty_blocks(), " of ", l.cp_size * l.cp_size,
               " (query rank, key rank) blocks with visible pairs, at most ", busiest,
               " per rank (Megatron's split: ", megatron.nonempty_blocks(), ", at most ", megatron_busiest, ")"));
    }
  }
  *mb = slice_micro_batch(*mb, split);
  return Status::Ok();
}

}  // namespace gale
