// ContextSplit: the load-balanced chunk assignment of context parallelism.
#include "parallel/context_split.h"

#include "core/check.h"

namespace gale {

int64_t ContextSplit::global_position(int64_t s, int64_t rank) const {
  if (layout) {
    GALE_CHECK(s >= 0 && s < layout->local_length() && rank >= 0 && rank < layout->cp_size)
        << "local position " << s << " of cp rank " << rank << " outside the layout";
    return layout->position(rank, s);
  }
  const int64_t C = chunk_length();
  GALE_CHECK(s >= 0 && s < 2 * C) << "local position " << s << " outside the " << 2 * C << " a cp rank holds";
  return s < C ? rank * C + s : (2 * cp_size - 1 - rank) * C + (s - C);
}

std::vector<int32_t> ContextSplit::local_positions() const {
  std::vector<int32_t> out(static_cast<size_t>(local_length()));
  for (int64_t s = 0; s < local_length(); ++s) out[static_cast<size_t>(s)] = static_cast<int32_t>(global_position(s));
  return out;
}

StatusOr<ContextSplit> make_context_split(int64_t seq_length, int64_t cp_size, int64_t cp_rank) {
  if (cp_size < 1) return InvalidArgument("--context-parallel-size: expected a positive integer, found ", cp_size);
  if (cp_rank < 0 || cp_rank >= cp_size)
    return InvalidArgument("context-parallel rank ", cp_rank, " outside [0, ", cp_size, ")");
  if (cp_size > 1 && seq_length % (2 * cp_size) != 0)
    return InvalidArgument("--seq-length ", seq_length, " must be divisible by 2 x --context-parallel-size ", cp_size,
                           " = ", 2 * cp_size, " (each sequence is cut into 2·CP equal chunks)");
  return ContextSplit{seq_length, cp_size, cp_rank, {}};
}

}  // namespace gale
