// Newton-Schulz orthogonalisation (Muon): the GEMM version and a plain reference.
#include "kernels/cpu/newton_schulz.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/dtype.h"

namespace gale {

namespace {

void round_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_float(float_to_bf16(x[i]));
}

// X [m, n] = g or gᵀ, divided by its Frobenius norm (at least 1e-15); rounded to bf16 when asked.
// `transpose` < 0: transposed when rows > cols (so that m ≤ n); else as given. `sum` (sharded
// matrices) adds the other shards' sum of squares. Returns whether g was transposed.
bool load_normalised(const float* g, int64_t rows, int64_t cols, bool bf16, int transpose_mode, const NsAllReduce* sum,
                     std::vector<float>* x) {
  const bool transpose = transpose_mode < 0 ? rows > cols : transpose_mode > 0;
  x->resize(static_cast<size_t>(rows * cols));
  double sq = 0.0;
  for (int64_t i = 0; i < rows * cols; ++i) sq += static_cast<double>(g[i]) * g[i];
  if (sum) {
    float total = static_cast<float>(sq);
    (*sum)(&total, 1);
    sq = total;
  }
  const float norm = std::max(static_cast<float>(std::sqrt(sq)), 1e-15f);
  float* X = x->data();
  if (transpose) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) X[c * rows + r] = g[r * cols + c] / norm;
  } else {
    for (int64_t i = 0; i < rows * cols; ++i) X[i] = g[i] / norm;
  }
  if (bf16) round_bf16(X, rows * cols);
  return transpose;
}

void store(const std::vector<float>& x, bool transpose, int64_t rows, int64_t cols, float* out) {
  if (transpose) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = x[static_cast<size_t>(c * rows + r)];
  } else {
    std::copy(x.begin(), x.end(), out);
  }
}

// C[M, N] = alpha·A[M, K]·op(B) + beta·C with op(B) = B [K, N] or Bᵀ (B [N, K]); double sums.
void plain_gemm(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B, float beta,
                float* C) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(A[i * K + k]) * (trans_b ? B[j * K + k] : B[k * N + j]);
      C[i * N + j] = alpha * static_cast<float>(s) + (beta == 0.0f ? 0.0f : beta * C[i * N + j]);
    }
}

using GemmOp = void (*)(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B,
                        float beta, float* C, SgemmFn gemm);

void library_gemm(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B,
                  float beta, float* C, SgemmFn gemm) {
  gemm(false, trans_b, M, N, K, alpha, A, K, B, trans_b ? K : N, beta, C, N);
}

void reference_gemm(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B,
                    float beta, float* C, SgemmFn) {
  plain_gemm(trans_b, M, N, K, alpha, A, B, beta, C);
}

void iterate(GemmOp op, const float* g, float* out, int64_t rows, int64_t cols, int64_t steps,
             const NsCoefficients& coefficients, bool bf16, SgemmFn gemm, int transpose_mode = -1,
             const NsAllReduce* sum = nullptr) {
  GALE_CHECK(sum ? rows >= 0 && cols >= 0 : rows > 0 && cols > 0)
      << "newton_schulz: empty matrix " << rows << "x" << cols;
  GALE_CHECK(coefficients.fixed_steps == 0 || coefficients.fixed_steps == steps)
      << "newton_schulz: this coefficient set takes exactly " << coefficients.fixed_steps << " steps, not " << steps;
  std::vector<float> x;
  const bool transpose = load_normalised(g, rows, cols, bf16, transpose_mode, sum, &x);
  // X [m, n]: m the Gram matrix's side (whole on every rank), n this rank's part when sharded.
  const int64_t m = transpose ? cols : rows, n = transpose ? rows : cols;
  std::vector<float> a(static_cast<size_t>(m * m)), b(static_cast<size_t>(m * m)), next(x.size());
  for (int64_t s = 0; s < steps; ++s) {
    const auto& [ca, cb, cc] = coefficients.at(s);
    if (n > 0) {
      op(true, m, m, n, 1.0f, x.data(), x.data(), 0.0f, a.data(), gemm);  // A = X·Xᵀ
    } else {
      std::fill(a.begin(), a.end(), 0.0f);
    }
    if (bf16) round_bf16(a.data(), m * m);
    if (sum) {  // the shards' partial Gram matrices, summed (bf16: the sum rounded again)
      (*sum)(a.data(), m * m);
      if (bf16) round_bf16(a.data(), m * m);
    }
    if (n == 0) continue;
    next = x;
    if (cc != 0.0f) {
      b = a;
      op(false, m, m, m, cc, a.data(), a.data(), cb, b.data(), gemm);  // B = b·A + c·A·A
      if (bf16) round_bf16(b.data(), m * m);
      op(false, m, n, m, 1.0f, b.data(), x.data(), ca, next.data(), gemm);  // X = a·X + B·X
    } else {
      op(false, m, n, m, cb, a.data(), x.data(), ca, next.data(), gemm);  // X = a·X + b·A·X
    }
    if (bf16) round_bf16(next.data(), m * n);
    x.swap(next);
  }
  store(x, transpose, rows, cols, out);
}

}  // namespace

