// The Mamba mixer over packed sequences (document starts): each document's outputs and gradients are
// those of the document run alone, finite-difference gradients of the packed scan, and the stored
// chunk states (--mamba-training-ssm-states-dtype) restarting with the documents.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/gemm.h"
#include "mamba_test_mixer.h"
#include "model/mamba_mixer.h"
#include "packed_scan_test_util.h"
#include "testing.h"

namespace gale {
namespace {

struct Mixer : testing::MambaTestMixer {
  explicit Mixer(const ModelConfig& config) : MambaTestMixer(config) {
    // Away from the initial values' symmetries, Δ ≈ 1 and A ≈ −0.5 so that the state carries over
    // several positions (as the unpacked gradient check).
    for (int id : w.all()) {
      std::vector<float> v(static_cast<size_t>(pb.spec(id).local_numel()));
      testing::fill_random(v.data(), static_cast<int64_t>(v.size()), 100 + static_cast<uint64_t>(id), 0.5f);
      const float* cur = pb.param_data(id);
      for (size_t i = 0; i < v.size(); ++i) v[i] += cur[i];
      pb.set_param_values(id, v.data());
    }
    std::vector<float> a(static_cast<size_t>(d.NH)), dt(static_cast<size_t>(d.NH));
    testing::fill_random(a.data(), d.NH, 77, 0.3f);
    testing::fill_random(dt.data(), d.NH, 78, 0.3f);
    for (float& v : a) v -= 0.7f;
    for (float& v : dt) v += 0.5f;
    pb.set_param_values(w.a_log, a.data());
    pb.set_param_values(w.dt_bias, dt.data());
  }
  DType states = DType::kF32;
  int64_t chunk = 128;
  MambaMixerWeights weights() {
    MambaMixerWeights m = mamba_mixer_weights(pb, w, sgemm, gemm_bf16);
    m.ssm_states = states;
    m.chunk = chunk;
    return m;
  }
  Tensor forward(const Tensor& u, int64_t S, int64_t B, MambaMixerSaved* saved, const std::vector<int32_t>& starts) {
    return mamba_mixer_forward(d, weights(), u, S, B, DType::kF32, saved, starts);
  }
  std::vector<std::vector<float>> grads() const {
    std::vector<std::vector<float>> g;
    for (int id : w.all()) g.emplace_back(pb.grad_data(id), pb.grad_data(id) + pb.spec(id).local_numel());
    return g;
  }
};

// Packed forward and backward against each document alone (rows of its own, no starts).
void expect_documents_alone(Mixer& m, const testing::PackedRows& rows, double tol) {
  testing::expect_packed_as_documents_alone<MambaMixerSaved>(
      m, rows, tol, tol, [&](MambaMixerSaved& saved, const Tensor& r, int64_t S, int64_t B) {
        return mamba_mixer_backward(m.d, m.weights(), saved, r, S, B);
      });
}

// Documents shorter than the convolution's window (K = 4) and of one position.
TEST(MambaMixerPacked, EachDocumentIsItsOwnSequence) {
  Mixer m(testing::mamba_mixer_config(2, /*H=*/6, /*P=*/3, /*G=*/2, /*N=*/2, /*K=*/4));
  expect_documents_alone(m, testing::PackedRows({{3, 1, 5}, {2, 7}}), 1e-5);
}

// --mamba-training-ssm-states-dtype bf16 with chunks of 3: documents starting on chunk boundaries
// see exactly their own chunks, so the packed run equals the documents alone, rounding included.
TEST(MambaMixerPacked, StoredChunkStatesRestartWithTheDocuments) {
  Mixer m(testing::mamba_mixer_config(2, 6, 3, 2, 2, 3));
  m.states = DType::kBF16;
  m.chunk = 3;
  expect_documents_alone(m, testing::PackedRows({{3, 6, 3}, {9, 3}}), 1e-5);
  // and the rounding is there: the stored states change the outputs
  Tensor u = Tensor::empty({12 * 2, 6});
  testing::fill_random(u.data<float>(), u.numel(), 5);
  const std::vector<int32_t> starts = testing::PackedRows({{3, 6, 3}, {9, 3}}).starts();
  const Tensor rounded = m.forward(u, 12, 2, nullptr, starts);
  m.states = DType::kF32;
  const Tensor exact = m.forward(u, 12, 2, nullptr, starts);
  double diff = 0.0;
  for (int64_t i = 0; i < u.numel(); ++i) diff = std::max(diff, std::fabs(double(rounded.data<float>()[i]) - exact.data<float>()[i]));
  EXPECT_GT(diff, 1e-6);
}

// A document starting inside a chunk: the chunk's stored entering state belongs to the document
// before, so up to the next chunk boundary its rows are those of f32 states exactly, while rows of
// the chunk before the start (and the chunks after) see the rounding.
TEST(MambaMixerPacked, StoredStateBeforeADocumentDoesNotReachIt) {
  Mixer m(testing::mamba_mixer_config(2, 6, 3, 2, 2, 3));
  m.chunk = 4;
  const testing::PackedRows rows({{6, 6}});  // the second document starts at 6, inside chunk [4, 8)
  const int64_t S = rows.S, H = m.c.hidden;
  Tensor u = Tensor::empty({S, H});
  testing::fill_random(u.data<float>(), u.numel(), 5);
  m.states = DType::kBF16;
  const Tensor rounded = m.forward(u, S, 1, nullptr, rows.starts());
  m.states = DType::kF32;
  const Tensor exact = m.forward(u, S, 1, nullptr, rows.starts());
  auto row_diff = [&](int64_t s) {
    double d = 0.0;
    for (int64_t i = 0; i < H; ++i)
      d = std::max(d, std::fabs(double(rounded.data<float>()[s * H + i]) - exact.data<float>()[s * H + i]));
    return d;
  };
  EXPECT_GT(row_diff(5), 1e-6) << "the first document's row in chunk [4, 8) reads the stored state";
  for (int64_t s = 6; s < 8; ++s) EXPECT_EQ(row_diff(s), 0.0) << "row " << s;
}

// Central differences of L = Σ r·out over packed rows (documents of 1 to 4 positions, K = 3), as
// the unpacked check: step 1e-2, tolerance 5e-3 + 2e-2·|g| (f32 states: a stored state's rounding
// has no finite difference to compare with).
TEST(MambaMixerPacked, GradientsMatchFiniteDifferences) {
  Mixer m(testing::mamba_mixer_config(2, 6, 3, 2, 2, 3));
  const testing::PackedRows rows({{2, 4, 1}, {1, 3, 3}});
  const int64_t S = rows.S, B = rows.B, T = S * B;
  const std::vector<int32_t> starts = rows.starts();
  Tensor u = Tensor::empty({T, m.c.hidden}), r = Tensor::empty({T, m.c.hidden});
  testing::fill_random(u.data<float>(), u.numel(), 5);
  testing::fill_random(r.data<float>(), r.numel(), 6);
  auto loss = [&]() {
    const Tensor out = m.forward(u, S, B, nullptr, starts);
    double l = 0.0;
    for (int64_t i = 0; i < out.numel(); ++i) l += static_cast<double>(out.data<float>()[i]) * r.data<float>()[i];
    return l;
  };
  m.pb.zero_grads();
  MambaMixerSaved saved;
  m.forward(u, S, B, &saved, starts);
  const Tensor du = mamba_mixer_backward(m.d, m.weights(), saved, r, S, B);
  const float eps = 1e-2f;
  auto check = [&](float* x, const float* analytic, int64_t n, const std::string& what) {
    for (int64_t i = 0; i < n; ++i) {
      const float keep = x[i];
      x[i] = keep + eps;
      const double lp = loss();
      x[i] = keep - eps;
      const double lm = loss();
      x[i] = keep;
      const double fd = (lp - lm) / (2.0 * eps);
      ASSERT_NEAR(analytic[i], fd, 5e-3 + 2e-2 * std::fabs(fd)) << what << " [" << i << "]";
    }
  };
  check(u.data<float>(), du.data<float>(), u.numel(), "u");
  for (int id : m.w.all()) {
    if (id == m.w.norm_w) continue;  // the layer's pre-norm is not part of the mixer
    check(m.pb.param_data(id), m.pb.grad_data(id), m.pb.spec(id).local_numel(), m.pb.spec(id).name);
  }
}

}  // namespace
}  // namespace gale
