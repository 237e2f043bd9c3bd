// The packed-scan tests' shared setup: documents packed into rows, their starts, and each document's rows alone.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/document_starts.h"
#include "testing.h"

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

// A mixer's packed forward and backward against each document run alone (rows of its own, no
// starts): outputs and input gradients within `tol`, the parameter gradients (summed over the
// documents) within grad_tol·(1 + |g|). MixerT has forward(u, S, B, Saved*, starts), grads() (one
// vector per parameter of w.all()), pb and w; backward(saved, r, S, B) returns the input's gradient.
template <class Saved, class MixerT, class Backward>
void expect_packed_as_documents_alone(MixerT& m, const PackedRows& rows, double tol, double grad_tol,
                                      Backward backward) {
  const int64_t S = rows.S, B = rows.B, H = m.c.hidden;
  Tensor u = Tensor::empty({S * B, H}), r = Tensor::empty({S * B, H});
  fill_random(u.data<float>(), u.numel(), 5);
  fill_random(r.data<float>(), r.numel(), 6);
  m.pb.zero_grads();
  Saved saved;
  const Tensor out = m.forward(u, S, B, &saved, rows.starts());
  const Tensor du = backward(saved, r, S, B);
  const std::vector<std::vector<float>> packed_grads = m.grads();
  m.pb.zero_grads();
  for (int64_t b = 0; b < B; ++b) {
    int64_t s0 = 0;
    for (int64_t n : rows.lengths[b]) {
      Saved sd;
      const Tensor od = m.forward(PackedRows::take(u, B, b, s0, n), n, 1, &sd, {});
      const Tensor dud = backward(sd, PackedRows::take(r, B, b, s0, n), n, 1);
      const Tensor po = PackedRows::take(out, B, b, s0, n), pdu = PackedRows::take(du, B, b, s0, n);
      for (int64_t i = 0; i < od.numel(); ++i) {
        ASSERT_NEAR(po.data<float>()[i], od.data<float>()[i], tol) << "out: row " << b << " document at " << s0;
        ASSERT_NEAR(pdu.data<float>()[i], dud.data<float>()[i], tol) << "d u: row " << b << " document at " << s0;
      }
      s0 += n;
    }
  }
  const std::vector<std::vector<float>> alone = m.grads();  // summed over the documents
  for (size_t p = 0; p < alone.size(); ++p)
    for (size_t i = 0; i < alone[p].size(); ++i)
      ASSERT_NEAR(packed_grads[p][i], alone[p][i], grad_tol * (1.0 + std::fabs(alone[p][i])))
          << m.pb.spec(m.w.all()[p]).name << " [" << i << "]";
}

}  // namespace gale::testing
