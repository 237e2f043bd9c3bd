// ParamBuffer under --reuse-fp32-param: linear weights stored as bf16 copy + residual give back
// their f32 values bit for bit through any range of the flat buffer, their bf16 copy is the one a
// plain --bf16 buffer holds, and the buffer takes 2 bytes per parameter less.
#include "model/params.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "model/param_builders.h"

namespace gale {
namespace {

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// A weight [6, 5] and a frozen weight [3, 3] marked as linear weights, a bias [7] and a second
// weight [4, 4] between them.
ParamBuffer make_buffer() {
  ParamBuffer pb;
  pb.add(gemm_weight(make_param_spec("w", {6, 5}, InitKind::kNormal, 0.02f, true)));
  pb.add(make_param_spec("b", {7}, InitKind::kZeros, 0.0f, false));
  const int frozen = pb.add(gemm_weight(make_param_spec("frozen", {3, 3}, InitKind::kNormal, 0.02f, true)));
  pb.add(gemm_weight(make_param_spec("w2", {4, 4}, InitKind::kNormal, 0.02f, true)));
  pb.freeze(frozen);
  pb.finalize();
  return pb;
}

// Values with the corner cases: ties rounding down (even t) and up (odd t), ±0, a denormal, a value
// that rounds to Inf in bf16, and random patterns.
std::vector<float> corner_values(int64_t n, uint64_t seed) {
  const uint32_t special[] = {0x3f808000u, 0x3f7f8000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x7f7fffffu,
                              0xbc008000u, 0x7f800000u};
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(mix_stream(seed, static_cast<uint64_t>(i)));
    if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu;  // no NaN
    v[static_cast<size_t>(i)] = from_bits(i % 3 == 0 ? special[(i / 3) % 8] : u);
  }
  return v;
}

TEST(ParamBufferReuseFp32, SplitStorageRoundTripsEveryRange) {
  ParamBuffer plain = make_buffer(), reuse = make_buffer();
  const int64_t n = plain.numel();
  const std::vector<float> v = corner_values(n, 7);
  std::memcpy(plain.flat_params().data<float>(), v.data(), static_cast<size_t>(n) * sizeof(float));
  std::memcpy(reuse.flat_params().data<float>(), v.data(), static_cast<size_t>(n) * sizeof(float));
  plain.enable_gemm_copy(DType::kBF16);
  reuse.enable_gemm_copy(DType::kBF16, /*reuse_fp32=*/true);

  EXPECT_TRUE(reuse.reuses_fp32());
  EXPECT_TRUE(reuse.is_split(reuse.find("w")));
  EXPECT_TRUE(reuse.is_split(reuse.find("w2")));
  EXPECT_FALSE(reuse.is_split(reuse.find("b")));       // read in f32 by the model
  EXPECT_FALSE(reuse.is_split(reuse.find("frozen")));  // no optimizer, no master
  EXPECT_GT(reuse.num_split_ties(), 0);
  EXPECT_EQ(plain.value_bytes(), 6 * n);
  EXPECT_EQ(reuse.value_bytes(), 4 * n + 8 * reuse.num_split_ties());

  // The GEMM copy of a split weight is the plain buffer's bf16 copy.
  for (const char* name : {"w", "w2"}) {
    const int id = reuse.find(name);
    const bf16* a = plain.param_bf16_data(id);
    const bf16* b = reuse.param_bf16_data(id);
    for (int64_t i = 0; i < reuse.spec(id).local_numel(); ++i) ASSERT_EQ(a[i].bits, b[i].bits) << name << " " << i;
  }
  EXPECT_EQ(reuse.param_bf16_data(reuse.find("b")), nullptr);

  // Every range, across parameter boundaries, reads back bit for bit.
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t lo = 0; lo < n; lo += 5)
    for (int64_t hi = lo + 1; hi <= n; hi += 7) {
      reuse.read_values(lo, hi - lo, out.data());
      for (int64_t i = lo; i < hi; ++i) ASSERT_EQ(bits_of(out[i - lo]), bits_of(v[i])) << lo << " " << hi << " " << i;
    }

  // Writes of pieces (new values, other ties) replace the values and the tie list of that piece.
  std::vector<float> w = v;
  const std::vector<float> fresh = corner_values(n, 11);
  for (int64_t lo = 3; lo < n; lo += 13) {
    const int64_t count = std::min<int64_t>(9, n - lo);
    reuse.write_values(lo, count, fresh.data() + lo);
    plain.write_values(lo, count, fresh.data() + lo);
    std::copy(fresh.begin() + lo, fresh.begin() + lo + count, w.begin() + lo);
  }
  reuse.read_values(0, n, out.data());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(out[i]), bits_of(w[i])) << i;
  for (int id = 0; id < reuse.size(); ++id) {
    const Tensor t = reuse.param_values(id);
    for (int64_t i = 0; i < reuse.spec(id).local_numel(); ++i)
      ASSERT_EQ(bits_of(t.data<float>()[i]), bits_of(w[reuse.spec(id).offset + i]));
    if (!reuse.is_split(id)) continue;
    for (int64_t i = 0; i < reuse.spec(id).local_numel(); ++i)
      ASSERT_EQ(reuse.param_bf16_data(id)[i].bits, plain.param_bf16_data(id)[i].bits);
  }
}

TEST(ParamBufferReuseFp32, InitialisesLikeAPlainBuffer) {
  ParamBuffer plain = make_buffer(), reuse = make_buffer();
  plain.enable_gemm_copy(DType::kBF16);
  reuse.enable_gemm_copy(DType::kBF16, true);
  plain.initialize(42);
  reuse.initialize(42);
  std::vector<float> a(static_cast<size_t>(plain.numel())), b(a.size());
  plain.read_values(0, plain.numel(), a.data());
  reuse.read_values(0, reuse.numel(), b.data());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bits_of(a[i]), bits_of(b[i])) << i;
}

}  // namespace
}  // namespace gale
