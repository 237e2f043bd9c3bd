// --quant-states kernels: FP8 codes and block quantisation against the numpy fixture
// (tools/reference/quant_states_reference.py), and the fused AdamW over quantised moments
// bit-identical to the reference composition (dequantise, adamw_step_ref, quantise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/quant_states.h"
#include "testing.h"

namespace gale {
namespace {

const nlohmann::json& golden() {
  static const nlohmann::json j = [] {
    std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/quant_states/golden.json");
    GALE_CHECK(in.good()) << "missing tests/data/reference/quant_states/golden.json";
    return nlohmann::json::parse(in);
  }();
  return j;
}

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
Fp8Format format_of(const std::string& s) { return s == "e4m3" ? Fp8Format::kE4M3 : Fp8Format::kE5M2; }

TEST(QuantStates, Fp8CodesMatchTheFixture) {
  for (const char* fmt : {"e4m3", "e5m2"}) {
    const nlohmann::json& e = golden()["encode"][fmt];
    ASSERT_GT(e["x"].size(), 200u);
    for (size_t i = 0; i < e["x"].size(); ++i) {
      const float x = from_bits(e["x"][i].get<uint32_t>());
      EXPECT_EQ(int{fp8_encode(x, format_of(fmt))}, e["codes"][i].get<int>()) << fmt << " x = " << x;
    }
  }
}

TEST(QuantStates, DecodeInvertsEncodeOnEveryFiniteCode) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_decode(static_cast<uint8_t>(c), f);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(int{fp8_encode(v, f)}, c) << "code " << c;
    }
    EXPECT_EQ(fp8_decode(fp8_encode(1e30f, f), f), fp8_max(f));  // saturates
  }
  EXPECT_EQ(fp8_max(Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Format::kE5M2), 57344.0f);
}

TEST(QuantStates, BlocksMatchTheFixture) {
  for (const nlohmann::json& c : golden()["cases"]) {
    const QuantMode mode = c["mode"] == "linear" ? QuantMode::kLinear : QuantMode::kMx;
    const QuantLayout layout{mode, c["block"].get<int64_t>(), c["first"].get<int64_t>()};
    const Fp8Format fmt = format_of(c["format"]);
    const std::string what = c["mode"].get<std::string>() + " " + c["format"].get<std::string>() + " block " +
                             std::to_string(layout.block) + " first " + std::to_string(layout.first);
    std::vector<float> x;
    for (const auto& b : c["x"]) x.push_back(from_bits(b.get<uint32_t>()));
    const int64_t n = static_cast<int64_t>(x.size());
    const int64_t blocks = quant_num_blocks(n, layout);
    ASSERT_EQ(blocks, static_cast<int64_t>(c["scales"].size())) << what;
    std::vector<uint8_t> codes(x.size()), scales(static_cast<size_t>(blocks * quant_scale_bytes(mode)));
    quantise_state_ref(x.data(), n, layout, QuantStateRef{codes.data(), scales.data(), fmt});
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(int{codes[i]}, c["codes"][i].get<int>()) << what << " element " << i;
    for (int64_t b = 0; b < blocks; ++b) {
      if (mode == QuantMode::kLinear) {
        uint32_t s;
        std::memcpy(&s, scales.data() + 4 * b, 4);
        EXPECT_EQ(s, c["scales"][b].get<uint32_t>()) << what << " block " << b;
      } else {
        EXPECT_EQ(int{scales[static_cast<size_t>(b)]}, c["scales"][b].get<int>()) << what << " block " << b;
      }
    }
    std::vector<float> back(x.size());
    dequantise_state_ref(QuantStateRef{codes.data(), scales.data(), fmt}, n, layout, back.data());
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(bits(back[i]), c["dequantised"][i].get<uint32_t>()) << what << " element " << i;
  }
}

TEST(QuantStates, BlockCounts) {
  const QuantLayout l{QuantMode::kMx, 32, 7};
  EXPECT_EQ(quant_num_blocks(0, l), 0);
  EXPECT_EQ(quant_num_blocks(7, l), 1);
  EXPECT_EQ(quant_num_blocks(8, l), 2);
  EXPECT_EQ(quant_num_blocks(39, l), 2);
  EXPECT_EQ(quant_num_blocks(40, l), 3);
  EXPECT_EQ(quant_scale_bytes(QuantMode::kLinear), 4);
  EXPECT_EQ(quant_scale_bytes(QuantMode::kMx), 1);
}

