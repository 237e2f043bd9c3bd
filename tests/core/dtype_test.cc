// f16 (IEEE binary16) conversions of core/dtype.h: exact widening of every half, and rounding to
// nearest even with Megatron-relevant edges (65504, the overflow to infinity, subnormals).
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace gale {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The value of half `h` computed independently: (-1)^s · 2^(e-15) · (1 + m/1024), or subnormal.
double half_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return s ? -mag : mag;
}

TEST(F16, EveryFiniteHalfWidensExactlyAndRoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const f16 h{static_cast<uint16_t>(bits)};
    const float f = f16_to_float(h);
    const int e = (bits >> 10) & 0x1f;
    if (e == 0x1f) {
      if ((bits & 0x3ff) == 0) {
        EXPECT_TRUE(std::isinf(f)) << bits;
      } else {
        EXPECT_TRUE(std::isnan(f)) << bits;
      }
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), half_value(static_cast<uint16_t>(bits))) << bits;
    ASSERT_EQ(float_to_f16(f).bits, bits) << bits;  // -0 stays -0
  }
}

TEST(F16, RoundsToNearestEvenAndOverflowsToInfinity) {
  EXPECT_EQ(float_to_f16(65504.0f).bits, 0x7bff);  // the largest half
  EXPECT_EQ(float_to_f16(65519.996f).bits, 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7c00);  // the tie above 65504 rounds to even: infinity
  EXPECT_EQ(float_to_f16(-1e9f).bits, 0xfc00);
  EXPECT_EQ(float_to_f16(INFINITY).bits, 0x7c00);
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f).bits, 0x3c00);        // tie, even below: down
  EXPECT_EQ(float_to_f16(1.0f + 3 * 0x1p-11f).bits, 0x3c02);    // tie, odd below: up
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f + 0x1p-20f).bits, 0x3c01);  // above the tie: up
  EXPECT_EQ(float_to_f16(0x1p-14f).bits, 0x0400);               // the smallest normal
  EXPECT_EQ(float_to_f16(0x1p-24f).bits, 0x0001);               // the smallest subnormal
  EXPECT_EQ(float_to_f16(0x1p-25f).bits, 0x0000);               // tie with 0: even
  EXPECT_EQ(float_to_f16(0x1.8p-25f).bits, 0x0001);
  EXPECT_EQ(float_to_f16(3 * 0x1p-25f).bits, 0x0002);           // tie between 1 and 2 steps: even
  EXPECT_EQ(float_to_f16(-0x1p-30f).bits, 0x8000);              // underflow keeps the sign
  EXPECT_EQ(float_to_f16(0x1p-14f - 0x1p-26f).bits, 0x0400);    // subnormal rounding up into the normals
  const f16 nan = float_to_f16(from_bits(0x7f800001u));         // signalling NaN: quiet NaN
  EXPECT_EQ(nan.bits & 0x7e00, 0x7e00);
  EXPECT_TRUE(std::isnan(f16_to_float(nan)));
}

TEST(F16, EveryFloatBetweenTwoHalvesGoesToTheNearer) {
  // Between consecutive positive finite halves a < b: below the midpoint -> a, above -> b, at it ->
  // the even one.
  for (uint32_t bits = 0; bits < 0x7bff; ++bits) {
    const double a = half_value(static_cast<uint16_t>(bits)), b = half_value(static_cast<uint16_t>(bits + 1));
    const float mid = static_cast<float>((a + b) / 2);  // exact in float
    ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);
    const uint16_t even = (bits & 1) ? static_cast<uint16_t>(bits + 1) : static_cast<uint16_t>(bits);
    ASSERT_EQ(float_to_f16(mid).bits, even) << bits;
    ASSERT_EQ(float_to_f16(std::nextafter(mid, 0.0f)).bits, bits) << bits;
    ASSERT_EQ(float_to_f16(std::nextafter(mid, INFINITY)).bits, bits + 1) << bits;
  }
}

}  // namespace
}  // namespace gale