const std::array<float, 3>& NsCoefficients::at(int64_t i) const {
  const int64_t n = static_cast<int64_t>(sets.size());
  return sets[static_cast<size_t>(i < n ? i : (repeat_last ? n - 1 : i % n))];
}

std::optional<NsCoefficients> ns_coefficients(const std::string& type) {
  NsCoefficients c;
  if (type == "simple") {
    c.sets = {{3.4445f, -4.7750f, 2.0315f}};
  } else if (type == "quintic") {
    c.sets = {{4.0848f, -6.8946f, 2.9270f},
              {3.9505f, -6.3029f, 2.6377f},
              {3.7418f, -5.5913f, 2.3037f},
              {2.8769f, -3.1427f, 1.2046f},
              {2.8366f, -3.0525f, 1.2012f}};
  } else if (type == "polar_express") {
    c.sets = {{8.2051f, -22.9019f, 16.4607f}, {4.0664f, -2.8612f, 0.5184f}, {3.9096f, -2.8234f, 0.5250f},
              {3.2856f, -2.4153f, 0.4853f},   {2.2779f, -1.6198f, 0.3985f}, {1.8726f, -1.2307f, 0.3585f},
              {1.8564f, -1.2132f, 0.3568f},   {1.8750f, -1.2500f, 0.3750f}};
    c.repeat_last = true;
  } else if (type == "cans") {
    c.sets = {{8.4703f, -25.1081f, 18.6293f},
              {4.1828f, -3.1087f, 0.5806f},
              {3.9619f, -2.9541f, 0.5630f},
              {3.2866f, -2.4647f, 0.5074f},
              {2.2737f, -1.6447f, 0.4162f}};
    c.repeat_last = true;
  } else if (type == "aol") {
    c.sets = {{4.0098f, -7.0585f, 2.4635f},
              {3.4585f, -5.5479f, 2.5959f},
              {2.7573f, -3.2939f, 1.4254f},
              {2.7215f, -3.0494f, 1.3169f}};
  } else if (type == "deepseekv4") {
    c.sets.assign(8, {3.4445f, -4.7750f, 2.0315f});
    c.sets.push_back({2.0f, -1.5f, 0.5f});
    c.sets.push_back({2.0f, -1.5f, 0.5f});
    c.repeat_last = true;
  } else if (type == "cubic5") {
    c.sets = {{3.3656576f, -3.3420992f, 0.0f},
              {2.5744352f, -1.4957376f, 0.0f},
              {2.5368962f, -1.4312570f, 0.0f},
              {2.4418906f, -1.2764040f, 0.0f},
              {2.2230472f, -0.9630650f, 0.0f}};
    c.fixed_steps = 5;
  } else {
    return std::nullopt;
  }
  return c;
}

std::string ns_coefficient_type_list() { return "simple, quintic, polar_express, cans, aol, deepseekv4, cubic5"; }

void newton_schulz(const float* g, float* out, int64_t rows, int64_t cols, int64_t steps,
                   const NsCoefficients& coefficients, bool bf16, SgemmFn gemm) {
  iterate(library_gemm, g, out, rows, cols, steps, coefficients, bf16, gemm);
}

void newton_schulz_sharded(const float* g, float* out, int64_t rows, int64_t cols, int split_dim, int64_t steps,
                           const NsCoefficients& coefficients, bool bf16, const NsAllReduce& sum, SgemmFn gemm) {
  GALE_CHECK(split_dim == 0 || split_dim == 1) << "newton_schulz_sharded: split_dim " << split_dim;
  iterate(library_gemm, g, out, rows, cols, steps, coefficients, bf16, gemm, split_dim == 0 ? 1 : 0, &sum);
}

void newton_schulz_ref(const float* g, float* out, int64_t rows, int64_t cols, int64_t steps,
                       const NsCoefficients& coefficients, bool bf16) {
  iterate(reference_gemm, g, out, rows, cols, steps, coefficients, bf16, nullptr);
}

std::optional<double> muon_scale_factor(int64_t size_out, int64_t size_in, const std::string& mode) {
  const double out = static_cast<double>(size_out), in = static_cast<double>(size_in);
  if (mode == "spectral") return std::sqrt(std::max(out, in));
  if (mode == "unit_rms_norm") return std::sqrt(out / in);
  if (mode == "shape_scaling") return std::sqrt(std::max(1.0, out / in));
  return std::nullopt;
}

}  // namespace gale
