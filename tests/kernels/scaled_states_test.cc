// The precision-aware optimizer's per-tensor scaled moments (kernels/cpu/scaled_states.h): fp16 and
// E4M3 codes and scales bit for bit against the numpy fixture (tools/reference/scaled_states_reference.py),
// and one AdamW step over scaled moments against the f32 step: the parameters bit for bit (the step
// reads exactly the dequantised moments), the stored moments within the format's rounding bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/scaled_states.h"
#include "kernels/reference_fixture.h"

namespace gale {
namespace {

std::vector<uint8_t> storage(StateDType d, int64_t n) {
  return std::vector<uint8_t>(static_cast<size_t>(n * state_dtype_bytes(d)) + 1, 0xAB);
}

uint32_t code_at(const std::vector<uint8_t>& codes, StateDType d, int64_t i) {
  if (d == StateDType::kFP8) return codes[static_cast<size_t>(i)];
  uint16_t h;
  std::memcpy(&h, codes.data() + 2 * i, 2);
  return h;
}

TEST(ScaledStates, MatchFixtureBitForBit) {
  const nlohmann::json j = testing::load_reference_json("scaled_states/golden.json");
  int checked = 0;
  for (const nlohmann::json& c : j.at("cases")) {
    StateDType d;
    ASSERT_TRUE(parse_state_dtype(c.at("dtype").get<std::string>(), &d));
    const std::string name = c.at("name").get<std::string>() + " " + c.at("dtype").get<std::string>();
    std::vector<float> x;
    for (uint32_t b : c.at("x")) x.push_back(testing::from_bits(b));
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<uint8_t> codes = storage(d, n);
    float scale = -1.0f;
    std::vector<float> work = x;
    quantise_scaled_state(work.data(), n, ScaledStateRef{codes.data(), &scale, d});
    EXPECT_EQ(testing::bits(scale), c.at("scale").get<uint32_t>()) << name;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(code_at(codes, d, i), c.at("codes")[static_cast<size_t>(i)].get<uint32_t>()) << name << " " << i;
    EXPECT_EQ(codes.back(), 0xAB) << name << ": wrote past the codes";
    std::vector<float> back(static_cast<size_t>(n), -7.0f);
    dequantise_scaled_state(ScaledStateRef{codes.data(), &scale, d}, n, back.data());
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(testing::bits(back[static_cast<size_t>(i)]), c.at("dequantised")[static_cast<size_t>(i)].get<uint32_t>())
          << name << " " << i;
    ++checked;
  }
  EXPECT_EQ(checked, 14);
}

// |dequantise(quantise(x)) − x| ≤ |x|·(u + 2^−20) + scale·s: u the format's relative half-spacing
// (2^−11 for fp16, 2^−4 for E4M3), s its subnormal half-spacing doubled (2^−24 fp16, 2^−9 E4M3), and
// 2^−20 covering the three f32 roundings (x·r, the reciprocal, ·scale; each 2^−24).
double bound(StateDType d, float x, float scale) {
  const double u = d == StateDType::kF16 ? 0x1p-11 : 0x1p-4, s = d == StateDType::kF16 ? 0x1p-24 : 0x1p-9;
  return std::fabs(x) * (u + 0x1p-20) + scale * s;
}

TEST(ScaledStates, AdamWStepMatchesF32StepWithinFormatBound) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-6.0f, 0.0f);
  const int64_t n = 1000;
  for (StateDType dm : {StateDType::kF32, StateDType::kF16, StateDType::kFP8})
    for (StateDType dv : {StateDType::kF32, StateDType::kF16, StateDType::kFP8}) {
      std::vector<float> p(n), g(n), m(n), v(n);
      for (int64_t i = 0; i < n; ++i) {
        p[i] = normal(rng);
        g[i] = normal(rng) * std::pow(10.0f, decade(rng));
        m[i] = 0.1f * g[i];
        v[i] = 0.01f * g[i] * g[i];
      }
      // The scaled state holding m and v, and the f32 step's moments: what it dequantises to.
      std::vector<uint8_t> mc = storage(dm, n), vc = storage(dv, n);
      float ms = 0.0f, vs = 0.0f;
      std::vector<float> mf = m, vf = v;
      ScaledStateRef mref{dm == StateDType::kF32 ? static_cast<void*>(mf.data()) : mc.data(), &ms, dm};
      ScaledStateRef vref{dv == StateDType::kF32 ? static_cast<void*>(vf.data()) : vc.data(), &vs, dv};
      if (dm != StateDType::kF32) {
        std::vector<float> t = m;
        quantise_scaled_state(t.data(), n, mref);
        dequantise_scaled_state(mref, n, mf.data());
      }
      if (dv != StateDType::kF32) {
        std::vector<float> t = v;
        quantise_scaled_state(t.data(), n, vref);
        dequantise_scaled_state(vref, n, vf.data());
      }
      AdamWHyper h;
      h.lr = 1e-3f;
      h.weight_decay = 0.1f;
      h.step = 3;
      std::vector<float> p_ref = p, m_ref = mf, v_ref = vf;
      adamw_step_ref(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, h);
      std::vector<float> m32(n), v32(n), p_got = p;
      adamw_step_scaled(p_got.data(), g.data(), mref, vref, n, h, m32.data(), v32.data(), adamw_step_ref);
      const std::string what = std::string(state_dtype_name(dm)) + "/" + state_dtype_name(dv);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(testing::bits(p_got[i]), testing::bits(p_ref[i])) << what << " parameter " << i;
      std::vector<float> m_back(n), v_back(n);
      dequantise_scaled_state(mref, n, m_back.data());
      dequantise_scaled_state(vref, n, v_back.data());
      for (int64_t i = 0; i < n; ++i) {
        if (dm == StateDType::kF32) ASSERT_EQ(m_back[i], m_ref[i]) << what;
        else ASSERT_LE(std::fabs(m_back[i] - m_ref[i]), bound(dm, m_ref[i], ms)) << what << " exp_avg " << i;
        if (dv == StateDType::kF32) ASSERT_EQ(v_back[i], v_ref[i]) << what;
        else ASSERT_LE(std::fabs(v_back[i] - v_ref[i]), bound(dv, v_ref[i], vs)) << what << " exp_avg_sq " << i;
      }
      if (dm != StateDType::kF32) {
        float amax = 0.0f;
        for (float x : m_ref) amax = std::max(amax, std::fabs(x));
        EXPECT_EQ(ms, amax / scaled_state_range(dm)) << what << ": the scale follows the new amax";
      }
    }
}

}  // namespace
}  // namespace gale
