// The f32 ↔ (bf16, residual, tie bit) split of --reuse-fp32-param: b is exactly the RNE bf16 value
// the GEMM copy holds, and every f32 but a NaN comes back bit for bit (ties of both parities,
// denormals, ±0, values near FLT_MAX that round to ±Inf, ±Inf); a NaN stays a NaN of its sign.
#include "core/bf16_split.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "core/rng.h"

namespace gale {
namespace {

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// Splits and merges `u`; checks b against float_to_bf16 and the round trip (NaN: a NaN of the same
// sign). Returns whether the tie bit was set.
bool expect_round_trip(uint32_t u) {
  const float f = from_bits(u);
  uint16_t b = 0, r = 0;
  const bool tie = split_f32_to_bf16_residual(f, &b, &r);
  EXPECT_EQ(b, float_to_bf16(f).bits) << std::hex << u;
  const float back = merge_bf16_residual_to_f32(b, r, tie);
  if (std::isnan(f)) {
    EXPECT_TRUE(std::isnan(back)) << std::hex << u;
    EXPECT_EQ(bits_of(back) >> 31, u >> 31) << std::hex << u;
  } else {
    EXPECT_EQ(bits_of(back), u) << std::hex << u << " came back as " << bits_of(back);
  }
  return tie;
}

TEST(Bf16Split, EveryLowHalfOfSelectedHighHalves) {
  // Even and odd t, ±0, the smallest normals, denormals, 1.0, the largest finite values (t 0x7f7f
  // rounds up to Inf), Inf/NaN patterns, in both signs.
  for (uint32_t t : {0x0000u, 0x0001u, 0x0002u, 0x007fu, 0x0080u, 0x0081u, 0x3f80u, 0x3f81u, 0x4b00u, 0x7f7eu, 0x7f7fu,
                     0x7f80u, 0x7fc0u, 0x7fffu}) {
    for (uint32_t sign : {0u, 0x8000u}) {
      int ties = 0;
      for (uint32_t low = 0; low < 0x10000u; ++low) ties += expect_round_trip(((t | sign) << 16) | low);
      // Exactly one pattern per even finite t is a tie that rounds down.
      const bool finite = t < 0x7f80u;
      EXPECT_EQ(ties, finite && t % 2 == 0 ? 1 : 0) << std::hex << t;
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(Bf16Split, RandomPatterns) {
  for (uint64_t i = 0; i < 2000000; ++i) {
    expect_round_trip(static_cast<uint32_t>(mix_stream(i, 0x5eed)));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(Bf16Split, CornerCases) {
  // Ties: t even rounds down (the tie bit), t odd rounds up (r = 0x8000, no bit).
  uint16_t b = 0, r = 0;
  EXPECT_TRUE(split_f32_to_bf16_residual(from_bits(0x3f808000u), &b, &r));
  EXPECT_EQ(b, 0x3f80u);
  EXPECT_EQ(r, 0x8000u);
  EXPECT_FALSE(split_f32_to_bf16_residual(from_bits(0x3f7f8000u), &b, &r));
  EXPECT_EQ(b, 0x3f80u);  // the same (b, r): only the tie bit tells them apart
  EXPECT_EQ(r, 0x8000u);
  // FLT_MAX rounds to +Inf in bf16 and still comes back.
  const float max = std::numeric_limits<float>::max();
  EXPECT_FALSE(split_f32_to_bf16_residual(max, &b, &r));
  EXPECT_EQ(b, 0x7f80u);
  EXPECT_EQ(merge_bf16_residual_to_f32(b, r, false), max);
  EXPECT_FALSE(split_f32_to_bf16_residual(-max, &b, &r));
  EXPECT_EQ(b, 0xff80u);
  EXPECT_EQ(merge_bf16_residual_to_f32(b, r, false), -max);
  for (float f : {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(), std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), 1.0f, -3.14159265f, 1e-30f, 3e38f})
    expect_round_trip(bits_of(f));
  // A signalling NaN comes back quiet, with its sign.
  const float snan = from_bits(0xff800001u);
  EXPECT_FALSE(split_f32_to_bf16_residual(snan, &b, &r));
  EXPECT_TRUE(std::isnan(merge_bf16_residual_to_f32(b, r, false)));
  EXPECT_EQ(bits_of(merge_bf16_residual_to_f32(b, r, false)), 0xffc00001u);
}

}  // namespace
}  // namespace gale
