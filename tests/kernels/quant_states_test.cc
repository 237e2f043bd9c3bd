// --quant-states kernels: FP8 and HiFloat8 codes and block quantisation against the numpy fixtures
// (tools/reference/quant_states_reference.py, tools/reference/hif8_reference.py), and the fused
// AdamW over quantised moments bit-identical to the reference composition (dequantise,
// adamw_step_ref, quantise) on every ISA build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/check.h"
#include "kernels/reference_fixture.h"
#include "kernels/cpu/fp8_codec.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/mx_quant.h"
#include "kernels/cpu/quant_states.h"
#include "testing.h"

namespace gale {
namespace {

using testing::bits;
using testing::from_bits;

const nlohmann::json& golden() {
  static const nlohmann::json j = testing::load_reference_json("quant_states/golden.json");
  return j;
}
Fp8Format format_of(const std::string& s) { return s == "e4m3" ? Fp8Format::kE4M3 : Fp8Format::kE5M2; }

const nlohmann::json& hif8_golden() {
  static const nlohmann::json j = [] {
    std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/quant_states/hif8_golden.json");
    GALE_CHECK(in.good()) << "missing tests/data/reference/quant_states/hif8_golden.json";
    return nlohmann::json::parse(in);
  }();
  return j;
}

// A moment's quantised piece as the optimizer makes it: fp8 and mxfp8 exp_avg E4M3 / exp_avg_sq
// E5M2; hif8 both HiF8 with MindSpeed's targets 15 / 224.
QuantStateRef piece(uint8_t* codes, uint8_t* scales, QuantMode mode, bool second) {
  if (mode == QuantMode::kHiF8)
    return QuantStateRef{codes, scales, Fp8Format::kHiF8, second ? kHiF8TargetExpAvgSq : kHiF8TargetExpAvg};
  return QuantStateRef{codes, scales, second ? Fp8Format::kE5M2 : Fp8Format::kE4M3};
}
const char* mode_name(QuantMode mode) {
  return mode == QuantMode::kLinear ? "fp8" : mode == QuantMode::kMx ? "mxfp8" : "hif8";
}

// All 256 HiF8 codes: the value of each is the fixture's (decoded there from the field table), and
// encoding it gives the code back (NaN → 0x80, ±Inf → 0x6F/0xEF); the decode table is the same.
TEST(QuantStates, HiF8EveryCodeRoundTrips) {
  const nlohmann::json& dec = hif8_golden()["decode"];
  ASSERT_EQ(dec.size(), 256u);
  const float* table = fp8_decode_table(Fp8Format::kHiF8);
  int finite = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = hif8_decode(static_cast<uint8_t>(c));
    if (dec[static_cast<size_t>(c)].is_null()) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
    } else {
      EXPECT_EQ(bits(v), dec[static_cast<size_t>(c)].get<uint32_t>()) << "code " << c;
    }
    EXPECT_EQ(int{hif8_encode(v)}, c) << "code " << c << " value " << v;
    EXPECT_EQ(int{fp8_encode(v, Fp8Format::kHiF8)}, c) << "code " << c;
    EXPECT_EQ(bits(table[c]), bits(v)) << "code " << c;
    finite += std::isfinite(v);
  }
  EXPECT_EQ(finite, 253);  // all but NaN and ±Inf
  EXPECT_EQ(hif8_decode(0x6E), 32768.0f);
  EXPECT_EQ(fp8_max(Fp8Format::kHiF8), 32768.0f);
  EXPECT_EQ(hif8_decode(0x01), std::ldexp(1.0f, -22));
  EXPECT_EQ(hif8_decode(0x08), 1.0f);
  EXPECT_EQ(hif8_decode(0xEF), -INFINITY);
}

