// The packed-scan tests' shared setup: documents packed into rows, their starts, and each document's rows alone.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/document_starts.h"

namespace gale::testing {

// Documents packed into B rows of S positions: lengths[b] lists row b's documents in order (they
// fill the row). Ids [B, S] sample-major, as MicroBatch::document_ids.
struct PackedRows {
  int64_t B = 0, S = 0;
  std::vector<std::vector<int64_t>> lengths;
  std::vector<int32_t> ids;
  explicit PackedRows(std::vector<std::vector<int64_t>> l) : lengths(std::move(l)) {
    B = static_cast<int64_t>(lengths.size());
    for (int64_t n : lengths[0]) S += n;
    ids.resize(static_cast<size_t>(B * S));
    for (int64_t b = 0; b < B; ++b) {
      int64_t s = 0;
      for (size_t doc = 0; doc < lengths[b].size(); ++doc)
        for (int64_t i = 0; i < lengths[b][doc]; ++i) ids[static_cast<size_t>(b * S + s++)] = static_cast<int32_t>(doc);
    }
  }
  std::vector<int32_t> starts() const { return document_starts(ids.data(), B, S); }
  // Rows [S·B, cols] (t = s·B + b): the document of row b starting at s0, length n, as its own [n, cols].
  static Tensor take(const Tensor& x, int64_t B, int64_t b, int64_t s0, int64_t n) {
    const int64_t cols = x.size(1);
    Tensor out = Tensor::empty({n, cols});
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < cols; ++c) out.data<float>()[i * cols + c] = x.data<float>()[((s0 + i) * B + b) * cols + c];
    return out;
  }
};

}  // namespace gale::testing
