// core/plane_codec.h: bit-exact round trips (random, constant, denormal, NaN/Inf, negative zero,
// odd sizes and empty), the planes stored raw or coded, and what the allocator holds.
#include "core/plane_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "core/threads.h"

namespace gale {
namespace {

template <class T>
std::vector<T> round_trip(const std::vector<T>& in, int coded_planes = -1, CompressedPlanes* kept = nullptr) {
  CompressedPlanes c = compress_planes(in.data(), static_cast<int64_t>(in.size()), sizeof(T), coded_planes);
  EXPECT_EQ(c.numel, static_cast<int64_t>(in.size()));
  EXPECT_EQ(c.width, static_cast<int>(sizeof(T)));
  EXPECT_EQ(c.planes.size(), sizeof(T));
  std::vector<T> out(in.size());
  // Poison, so that a byte the decoder forgets shows.
  std::memset(out.data(), 0xA5, out.size() * sizeof(T));
  decompress_planes(c, out.data());
  if (kept) *kept = std::move(c);
  return out;
}

template <class T>
void expect_bits(const std::vector<T>& a, const std::vector<T>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)), 0);
}

std::vector<float> gaussian(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  return v;
}

// One thread codes plane by plane; several code the planes at once: both give the same planes.
TEST(PlaneCodec, RandomFloatsRoundTripAtOddSizesOnOneAndSeveralThreads) {
  const int threads = num_threads();
  for (int64_t n : {1, 2, 3, 7, 63, 64, 65, 1000, 4097, 131073}) {
    const std::vector<float> in = gaussian(n, static_cast<uint32_t>(n));
    std::vector<int64_t> sizes[2];
    for (int t : {1, 2}) {
      set_num_threads(t);
      CompressedPlanes c;
      expect_bits(in, round_trip(in, -1, &c));
      for (const Tensor& p : c.planes) sizes[t - 1].push_back(p.numel());
      expect_bits(in, round_trip(in, 1));  // sign/exponent plane only (--compress-dense level0)
      expect_bits(in, round_trip(in, 0));  // nothing coded
    }
    EXPECT_EQ(sizes[0], sizes[1]) << n;
  }
  set_num_threads(threads);
}

TEST(PlaneCodec, UniformRandomBytesStayRawAndRoundTrip) {
  std::mt19937 g(7);
  std::vector<uint32_t> in(50001);
  for (uint32_t& x : in) x = g();
  CompressedPlanes c;
  expect_bits(in, round_trip(in, -1, &c));
  for (size_t k = 0; k < c.planes.size(); ++k) EXPECT_FALSE(c.coded[k]) << "plane " << k << " is incompressible";
  EXPECT_EQ(c.stored_bytes(), c.raw_bytes());  // never larger than the input
}

TEST(PlaneCodec, ConstantAndZerosShrinkToAlmostNothing) {
  for (float v : {0.0f, -0.0f, 1.5f, std::numeric_limits<float>::infinity()}) {
    const std::vector<float> in(100000, v);
    CompressedPlanes c;
    expect_bits(in, round_trip(in, -1, &c));
    EXPECT_LT(c.stored_bytes(), 200) << v;
    for (size_t k = 0; k < c.planes.size(); ++k) EXPECT_TRUE(c.coded[k]);
  }
}

TEST(PlaneCodec, SpecialValuesRoundTripBitExactly) {
  std::vector<float> in = gaussian(3001, 3, 1e-3f);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            1e-40f,
                            -0.0f,
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::min()};
  for (size_t i = 0; i < in.size(); i += 7) in[i] = specials[(i / 7) % std::size(specials)];
  // A signalling NaN with a payload: raw bits, as a copy through float registers could quiet it.
  uint32_t snan = 0x7f800123u;
  std::memcpy(&in[5], &snan, 4);
  expect_bits(in, round_trip(in));
  // All denormals.
  std::vector<float> den(777);
  for (size_t i = 0; i < den.size(); ++i) den[i] = std::ldexp(static_cast<float>(i + 1), -149);
  expect_bits(den, round_trip(den));
}

TEST(PlaneCodec, Bf16AndOtherWidthsRoundTrip) {
  std::mt19937 g(11);
  std::vector<uint16_t> bf(12345);
  const std::vector<float> f = gaussian(12345, 5);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = float_to_bf16(f[i]).bits;
  CompressedPlanes c;
  expect_bits(bf, round_trip(bf, -1, &c));
  EXPECT_TRUE(c.coded[0]) << "the sign/exponent byte of gaussian bf16 values is compressible";
  EXPECT_LT(c.stored_bytes(), c.raw_bytes());
  std::vector<uint8_t> bytes(999);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(g() % 5);
  expect_bits(bytes, round_trip(bytes));
  std::vector<double> d(4321);
  for (double& x : d) x = std::normal_distribution<double>()(g);
  expect_bits(d, round_trip(d));
}

TEST(PlaneCodec, EmptyInputRoundTrips) {
  const std::vector<float> none;
  CompressedPlanes c;
  expect_bits(none, round_trip(none, -1, &c));
  EXPECT_EQ(c.stored_bytes(), 0);
}

// Trained-like f32 values compress: their sign/exponent plane is far from uniform.
TEST(PlaneCodec, GaussianFloatsShrinkAndThePlanesAreCounted) {
  const std::vector<float> in = gaussian(1 << 18, 9, 0.02f);
  Allocator& a = host_allocator();
  const int64_t before = a.current_bytes();
  CompressedTensor t;
  {
    Tensor x = Tensor::empty({static_cast<int64_t>(in.size())});
    std::memcpy(x.raw(), in.data(), x.nbytes());
    t = CompressedTensor::encode(x);
  }
  const int64_t held = a.current_bytes() - before;
  EXPECT_GE(held, t.stored_bytes());
  EXPECT_LT(held, t.stored_bytes() + 4 * 64);  // the planes, at the allocator's 64-byte rounding
  EXPECT_LT(t.stored_bytes(), t.raw_bytes() * 9 / 10) << "ratio " << double(t.stored_bytes()) / double(t.raw_bytes());
  EXPECT_TRUE(t.planes.coded[0]);
  const Tensor back = t.decode();
  EXPECT_EQ(back.shape(), Shape{static_cast<int64_t>(in.size())});
  EXPECT_EQ(std::memcmp(back.raw(), in.data(), back.nbytes()), 0);
}

}  // namespace
}  // namespace gale