// Encoding at every mantissa-width boundary (each pair of neighbouring values, their tie and the
// floats either side of it), zero, denormals, saturation, Inf and NaN, against the numpy fixture.
TEST(QuantStates, HiF8CodesMatchTheFixture) {
  const nlohmann::json& e = hif8_golden()["encode"];
  ASSERT_GT(e["x"].size(), 1000u);
  for (size_t i = 0; i < e["x"].size(); ++i) {
    const float x = from_bits(e["x"][i].get<uint32_t>());
    EXPECT_EQ(int{hif8_encode(x)}, e["codes"][i].get<int>()) << "x = " << x << " bits " << bits(x);
  }
  // Hand-checked anchors: ties go away from zero at each mantissa width.
  EXPECT_EQ(hif8_decode(hif8_encode(1.0625f)), 1.125f);     // M3 tie (1 + 1/16)
  EXPECT_EQ(hif8_decode(hif8_encode(-1.0625f)), -1.125f);
  EXPECT_EQ(hif8_decode(hif8_encode(18.0f)), 20.0f);         // M2 tie at 2^4 (16 + 2)
  EXPECT_EQ(hif8_decode(hif8_encode(320.0f)), 384.0f);       // M1 tie at 2^8 (256 + 64)
  EXPECT_EQ(hif8_decode(hif8_encode(0x1.8p-20f)), 0x1p-19f);  // denormal tie
  EXPECT_EQ(hif8_encode(0x1p-23f), 0x01);                     // half the smallest denormal rounds up
  EXPECT_EQ(hif8_encode(-0x1.fffffep-24f), 0x00);             // below it: the only zero (never 0x80)
  EXPECT_EQ(hif8_encode(40959.0f), 0x6E);
  EXPECT_EQ(hif8_encode(1e30f), 0x6E);                        // finite overflow saturates
  EXPECT_EQ(hif8_encode(-INFINITY), 0xEF);
  EXPECT_EQ(hif8_encode(NAN), 0x80);
}

