// Causal depthwise conv1d over strided rows: the reference loops, parallel over rows (forward) and channels (backward).
#include "model/causal_conv1d.h"

#include <algorithm>
#include <utility>

#include "core/check.h"
#include "core/threads.h"

namespace gale {

void causal_conv1d_forward(const float* x, int64_t x_stride, const float* w, const float* bias, float* y, int64_t C,
                           int64_t K, int64_t S, int64_t B) {
  std::vector<ConvSequence> seqs(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) seqs[static_cast<size_t>(b)] = ConvSequence{b, B, S, nullptr};
  causal_conv1d_forward_sequences(x, x_stride, w, bias, y, C, K, seqs);
}

void causal_conv1d_forward_sequences(const float* x, int64_t x_stride, const float* w, const float* bias, float* y,
                                     int64_t C, int64_t K, const std::vector<ConvSequence>& seqs,
                                     const int32_t* starts) {
  std::vector<std::pair<int64_t, int64_t>> rows;  // (sequence, position) of each output row, in row order
  for (size_t i = 0; i < seqs.size(); ++i)
    for (int64_t s = 0; s < seqs[i].length; ++s) rows.emplace_back(static_cast<int64_t>(i), s);
  parallel_for(static_cast<int64_t>(rows.size()), 64, [&](int64_t b0, int64_t e0) {
    for (int64_t r = b0; r < e0; ++r) {
      const ConvSequence& q = seqs[static_cast<size_t>(rows[static_cast<size_t>(r)].first)];
      const int64_t s = rows[static_cast<size_t>(r)].second;
      float* out = y + (q.first + s * q.stride) * C;
      const int64_t first = starts ? starts[q.first + s * q.stride] : 0;  // the document's first position
      for (int64_t c = 0; c < C; ++c) out[c] = bias ? bias[c] : 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t s2 = s - K + 1 + k;
        if (starts && s2 < first) continue;  // before the packed document: zero (no decoding state there)
        const float* in = s2 >= 0  ? x + (q.first + s2 * q.stride) * x_stride
                          : q.state ? q.state + (K - 1 + s2) * C
                                    : nullptr;
        if (!in) continue;
        for (int64_t c = 0; c < C; ++c) out[c] += w[c * K + k] * in[c];
      }
    }
  });
  // Each state ← its sequence's last K−1 inputs (some still from the old state when length < K−1).
  std::vector<float> next(static_cast<size_t>(std::max<int64_t>(K - 1, 0) * C));
  for (const ConvSequence& q : seqs) {
    // The state after positions 0 .. n − 1, for every n (before the old state is replaced).
    for (int64_t n = 1; q.steps && n <= q.length; ++n) {
      float* dst = q.steps + (n - 1) * std::max<int64_t>(K - 1, 1) * C;
      for (int64_t j = 0; j < K - 1; ++j) {
        const int64_t pos = n - (K - 1) + j;
        if (pos >= 0)
          std::copy_n(x + (q.first + pos * q.stride) * x_stride, C, dst + j * C);
        else if (q.state)
          std::copy_n(q.state + (n + j) * C, C, dst + j * C);
        else
          std::fill_n(dst + j * C, C, 0.0f);
      }
    }
    if (!q.state) continue;
    for (int64_t j = 0; j < K - 1; ++j) {
      const int64_t pos = q.length - (K - 1) + j;  // < 0: in the old state, at its row length + j
      const float* src = pos >= 0 ? x + (q.first + pos * q.stride) * x_stride : q.state + (q.length + j) * C;
      std::copy_n(src, C, next.data() + j * C);
    }
    std::copy(next.begin(), next.end(), q.state);
  }
}

void check_conv_sequences(const std::vector<ConvSequence>& seqs, int64_t T, const char* who) {
  std::vector<char> taken(static_cast<size_t>(T), 0);
  for (size_t i = 0; i < seqs.size(); ++i)
    for (int64_t s = 0; s < seqs[i].length; ++s) {
      const int64_t t = seqs[i].first + s * seqs[i].stride;
      GALE_CHECK(t >= 0 && t < T && !taken[static_cast<size_t>(t)])
          << who << ": sequence " << i << " row " << t << " outside the " << T << " rows or taken twice";
      taken[static_cast<size_t>(t)] = 1;
    }
  for (int64_t t = 0; t < T; ++t)
    GALE_CHECK(taken[static_cast<size_t>(t)]) << who << ": row " << t << " in no sequence";
}

void causal_conv1d_backward(const float* dy, const float* x, int64_t x_stride, const float* w, float* dx,
                            int64_t dx_stride, float* dw, float* db, int64_t C, int64_t K, int64_t S, int64_t B,
                            const int32_t* starts) {
  parallel_for(C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s) {
          const float g = dy[(s * B + b) * C + c];
          if (db) db[c] += g;
          const int64_t first = starts ? starts[s * B + b] : 0;
          for (int64_t k = 0; k < K; ++k) {
            const int64_t s2 = s - K + 1 + k;
            if (s2 < first) continue;
            const int64_t t2 = s2 * B + b;
            if (dw) dw[c * K + k] += g * x[t2 * x_stride + c];
            dx[t2 * dx_stride + c] += w[c * K + k] * g;
          }
        }
  });
}

}  // namespace gale
