// How n whole units (query groups, FFN columns, rows) are dealt out to the ranks of a tensor-parallel group.
//
// Megatron requires n to be divisible by the TP size p and gives every rank n/p units. MindSpeed's
// --unaligned-linear (UnalignedLinearFeature) lifts that: rank r holds n/p + 1 units when
// r < n mod p, else n/p, in rank order (25 heads over TP 4: 7, 6, 6, 6). When p divides n this is
// Megatron's even split, so one rule serves both.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/check.h"

namespace gale {

// Rank `rank`'s units: [offset, offset + count) of the n.
struct TpShare {
  int64_t offset = 0;
  int64_t count = 0;
};

inline TpShare tp_share(int64_t n, int64_t parts, int64_t rank) {
  GALE_CHECK(n >= 0 && parts >= 1 && rank >= 0 && rank < parts)
      << "tp_share(" << n << ", " << parts << ", " << rank << ")";
  const int64_t base = n / parts, extra = n % parts;
  return TpShare{rank * base + std::min(rank, extra), base + (rank < extra ? 1 : 0)};
}

}  // namespace gale