TEST(QuantStates, HiF8BlocksMatchTheFixture) {
  for (const nlohmann::json& c : hif8_golden()["cases"]) {
    const QuantLayout layout{QuantMode::kHiF8, c["block"].get<int64_t>(), c["first"].get<int64_t>()};
    const float target = c["target"].get<float>();
    const std::string what = "hif8 target " + std::to_string(target) + " block " + std::to_string(layout.block) +
                             " first " + std::to_string(layout.first);
    std::vector<float> x;
    for (const auto& b : c["x"]) x.push_back(from_bits(b.get<uint32_t>()));
    const int64_t n = static_cast<int64_t>(x.size());
    const int64_t blocks = quant_num_blocks(n, layout);
    ASSERT_EQ(blocks, static_cast<int64_t>(c["scales"].size())) << what;
    std::vector<uint8_t> codes(x.size()), scales(static_cast<size_t>(blocks * quant_scale_bytes(QuantMode::kHiF8)));
    const QuantStateRef ref{codes.data(), scales.data(), Fp8Format::kHiF8, target};
    quantise_state_ref(x.data(), n, layout, ref);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(int{codes[i]}, c["codes"][i].get<int>()) << what << " element " << i;
    for (int64_t b = 0; b < blocks; ++b) {
      uint32_t sc;
      std::memcpy(&sc, scales.data() + 4 * b, 4);
      EXPECT_EQ(sc, c["scales"][b].get<uint32_t>()) << what << " block " << b;
    }
    std::vector<float> back(x.size());
    dequantise_state_ref(ref, n, layout, back.data());
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(bits(back[i]), c["dequantised"][i].get<uint32_t>()) << what << " element " << i;
  }
}

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
                        {{QuantMode::kMx, 32, 13}, 70001},
                        {{QuantMode::kHiF8, 128, 128}, 1000},
                        {{QuantMode::kHiF8, 64, 5}, 333}};
  for (const Case& c : cases) {
    const int64_t n = c.n, blocks = quant_num_blocks(n, c.layout);
    const int64_t sb = blocks * quant_scale_bytes(c.layout.mode);
    std::vector<float> p_ref = testing::random_vector(n, 1), p = p_ref;
    // Moments start from a quantised nonzero state (as after some steps).
    std::vector<uint8_t> mc(n), vc(n), ms(sb), vs(sb);
    std::vector<float> m0 = testing::random_vector(n, 2, 1e-2f), v0(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v0[i] = m0[i] * m0[i] * 3.0f;
    const QuantMode mode = c.layout.mode;
    const QuantStateRef m = piece(mc.data(), ms.data(), mode, false), v = piece(vc.data(), vs.data(), mode, true);
    quantise_state_ref(m0.data(), n, c.layout, m);
    quantise_state_ref(v0.data(), n, c.layout, v);
    std::vector<uint8_t> mc2 = mc, vc2 = vc, ms2 = ms, vs2 = vs;
    const QuantStateRef m2 = piece(mc2.data(), ms2.data(), mode, false), v2 = piece(vc2.data(), vs2.data(), mode, true);
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
  for (QuantMode mode : {QuantMode::kLinear, QuantMode::kMx, QuantMode::kHiF8}) {
    const int64_t block = mode == QuantMode::kMx ? 32 : 128;
    const QuantLayout layout{mode, block, block};
    const int64_t sb = quant_num_blocks(n, layout) * quant_scale_bytes(mode);
    std::vector<float> p32 = testing::random_vector(n, 3), p = p32, m32(n, 0.0f), v32(n, 0.0f);
    std::vector<uint8_t> mc(n), vc(n), ms(sb), vs(sb);
    const QuantStateRef m = piece(mc.data(), ms.data(), mode, false), v = piece(vc.data(), vs.data(), mode, true);
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
    EXPECT_LT(worst, 2e-3) << mode_name(mode);
    EXPECT_GT(worst, 0.0);
    std::printf("%s: worst parameter difference from f32 AdamW after 20 steps %.3g\n", mode_name(mode), worst);
  }
}

// The shared E8M0 rule (fp8_codec.h) is clamp(ilogb(amax) − emax, −127, 127) on every float
// exponent, subnormals and +inf included, and −127 for 0 (what quant_states.cc computed with libm).
TEST(QuantStates, E8M0ExponentIsTheIlogbRule) {
  for (int emax : {2, 8, 15}) {
    EXPECT_EQ(fp8::e8m0_exponent(0.0f, emax), -127);
    EXPECT_EQ(fp8::e8m0_exponent(INFINITY, emax), 127);
    for (uint32_t e = 0; e < 255; ++e)
      for (uint32_t mant : {1u, 2u, 0x400000u, 0x7FFFFFu, 0x12345u, 0u}) {
        const float x = from_bits((e << 23) | mant);
        if (x == 0.0f) continue;
        const int want = std::clamp(std::ilogb(x) - emax, -127, 127);
        EXPECT_EQ(fp8::e8m0_exponent(x, emax), want) << "x " << x << " emax " << emax;
      }
  }
  for (int k = -127; k <= 127; ++k) EXPECT_EQ(fp8::pow2(k), std::ldexp(1.0f, k)) << k;
}

// Values that exercise every branch of the codec: zeros (whole zero blocks), f32 subnormals, a wide
// spread of magnitudes inside a block (FP8 subnormals after scaling), values whose squares overflow
// (saturation, infinite amax), and ordinary ones; kind = (i / 41) % 6 so blocks mix kinds.
float edge_value(int64_t i, uint64_t seed, bool nonneg) {
  uint64_t z = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
  z ^= z >> 29;
  const float u = static_cast<float>(z >> 40) / static_cast<float>(1 << 24);  // [0, 1)
  const float sign = nonneg || (z & 1u) ? 1.0f : -1.0f;
  const int spread = static_cast<int>((z >> 8) % 64);
  switch ((i / 41) % 6) {
    case 0: return 0.0f;
    case 1: return sign * u * 1e-39f;                           // f32 subnormal
    case 2: return sign * std::ldexp(0.5f + u, spread - 50);    // 2^-50 .. 2^13 in one block
    case 3: return sign * (0.5f + u) * 2e19f;                   // squares near FLT_MAX
    case 4: return sign * (0.5f + u) * 3e30f;                   // squares overflow
    default: return sign * (u - 0.5f) * 1e-2f;
  }
}

// The two E4M3 users agree: --qat-scheme's MXFP8 fake quantiser (mx_quant.h) gives, for every
// element, decode(encode(x · 2^−X)) · 2^X with this file's codec and the shared E8M0 exponent X
// (ties, subnormal elements, saturation, signed zeros, tails; blocks without Inf/NaN).
TEST(QuantStates, E4M3CodecAgreesWithTheMxFakeQuantiser) {
  const int64_t rows = 37, cols = 100, block = 32;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float u = edge_value(i, 5, false);
    x[static_cast<size_t>(i)] = std::isfinite(u) && std::fabs(u) < 1e30f ? u : 0.0f;
  }
  for (int64_t i = 0; i < rows * cols; i += 7) x[static_cast<size_t>(i)] = std::ldexp(1.0f + 0.0625f, -(i % 30));  // ties
  x[5] = -0.0f;
  std::vector<float> fake(x.size());
  mx_fake_quant(x.data(), fake.data(), rows, cols, block, MxElement::kFp8E4M3);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += block) {
      const float* xb = x.data() + r * cols + c0;
      const int64_t len = std::min(block, cols - c0);
      float amax = 0.0f;
      for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const int X = fp8::e8m0_exponent(amax, fp8::kE4M3.emax);
      for (int64_t i = 0; i < len; ++i) {
        const float want = amax == 0.0f ? xb[i]
                                        : fp8_decode(fp8_encode(xb[i] * fp8::pow2(-X), Fp8Format::kE4M3),
                                                     Fp8Format::kE4M3) * fp8::pow2(X);
        ASSERT_EQ(bits(fake[static_cast<size_t>(r * cols + c0 + i)]), bits(want)) << "row " << r << " col " << c0 + i;
      }
    }
}

