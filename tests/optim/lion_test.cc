// The Lion optimizer (--optimizer lion, --muon-scalar-optimizer lion) against
// tools/reference/lion_reference.py's float64 values: several steps with weight decay, clipping
// and each beta source; which parameters Lion updates, and its one state tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

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
    std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/lion/lion.json");
    GALE_CHECK(in.good()) << "tests/data/reference/lion/lion.json";
    return nlohmann::json::parse(in);
  }();
  return j;
}

float max_diff(const float* a, const std::vector<float>& b) {
  float d = 0.0f;
  for (size_t i = 0; i < b.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// One parameter of the case's shape; Lion either as --optimizer lion's own (the parameter marked,
// the betas the Adam ones) or as Muon's scalar optimizer (unmarked, the betas --lion-beta1/2).
void run_case(const nlohmann::json& c, bool as_muon_scalar) {
  const Shape shape = c["shape"].get<std::vector<int64_t>>();
  ParamBuffer pb;
  ParamSpec w;
  w.name = "w";
  w.global_shape = shape;
  pb.add(w);
  pb.finalize();
  const std::vector<float> p0 = testing::json_floats(c["param"]);
  std::copy(p0.begin(), p0.end(), pb.param_data(0));
  OptimizerConfig o;
  o.clip_grad = c["clip"].get<double>();
  if (as_muon_scalar) {
    o.type = "muon";
    o.muon.scalar_optimizer = "lion";
    o.lion.beta1 = c["beta1"].get<double>();
    o.lion.beta2 = c["beta2"].get<double>();
  } else {
    o.type = "lion";
    o.beta1 = c["beta1"].get<double>();
    o.beta2 = c["beta2"].get<double>();
  }
  OptimizedBuffer buffer{&pb, {}, std::nullopt};
  buffer.muon = {!as_muon_scalar};
  std::vector<OptimizedBuffer> buffers;
  buffers.push_back(buffer);
  const OpTable ops = reference_ops();
  Optimizer opt(o, std::move(buffers), &ops, make_self_communicator("mp"));
  ASSERT_TRUE(opt.is_lion(0, 0));
  for (size_t s = 0; s < c["grads"].size(); ++s) {
    const std::vector<float> g = testing::json_floats(c["grads"][s]);
    std::copy(g.begin(), g.end(), pb.grad_data(0));
    ASSERT_TRUE(opt.step(c["lrs"][s].get<double>(), c["wd"].get<double>()).applied);
    // Each step moves every element by lr (sign ±1) plus the decay: two f32 roundings per step of
    // values up to ~4 (an ulp 4.8e-7), against float64; a flipped sign would be off by 2·lr ≥ 2e-3.
    EXPECT_LT(max_diff(pb.param_data(0), testing::json_floats(c["params_after"][s])), 4e-6f) << "after step " << s + 1;
    const auto state = opt.state(0);
    ASSERT_EQ(state.front().first, "exp_avg");
    EXPECT_LT(max_diff(state.front().second.data<float>(), testing::json_floats(c["exp_avg_after"][s])), 2e-6f)
        << "exp_avg after step " << s + 1;
  }
}

// --optimizer lion's own parameters are matrices (as Muon's): the 2-D cases.
TEST(Lion, OwnParametersMatchTheFloat64Reference) {
  int ran = 0;
  for (const nlohmann::json& c : reference()["cases"]) {
    if (c["shape"].size() != 2) continue;
    SCOPED_TRACE(c["name"].get<std::string>());
    run_case(c, false);
    ++ran;
  }
  EXPECT_EQ(ran, 2);
}

TEST(Lion, AsMuonsScalarOptimizerMatchesTheFloat64Reference) {
  for (const nlohmann::json& c : reference()["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    run_case(c, true);
  }
}

// The kernel's exact f32 arithmetic on hand-picked values: the decay and the step are one rounding
// each, and sign(0) leaves the parameter at its decayed value.
TEST(Lion, KernelSignsAndDecay) {
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, m = {0.0f, 0.0f, 1.0f};
  const std::vector<float> g = {3.0f, -1.0f, -9.5f};
  lion_step_ref(p.data(), g.data(), m.data(), 3, 0.5, 0.9, 0.99, 0.2);
  // decay: p·(1 − 0.1); c = 0.1·g (+ 0.9·m): +, −, 0.9 − 0.95 < 0.
  EXPECT_FLOAT_EQ(p[0], 0.9f - 0.5f);
  EXPECT_FLOAT_EQ(p[1], -1.8f + 0.5f);
  EXPECT_FLOAT_EQ(p[2], 0.45f + 0.5f);
  EXPECT_FLOAT_EQ(m[0], 0.03f);
  EXPECT_FLOAT_EQ(m[2], 0.99f - 0.095f);
  std::vector<float> q = {1.0f}, z = {0.0f};
  const std::vector<float> zero = {0.0f};
  lion_step_ref(q.data(), zero.data(), z.data(), 1, 0.5, 0.9, 0.99, 0.0);
  EXPECT_EQ(q[0], 1.0f);
}

// --optimizer lion: Lion for the marked (2-D) parameters, AdamW for the others; the Lion ones hold
// exp_avg only. --muon-scalar-optimizer lion: no AdamW parameter, so no exp_avg_sq at all.
TEST(Lion, OtherParametersGetAdamWAndTheStateNames) {
  const OpTable ops = reference_ops();
  ParamBuffer pb;
  std::unique_ptr<Optimizer> stepped = testing::step_matrix_and_bias("lion", pb, ops);
  Optimizer& opt = *stepped;
  EXPECT_TRUE(opt.is_lion(0, 0));
  EXPECT_FALSE(opt.is_lion(0, 1));
  EXPECT_TRUE(opt.holds_state(0, 0, "exp_avg"));
  EXPECT_FALSE(opt.holds_state(0, 0, "exp_avg_sq"));
  EXPECT_TRUE(opt.holds_state(0, 1, "exp_avg_sq"));
  const auto state = opt.state(0);
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "exp_avg");
  EXPECT_EQ(state[1].first, "exp_avg_sq");

  OptimizerConfig mo;
  mo.type = "muon";
  mo.muon.scalar_optimizer = "lion";
  OptimizedBuffer mb{&pb, {}, std::nullopt};
  mb.muon = {true, false};
  std::vector<OptimizedBuffer> mbuffers;
  mbuffers.push_back(mb);
  Optimizer muon(mo, std::move(mbuffers), &ops, make_self_communicator("mp"));
  EXPECT_FALSE(muon.is_lion(0, 0));
  EXPECT_TRUE(muon.is_lion(0, 1));
  EXPECT_TRUE(muon.holds_state(0, 0, "momentum_buffer"));
  EXPECT_FALSE(muon.holds_state(0, 0, "exp_avg"));
  EXPECT_TRUE(muon.holds_state(0, 1, "exp_avg"));
  EXPECT_FALSE(muon.holds_state(0, 1, "exp_avg_sq"));
  EXPECT_EQ(muon.state_bytes(), 30 * 4);  // one state tensor
}

}  // namespace
}  // namespace gale
