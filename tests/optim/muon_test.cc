// The Muon optimizer (--optimizer muon) against tools/reference/muon_reference.py's PyTorch
// values: the Newton-Schulz orthogonalisation for each coefficient set in f32 and on bf16 values,
// and three Muon steps (momentum, Nesterov, decoupled weight decay, scale modes, the extra scale,
// the QKV split); plus the parameters that fall back to AdamW, and the checkpoint state names;
// the sharded iteration of --muon-tp-mode distributed against the whole-matrix one; and a MoE expert
// set against tools/reference/muon_experts_reference.py's numpy values.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu/newton_schulz.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/op_table.h"
#include "optim/optimizer.h"
#include "matrix_and_bias.h"
#include "testing.h"
#include "testing_json.h"

namespace gale {
namespace {

const nlohmann::json& reference() {
  static const nlohmann::json j = [] {
    std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/muon/muon.json");
    GALE_CHECK(in.good()) << "tests/data/reference/muon/muon.json";
    return nlohmann::json::parse(in);
  }();
  return j;
}

// Largest |a − b| over the elements.
float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

TEST(NewtonSchulz, MatchesTheTorchReference) {
  for (const nlohmann::json& c : reference()["newton_schulz"]) {
    const int64_t rows = c["rows"], cols = c["cols"], steps = c["steps"];
    const bool bf16 = c["bf16"];
    SCOPED_TRACE(str_cat(c["kind"].get<std::string>(), " ", rows, "x", cols, " steps ", steps, bf16 ? " bf16" : " f32"));
    const std::optional<NsCoefficients> k = ns_coefficients(c["kind"]);
    ASSERT_TRUE(k.has_value());
    const std::vector<float> in = testing::json_floats(c["input"]), want = testing::json_floats(c["output"]);
    std::vector<float> got(in.size()), plain(in.size());
    newton_schulz(in.data(), got.data(), rows, cols, steps, *k, bf16, sgemm);
    newton_schulz_ref(in.data(), plain.data(), rows, cols, steps, *k, bf16);
    // f32: summation order only (~1e-6 seen). bf16: equal to torch's bf16 addmm here, but a product
    // element may round to the neighbouring bf16 value (2^-8 relative): one ulp of a 0.5 entry.
    const float tol = bf16 ? 2e-3f : 5e-6f;
    EXPECT_LT(max_diff(got, want), tol);
    EXPECT_LT(max_diff(plain, want), tol);
    if (!bf16) EXPECT_LT(max_diff(got, plain), 1e-5f);
  }
}

// --muon-tp-mode distributed: `parts` threads each iterate on their shard of g [rows, cols] split
// along `split_dim` (uneven shards too), summing their norms and Gram matrices through a shared
// buffer; the shards put together equal newton_schulz() of the whole matrix.
std::vector<float> sharded_result(const std::vector<float>& g, int64_t rows, int64_t cols, int split_dim,
                                  const std::vector<int64_t>& sizes, bool bf16, const NsCoefficients& k) {
  const int parts = static_cast<int>(sizes.size());
  std::vector<float> out(g.size());
  std::barrier<> sync(parts);
  std::mutex mu;
  std::vector<float> acc;
  std::vector<std::thread> threads;
  int64_t first = 0;
  for (int p = 0; p < parts; ++p) {
    const int64_t n = sizes[static_cast<size_t>(p)], lo = first;
    first += n;
    threads.emplace_back([&, n, lo, p] {
      const int64_t r = split_dim == 0 ? n : rows, c = split_dim == 0 ? cols : n;
      std::vector<float> shard(static_cast<size_t>(r * c)), res(shard.size());
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j)
          shard[static_cast<size_t>(i * c + j)] =
              split_dim == 0 ? g[static_cast<size_t>((lo + i) * cols + j)] : g[static_cast<size_t>(i * cols + lo + j)];
      const NsAllReduce sum = [&](float* data, int64_t count) {
        if (p == 0) acc.assign(static_cast<size_t>(count), 0.0f);
        sync.arrive_and_wait();
        {
          std::lock_guard<std::mutex> lock(mu);
          for (int64_t i = 0; i < count; ++i) acc[static_cast<size_t>(i)] += data[i];
        }
        sync.arrive_and_wait();
        std::copy(acc.begin(), acc.begin() + count, data);
        sync.arrive_and_wait();
      };
      newton_schulz_sharded(shard.data(), res.data(), r, c, split_dim, 5, k, bf16, sum, sgemm);
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j)
          (split_dim == 0 ? out[static_cast<size_t>((lo + i) * cols + j)] : out[static_cast<size_t>(i * cols + lo + j)]) =
              res[static_cast<size_t>(i * c + j)];
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(NewtonSchulz, ShardedIterationEqualsTheWholeMatrixOne) {
  const NsCoefficients k = *ns_coefficients("quintic");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Tall and wide matrices split along either dimension: the sharded iteration runs through
  // the Gram matrix of the unsplit side, the whole-matrix one through the smaller one.
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{24, 16}, {16, 24}, {12, 12}})
    for (int split_dim : {0, 1})
      for (const bool bf16 : {false, true}) {
        const int64_t along = split_dim == 0 ? rows : cols;
        const std::vector<int64_t> sizes = {along / 2 + 2, along / 2 - 2};  // uneven (--unaligned-linear)
        SCOPED_TRACE(str_cat(rows, "x", cols, " split along ", split_dim, bf16 ? " bf16" : " f32"));
        std::vector<float> g(static_cast<size_t>(rows * cols));
        for (float& v : g) v = normal(rng);
        std::vector<float> whole(g.size());
        newton_schulz(g.data(), whole.data(), rows, cols, 5, k, bf16, sgemm);
        const std::vector<float> sharded = sharded_result(g, rows, cols, split_dim, sizes, bf16, k);
        // f32: summation order only. bf16: each product rounded to bf16 (2^-8 relative) along
        // another path (the other Gram matrix, partial sums rounded): a few ulps of 0.3-sized entries.
        EXPECT_LT(max_diff(sharded, whole), bf16 ? 3e-2f : 2e-5f);
        // Not the blockwise result: each shard orthogonalised on its own differs.
        if (split_dim == 0) {
          std::vector<float> out(static_cast<size_t>(sizes[0] * cols));
          newton_schulz(g.data(), out.data(), sizes[0], cols, 5, k, bf16, sgemm);
          std::vector<float> mine(sharded.begin(), sharded.begin() + static_cast<int64_t>(out.size()));
          EXPECT_GT(max_diff(out, mine), 5e-2f);
        }
      }
}

TEST(NewtonSchulz, OrthogonalisesWithSingularValuesNearOne) {
  // NS(G)·NS(G)ᵀ ≈ I for a wide G (the quintic set leaves singular values in about [0.7, 1.2]).
  const int64_t rows = 8, cols = 32;
  std::vector<float> g(rows * cols), x(rows * cols);
  testing::fill_random(g.data(), rows * cols, 5);
  newton_schulz(g.data(), x.data(), rows, cols, 5, *ns_coefficients("quintic"), false, sgemm);
  for (int64_t i = 0; i < rows; ++i) {
    double diag = 0.0;
    for (int64_t k = 0; k < cols; ++k) diag += static_cast<double>(x[i * cols + k]) * x[i * cols + k];
    EXPECT_GT(diag, 0.4);
    EXPECT_LT(diag, 1.5);
  }
}

TEST(NewtonSchulz, CoefficientSetsAndScaleFactors) {
  EXPECT_FALSE(ns_coefficients("custom").has_value());
  EXPECT_FALSE(ns_coefficients("Quintic").has_value());
  const NsCoefficients q = *ns_coefficients("quintic"), p = *ns_coefficients("polar_express");
  EXPECT_EQ(q.at(5), q.at(0));  // cycles
  EXPECT_EQ(p.at(20), p.at(7));  // repeats its last triple
  EXPECT_EQ(ns_coefficients("cubic5")->fixed_steps, 5);
  EXPECT_DOUBLE_EQ(*muon_scale_factor(64, 16, "spectral"), 8.0);
  EXPECT_DOUBLE_EQ(*muon_scale_factor(16, 64, "unit_rms_norm"), 0.5);
  EXPECT_DOUBLE_EQ(*muon_scale_factor(16, 64, "shape_scaling"), 1.0);
  EXPECT_DOUBLE_EQ(*muon_scale_factor(64, 16, "shape_scaling"), 2.0);
  EXPECT_FALSE(muon_scale_factor(4, 4, "rms").has_value());
}

OptimizerConfig muon_config(const nlohmann::json& c) {
  OptimizerConfig o;
  o.type = "muon";
  o.clip_grad = 0.0;
  o.muon.momentum = c["momentum"];
  o.muon.nesterov = c["nesterov"];
  o.muon.scale_mode = c["scale_mode"];
  o.muon.num_ns_steps = c["steps"];
  o.muon.coefficient_type = c["kind"];
  o.muon.extra_scale_factor = c["extra_scale_factor"];
  o.muon.fp32_matmul_prec = c["bf16"].get<bool>() ? "medium" : "high";
  return o;
}

TEST(Muon, StepsMatchTheTorchReference) {
  const OpTable ops = reference_ops();
  for (const nlohmann::json& c : reference()["muon_steps"]) {
    const int64_t rows = c["rows"], cols = c["cols"];
    const bool bf16 = c["bf16"];
    SCOPED_TRACE(str_cat(rows, "x", cols, c["nesterov"].get<bool>() ? " nesterov" : "", bf16 ? " bf16" : "",
                         " ", c["scale_mode"].get<std::string>()));
    ParamBuffer pb;
    ParamSpec w;
    w.name = "decoder.layers.0.self_attention.linear_qkv.weight";
    w.global_shape = {rows, cols};
    pb.add(w);
    pb.finalize();
    const std::vector<float> p0 = testing::json_floats(c["param"]);
    std::copy(p0.begin(), p0.end(), pb.param_data(0));
    OptimizedBuffer buffer{&pb, {}, std::nullopt};
    buffer.muon = {true};
    buffer.qkv_split = {c["qkv_split"].get<std::vector<int64_t>>()};
    std::vector<OptimizedBuffer> buffers;
    buffers.push_back(buffer);
    Optimizer opt(muon_config(c), std::move(buffers), &ops, make_self_communicator("mp"));
    for (size_t s = 0; s < c["grads"].size(); ++s) {
      const std::vector<float> g = testing::json_floats(c["grads"][s]);
      std::copy(g.begin(), g.end(), pb.grad_data(0));
      ASSERT_TRUE(opt.step(c["lrs"][s].get<double>(), c["wd"].get<double>()).applied);
      const std::vector<float> got(pb.param_data(0), pb.param_data(0) + rows * cols);
      // Updates are lr·O(1): f32 sums agree to ~5e-8, bf16 to a bf16 ulp of an update element.
      EXPECT_LT(max_diff(got, testing::json_floats(c["params_after"][s])), bf16 ? 1e-4f : 2e-7f) << "after step " << s + 1;
    }
  }
}

// A tiny MoE expert set (tools/reference/muon_experts_reference.py, numpy): 3 experts' SwiGLU fc1
// [8, 6] and fc2 [6, 4] and the router [3, 6], two Nesterov Muon steps in f32 with weight decay:
// each expert's matrix orthogonalised on its own (Megatron's TEGroupedMLP weights), not stacked.
TEST(Muon, ExpertsAreOrthogonalisedEachOnItsOwn) {
  static const nlohmann::json ref = [] {
    std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/muon/muon_experts.json");
    GALE_CHECK(in.good()) << "tests/data/reference/muon/muon_experts.json";
    return nlohmann::json::parse(in);
  }();
  const OpTable ops = reference_ops();
  ParamBuffer pb;
  for (const nlohmann::json& t : ref["tensors"]) {
    ParamSpec w;
    w.name = t["name"];
    w.global_shape = t["shape"].get<std::vector<int64_t>>();
    pb.add(w);
  }
  pb.finalize();
  const size_t n = ref["tensors"].size();
  for (size_t i = 0; i < n; ++i) {
    const std::vector<float> p0 = testing::json_floats(ref["tensors"][i]["param"]);
    std::copy(p0.begin(), p0.end(), pb.param_data(static_cast<int>(i)));
  }
  OptimizedBuffer buffer{&pb, {}, std::nullopt};
  buffer.muon.assign(n, true);
  buffer.expert_tp.assign(n, false);
  for (size_t i = 0; i + 1 < n; ++i) buffer.expert_tp[i] = true;  // whole here: expert-TP 1
  std::vector<OptimizedBuffer> buffers;
  buffers.push_back(buffer);
  OptimizerConfig o;
  o.type = "muon";
  o.clip_grad = 0.0;
  o.muon.momentum = ref["momentum"];
  o.muon.nesterov = true;
  o.muon.fp32_matmul_prec = "high";
  Optimizer opt(o, std::move(buffers), &ops, make_self_communicator("mp"));
  const double lr = ref["lr"], wd = ref["wd"];
  for (int s = 0; s < 2; ++s) {
    for (size_t i = 0; i < n; ++i) {
      const std::vector<float> g = testing::json_floats(ref["tensors"][i]["grads"][s]);
      std::copy(g.begin(), g.end(), pb.grad_data(static_cast<int>(i)));
    }
    ASSERT_TRUE(opt.step(lr, wd).applied);
    for (size_t i = 0; i < n; ++i) {
      const nlohmann::json& t = ref["tensors"][i];
      const std::vector<float> want = testing::json_floats(t["params_after"][s]);
      const std::vector<float> got(pb.param_data(static_cast<int>(i)), pb.param_data(static_cast<int>(i)) + want.size());
      // Updates are lr·O(1): f32 sums in another order, a few 1e-8.
      EXPECT_LT(max_diff(got, want), 2e-7f) << t["name"].get<std::string>() << " after step " << s + 1;
    }
  }
  // The experts' fc1 orthogonalised stacked into one [24, 6] matrix would have moved expert 1
  // elsewhere after the first step: recompute that step from the initial values.
  const std::vector<float> stacked = testing::json_floats(ref["stacked_fc1_update"]);
  const std::vector<float> p0 = testing::json_floats(ref["tensors"][2]["param"]), want = testing::json_floats(ref["tensors"][2]["params_after"][0]);
  std::vector<float> stacked_after(p0.size());
  for (size_t k = 0; k < p0.size(); ++k)
    stacked_after[k] = p0[k] - static_cast<float>(lr * wd) * p0[k] - static_cast<float>(lr) * stacked[p0.size() + k];
  EXPECT_GT(max_diff(stacked_after, want), 1e-3f);
}

// A [4, 6] matrix with Muon, a [6] bias with AdamW: the bias moves exactly as adamw_step_ref, the
// checkpoint names split accordingly, and the state is Adam's size (the momentum in exp_avg).
TEST(Muon, OtherParametersGetAdamWAndTheStateNamesSplit) {
  const OpTable ops = reference_ops();
  ParamBuffer pb;
  std::unique_ptr<Optimizer> stepped = testing::step_matrix_and_bias("muon", pb, ops);
  Optimizer& opt = *stepped;
  EXPECT_TRUE(opt.is_muon(0, 0));
  EXPECT_FALSE(opt.is_muon(0, 1));
  EXPECT_TRUE(opt.holds_state(0, 0, "momentum_buffer"));
  EXPECT_FALSE(opt.holds_state(0, 0, "exp_avg"));
  EXPECT_TRUE(opt.holds_state(0, 1, "exp_avg_sq"));
  EXPECT_FALSE(opt.holds_state(0, 1, "momentum_buffer"));
  EXPECT_EQ(opt.state_bytes(), 2 * 30 * 4);
  // The Muon parameter's momentum after one step from zero: (1 − 0.9)·g.
  const auto state = opt.state(0);
  const float* mom = state[2].second.data<float>();
  EXPECT_EQ(state[2].first, "momentum_buffer");
  for (int i = 0; i < 24; ++i) EXPECT_NEAR(mom[i], 0.1f * pb.grad_data(0)[i], 1e-7f);
}

}  // namespace
}  // namespace gale