// Every ISA build of the quantiser, the dequantiser and the fused AdamW against the reference,
// bit for bit (parameters, codes, scales, dequantised values): both modes, pieces whose first block is cut (a shard that starts inside a block), tails
// shorter than a vector, and the edge values above in gradients and moments.
TEST(QuantStates, EveryIsaMatchesTheReferenceOnEdgeCases) {
  struct Case {
    QuantLayout layout;
    int64_t n;
  };
  const Case cases[] = {{{QuantMode::kLinear, 128, 128}, 1},    {{QuantMode::kLinear, 128, 37}, 1003},
                        {{QuantMode::kLinear, 64, 63}, 4099},   {{QuantMode::kLinear, 7, 3}, 131},
                        {{QuantMode::kLinear, 1000, 1}, 2500},  {{QuantMode::kMx, 32, 32}, 15},
                        {{QuantMode::kMx, 32, 1}, 1001},        {{QuantMode::kMx, 32, 17}, 4097},
                        {{QuantMode::kMx, 128, 100}, 777},      {{QuantMode::kMx, 5, 5}, 203},
                        {{QuantMode::kHiF8, 128, 128}, 1},      {{QuantMode::kHiF8, 128, 37}, 1003},
                        {{QuantMode::kHiF8, 64, 63}, 4099},     {{QuantMode::kHiF8, 7, 3}, 131},
                        {{QuantMode::kHiF8, 1000, 1}, 2500}};
  // How often the reference produced each edge (the inputs must reach them): FP8 subnormal codes,
  // saturated codes, all-zero linear blocks (scale 1), overflowing linear scales (FLT_MAX), and
  // clamped E8M0 exponents at either end.
  int64_t subnormal = 0, saturated = 0, unit_scale = 0, max_scale = 0, e8m0_low = 0, e8m0_high = 0;
  // HiF8: denormal codes, zero codes next to nonzero ones, zero-block scales (1 / T) and FLT_MAX / T.
  int64_t hif8_denormal = 0, hif8_zero = 0, hif8_zero_scale = 0, hif8_max_scale = 0;
  for (int tier = 0; tier <= static_cast<int>(hardware_isa()); ++tier) {
    const Isa isa = static_cast<Isa>(tier);
    for (const Case& c : cases) {
      const int64_t n = c.n, sb = quant_num_blocks(n, c.layout) * quant_scale_bytes(c.layout.mode);
      std::vector<float> p_ref(static_cast<size_t>(n)), m0(p_ref.size()), v0(p_ref.size());
      for (int64_t i = 0; i < n; ++i) {
        p_ref[i] = edge_value(i, 1, false);
        m0[i] = edge_value(i + 7, 2, false) * 1e-3f;
        v0[i] = edge_value(i + 13, 3, true) * 1e-3f;
      }
      std::vector<float> p = p_ref;
      const QuantMode mode = c.layout.mode;
      std::vector<uint8_t> mc(p.size()), vc(p.size()), ms(sb), vs(sb);
      const QuantStateRef m = piece(mc.data(), ms.data(), mode, false), v = piece(vc.data(), vs.data(), mode, true);
      quantise_state_ref(m0.data(), n, c.layout, m);
      quantise_state_ref(v0.data(), n, c.layout, v);
      std::vector<uint8_t> mc2(p.size()), vc2(p.size()), ms2(sb), vs2(sb);
      const QuantStateRef m2 = piece(mc2.data(), ms2.data(), mode, false),
                          v2 = piece(vc2.data(), vs2.data(), mode, true);
      // The quantiser and dequantiser of this ISA build first.
      const std::string shape = std::string(isa_name(isa)) + " " + mode_name(mode) +
                                " n " + std::to_string(n) + " first " + std::to_string(c.layout.first);
      quantise_state_isa(isa, m0.data(), n, c.layout, m2);
      quantise_state_isa(isa, v0.data(), n, c.layout, v2);
      ASSERT_EQ(mc, mc2) << shape;
      ASSERT_EQ(vc, vc2) << shape;
      ASSERT_EQ(ms, ms2) << shape;
      ASSERT_EQ(vs, vs2) << shape;
      for (const auto& [ref, mine] : {std::pair{m, m2}, std::pair{v, v2}}) {
        std::vector<float> want(p.size()), got(p.size());
        dequantise_state_ref(ref, n, c.layout, want.data());
        dequantise_state_isa(isa, mine, n, c.layout, got.data());
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits(got[i]), bits(want[i])) << shape << " dequantised " << i;
      }
      AdamWHyper h;
      h.lr = 1e-3f;
      h.weight_decay = 0.1f;
      for (int step = 1; step <= 3; ++step) {
        h.step = step;
        h.grad_scale = step == 2 ? 0.25f : 1.0f;
        std::vector<float> g(p.size());
        for (int64_t i = 0; i < n; ++i) g[i] = edge_value(i + 29 * step, 10 + static_cast<uint64_t>(step), false);
        adamw_step_quantised_ref(p_ref.data(), g.data(), m, v, n, c.layout, h);
        adamw_step_quantised_isa(isa, p.data(), g.data(), m2, v2, n, c.layout, h);
        const std::string what = std::string(isa_name(isa)) + " " + mode_name(mode) +
                                 " n " + std::to_string(n) + " block " + std::to_string(c.layout.block) + " first " +
                                 std::to_string(c.layout.first) + " step " + std::to_string(step);
        for (int64_t i = 0; i < n; ++i)  // a NaN parameter may differ in payload, never in NaN-ness
          if (!(std::isnan(p[i]) && std::isnan(p_ref[i])))
            ASSERT_EQ(bits(p[i]), bits(p_ref[i])) << what << " parameter " << i;
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(int{mc2[i]}, int{mc[i]}) << what << " exp_avg code " << i;
          ASSERT_EQ(int{vc2[i]}, int{vc[i]}) << what << " exp_avg_sq code " << i;
        }
        ASSERT_EQ(ms, ms2) << what;
        ASSERT_EQ(vs, vs2) << what;
        if (mode == QuantMode::kHiF8) {
          for (int64_t i = 0; i < n; ++i) {
            hif8_denormal += ((mc[i] & 0x78) == 0 && (mc[i] & 7) != 0) + ((vc[i] & 0x78) == 0 && (vc[i] & 7) != 0);
            hif8_zero += (mc[i] == 0) + (vc[i] == 0);
          }
          for (int64_t b = 0; b < quant_num_blocks(n, c.layout); ++b) {
            float sm, sv;
            std::memcpy(&sm, ms.data() + 4 * b, 4);
            std::memcpy(&sv, vs.data() + 4 * b, 4);
            hif8_zero_scale += (sm == 1.0f / kHiF8TargetExpAvg) + (sv == 1.0f / kHiF8TargetExpAvgSq);
            hif8_max_scale += (sm == FLT_MAX / kHiF8TargetExpAvg) + (sv == FLT_MAX / kHiF8TargetExpAvgSq);
          }
          continue;
        }
        for (int64_t i = 0; i < n; ++i) {
          subnormal += (mc[i] & 0x78) == 0 && (mc[i] & 7) != 0;
          saturated += (mc[i] & 0x7F) == 0x7E || (vc[i] & 0x7F) == 0x7B;
        }
        for (int64_t b = 0; b < quant_num_blocks(n, c.layout); ++b) {
          if (c.layout.mode == QuantMode::kLinear) {
            float sm;
            std::memcpy(&sm, ms.data() + 4 * b, 4);
            unit_scale += sm == 1.0f;
            max_scale += sm == FLT_MAX;
          } else {
            e8m0_low += ms[b] == 0 || vs[b] == 0;
            e8m0_high += ms[b] == 254 || vs[b] == 254;
          }
        }
      }
    }
  }
  EXPECT_GT(subnormal, 0);
  EXPECT_GT(saturated, 0);
  EXPECT_GT(unit_scale, 0);
  EXPECT_GT(max_scale, 0);
  EXPECT_GT(e8m0_low, 0);
  EXPECT_GT(e8m0_high, 0);
  EXPECT_GT(hif8_denormal, 0);
  EXPECT_GT(hif8_zero, 0);
  EXPECT_GT(hif8_zero_scale, 0);
  EXPECT_GT(hif8_max_scale, 0);
  std::printf("hif8 edges reached: %lld denormal codes, %lld zero codes, %lld zero-block scales, %lld FLT_MAX/T scales\n",
              static_cast<long long>(hif8_denormal), static_cast<long long>(hif8_zero),
              static_cast<long long>(hif8_zero_scale), static_cast<long long>(hif8_max_scale));
  std::printf("edges reached: %lld subnormal codes, %lld saturated, %lld unit scales, %lld FLT_MAX scales, "
              "%lld E8M0 -127, %lld E8M0 127\n",
              static_cast<long long>(subnormal), static_cast<long long>(saturated), static_cast<long long>(unit_scale),
              static_cast<long long>(max_scale), static_cast<long long>(e8m0_low), static_cast<long long>(e8m0_high));
}

}  // namespace
}  // namespace gale