// Fused and reference AdamW over quantised moments: several steps, blocks that start inside the
// piece, one scale for a whole piece, both modes; parameters, codes and scales bit for bit.
TEST(QuantStates, FusedAdamWMatchesTheReference) {
  struct Case {
    QuantLayout layout;
    int64_t n;
  };
  const Case cases[] = {{{QuantMode::kLinear, 128, 128}, 1000},
                        {{QuantMode::kLinear, 64, 5}, 333},
                        {{QuantMode::kLinear, 777, 777}, 777},
                        {{QuantMode::kMx, 32, 32}, 1000},
                        {{QuantMode::kMx, 32, 13}, 70001}};
  for (const Case& c : cases) {
    const int64_t n = c.n, blocks = quant_num_blocks(n, c.layout);
    const int64_t sb = blocks * quant_scale_bytes(c.layout.mode);
    std::vector<float> p_ref = testing::random_vector(n, 1), p = p_ref;
    // Moments start from a quantised nonzero state (as after some steps).
    std::vector<uint8_t> mc(n), vc(n), ms(sb), vs(sb);
    std::vector<float> m0 = testing::random_vector(n, 2, 1e-2f), v0(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v0[i] = m0[i] * m0[i] * 3.0f;
    QuantStateRef m{mc.data(), ms.data(), Fp8Format::kE4M3}, v{vc.data(), vs.data(), Fp8Format::kE5M2};
    quantise_state_ref(m0.data(), n, c.layout, m);
    quantise_state_ref(v0.data(), n, c.layout, v);
    std::vector<uint8_t> mc2 = mc, vc2 = vc, ms2 = ms, vs2 = vs;
    QuantStateRef m2{mc2.data(), ms2.data(), Fp8Format::kE4M3}, v2{vc2.data(), vs2.data(), Fp8Format::kE5M2};
    AdamWHyper h;
    h.lr = 1e-3f;
    h.weight_decay = 0.1f;
    for (int step = 1; step <= 4; ++step) {
      h.step = step;
      h.grad_scale = step == 2 ? 0.5f : 1.0f;
      const std::vector<float> g = testing::random_vector(n, 10 + static_cast<uint64_t>(step), 1e-2f);
      adamw_step_quantised_ref(p_ref.data(), g.data(), m, v, n, c.layout, h);
      adamw_step_quantised(p.data(), g.data(), m2, v2, n, c.layout, h);
      ASSERT_EQ(std::memcmp(p.data(), p_ref.data(), p.size() * sizeof(float)), 0) << "n " << n << " step " << step;
      ASSERT_EQ(mc, mc2) << "n " << n << " step " << step;
      ASSERT_EQ(vc, vc2) << "n " << n << " step " << step;
      ASSERT_EQ(ms, ms2) << "n " << n << " step " << step;
      ASSERT_EQ(vs, vs2) << "n " << n << " step " << step;
    }
    // And the moments did change (the update is not a no-op).
    std::vector<float> m_after(static_cast<size_t>(n));
    dequantise_state_ref(m, n, c.layout, m_after.data());
    int64_t changed = 0;
    for (int64_t i = 0; i < n; ++i) changed += m_after[i] != m0[i];
    EXPECT_GT(changed, n / 2);
  }
}

// Quantised AdamW stays close to f32 AdamW: 20 steps of one piece, parameters within a stated bound.
TEST(QuantStates, QuantisedAdamWTracksF32AdamW) {
  const int64_t n = 4096;
  for (QuantMode mode : {QuantMode::kLinear, QuantMode::kMx}) {
    const QuantLayout layout{mode, mode == QuantMode::kLinear ? 128 : 32, mode == QuantMode::kLinear ? 128 : 32};
    const int64_t sb = quant_num_blocks(n, layout) * quant_scale_bytes(mode);
    std::vector<float> p32 = testing::random_vector(n, 3), p = p32, m32(n, 0.0f), v32(n, 0.0f);
    std::vector<uint8_t> mc(n), vc(n), ms(sb), vs(sb);
    QuantStateRef m{mc.data(), ms.data(), Fp8Format::kE4M3}, v{vc.data(), vs.data(), Fp8Format::kE5M2};
    std::vector<float> zero(n, 0.0f);
    quantise_state_ref(zero.data(), n, layout, m);
    quantise_state_ref(zero.data(), n, layout, v);
    AdamWHyper h;
    h.lr = 1e-3f;
    for (int step = 1; step <= 20; ++step) {
      h.step = step;
      const std::vector<float> g = testing::random_vector(n, 100 + static_cast<uint64_t>(step), 1e-2f);
      adamw_step_ref(p32.data(), g.data(), m32.data(), v32.data(), n, h);
      adamw_step_quantised(p.data(), g.data(), m, v, n, layout, h);
    }
    double worst = 0.0;
    for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(static_cast<double>(p[i]) - p32[i]));
    // 20 steps of at most lr each move a parameter by up to 0.02; the quantised moments stay within 10% of that.
    EXPECT_LT(worst, 2e-3) << (mode == QuantMode::kLinear ? "fp8" : "mxfp8");
    EXPECT_GT(worst, 0.0);
  }
}

}  // namespace
}  // namespace gale
