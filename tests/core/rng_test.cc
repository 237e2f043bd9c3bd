// Counter-based RNG: known Philox answer, which words uniform_at / dropout_uniform_at read, determinism, moments.
#include "core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace gale {
namespace {

TEST(Philox, MatchesRandom123KnownAnswer) {
  // Random123's kat_vectors: philox4x32-10 with counter = key = 0.
  Philox4x32 r = philox4x32(0, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

TEST(Rng, UniformAtIsWordZeroOfTheIndexBlock) {
  for (uint64_t index : {0ull, 1ull, 5ull, 0xFFFFFFFFull, 123456789012345ull}) {
    const Philox4x32 r = philox4x32(3, 9, index);
    EXPECT_EQ(uniform_at(3, 9, index), static_cast<float>(r.v[0] >> 8) / 16777216.0f);
  }
}

TEST(Rng, DropoutUniformAtUsesAllFourWordsOfABlock) {
  // Index i is word i & 3 of the block at counter i >> 2 (key = seed, counter high half = stream).
  for (uint64_t counter : {0ull, 1ull, 0xFFFFFFFFull, 0x100000000ull, (1ull << 62) - 1}) {
    const Philox4x32 r = philox4x32(~0ull, 0x1234, counter);
    for (uint64_t w = 0; w < 4; ++w) {
      const float expected = static_cast<float>(r.v[w] >> 8) / 16777216.0f;
      EXPECT_EQ(dropout_uniform_at(~0ull, 0x1234, 4 * counter + w), expected) << counter << " " << w;
    }
  }
  // Random123's known answer (counter = key = 0), word by word.
  const uint32_t kat[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
  for (uint64_t i = 0; i < 4; ++i)
    EXPECT_EQ(dropout_uniform_at(0, 0, i), static_cast<float>(kat[i] >> 8) / 16777216.0f) << i;
  // Parameter draws keep one block per index: only word 0 of block i.
  EXPECT_EQ(uniform_at(0, 0, 0), dropout_uniform_at(0, 0, 0));
  EXPECT_NE(uniform_at(0, 0, 1), dropout_uniform_at(0, 0, 1));
}

TEST(Rng, SliceEqualsSliceOfWhole) {
  std::vector<float> whole(1000), part(300);
  fill_normal(whole.data(), 1000, 0.0f, 0.02f, 1234, 7, 0);
  fill_normal(part.data(), 300, 0.0f, 0.02f, 1234, 7, 500);
  for (int i = 0; i < 300; ++i) EXPECT_EQ(part[i], whole[500 + i]);
}

TEST(Rng, NormalMoments) {
  const int n = 200000;
  std::vector<float> x(n);
  fill_normal(x.data(), n, 1.0f, 2.0f, 42, 3, 0);
  double m = 0, v = 0;
  for (float f : x) m += f;
  m /= n;
  for (float f : x) v += (f - m) * (f - m);
  v /= n;
  EXPECT_NEAR(m, 1.0, 0.02);
  EXPECT_NEAR(std::sqrt(v), 2.0, 0.02);
}

TEST(Rng, UniformRange) {
  std::vector<float> u(10000);
  fill_uniform(u.data(), 10000, 9, 1, 0);
  double m = 0;
  for (float f : u) {
    EXPECT_GE(f, 0.0f);
    EXPECT_LT(f, 1.0f);
    m += f;
  }
  EXPECT_NEAR(m / 10000, 0.5, 0.02);
}

}  // namespace
}  // namespace gale
