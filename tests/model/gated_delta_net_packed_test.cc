// The Gated DeltaNet mixer over packed sequences (document starts): each document's outputs and
// gradients are those of the document run alone (also across backward's 64-position chunks), and
// finite-difference gradients of the packed recurrence.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/gemm.h"
#include "model/gated_delta_net.h"
#include "packed_scan_test_util.h"
#include "testing.h"

namespace gale {
namespace {

ModelConfig gdn_config() {  // H 5, one key head of 3, two value heads of 3, K 3 (as the unpacked check)
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = 5;
  c.rms_norm = true;
  c.gdn.enabled = true;
  c.gdn.pattern = {1, 0};
  c.gdn.num_key_heads = 1;
  c.gdn.num_value_heads = 2;
  c.gdn.key_head_dim = 3;
  c.gdn.value_head_dim = 3;
  c.gdn.conv_kernel = 3;
  return c;
}

struct Mixer {
  ModelConfig c = gdn_config();
  GdnDims d = GdnDims::of(c);
  ParamBuffer pb;
  GdnParamIds w;
  Mixer() {
    w = register_gdn_params(pb, c, 0);
    pb.finalize();
    pb.initialize(11);
    // Away from the initial values, decays exp(g) around 0.5 (the state carries over several steps).
    for (int id : w.all()) {
      std::vector<float> v(static_cast<size_t>(pb.spec(id).local_numel()));
      testing::fill_random(v.data(), static_cast<int64_t>(v.size()), 100 + static_cast<uint64_t>(id), 0.5f);
      const float* cur = pb.param_data(id);
      for (size_t i = 0; i < v.size(); ++i) v[i] += cur[i];
      pb.set_param_values(id, v.data());
    }
    std::vector<float> a(static_cast<size_t>(d.NV)), dt(static_cast<size_t>(d.NV));
    testing::fill_random(a.data(), d.NV, 77, 0.3f);
    testing::fill_random(dt.data(), d.NV, 78, 0.3f);
    for (float& v : a) v -= 0.7f;
    pb.set_param_values(w.a_log, a.data());
    pb.set_param_values(w.dt_bias, dt.data());
  }
  GdnWeights weights() { return gdn_weights(c, pb, w, sgemm, gemm_bf16); }
  Tensor forward(const Tensor& u, int64_t S, int64_t B, GdnSaved* saved, const std::vector<int32_t>& starts) {
    return gdn_forward(d, weights(), u, S, B, DType::kF32, saved, starts);
  }
  std::vector<std::vector<float>> grads() const {
    std::vector<std::vector<float>> g;
    for (int id : w.all()) g.emplace_back(pb.grad_data(id), pb.grad_data(id) + pb.spec(id).local_numel());
    return g;
  }
};

void expect_documents_alone(const testing::PackedRows& rows) {
  Mixer m;
  testing::expect_packed_as_documents_alone<GdnSaved>(
      m, rows, 1e-5, 1e-4, [&](GdnSaved& saved, const Tensor& r, int64_t S, int64_t B) {
        return gdn_backward(m.d, m.weights(), saved, r, S, B);
      });
}

// Documents shorter than the convolution's window and of one position.
TEST(GatedDeltaNetPacked, EachDocumentIsItsOwnSequence) { expect_documents_alone(testing::PackedRows({{3, 1, 5}, {2, 7}})); }

// Backward recomputes the states from checkpoints every 64 positions: documents that start inside
// a chunk, on its first position, and span a chunk boundary.
TEST(GatedDeltaNetPacked, DocumentsAcrossBackwardChunks) {
  expect_documents_alone(testing::PackedRows({{40, 24, 70, 3}, {63, 1, 60, 13}}));
}

// Central differences (the unpacked check's 4-point stencil, step 2e-3) of L = Σ r·out over packed
// rows of documents of 1 to 4 positions.
TEST(GatedDeltaNetPacked, GradientsMatchFiniteDifferences) {
  Mixer m;
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
  GdnSaved saved;
  m.forward(u, S, B, &saved, starts);
  const Tensor du = gdn_backward(m.d, m.weights(), saved, r, S, B);
  const float eps = 2e-3f;
  auto check = [&](float* x, const float* analytic, int64_t n, const std::string& what) {
    for (int64_t i = 0; i < n; ++i) {
      const float keep = x[i];
      auto at = [&](float dx) {
        x[i] = keep + dx;
        const double l = loss();
        x[i] = keep;
        return l;
      };
      const double fd = (8.0 * (at(eps) - at(-eps)) - (at(2 * eps) - at(-2 * eps))) / (12.0 * eps);
      ASSERT_NEAR(analytic[i], fd, 5e-3 + 2e-2 * std::fabs(fd)) << what << " [" << i << "]";
    }
  };
  check(u.data<float>(), du.data<float>(), u.numel(), "u");
  for (int id : m.w.all()) check(m.pb.param_data(id), m.pb.grad_data(id), m.pb.spec(id).local_numel(), m.pb.spec(id).name);
}

}  // namespace
}  // namespace gale
