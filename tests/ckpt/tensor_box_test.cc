// Box intersection and region copies between differently laid-out pieces of one global tensor.
#include "ckpt/tensor_box.h"

#include <gtest/gtest.h>

#include <random>

namespace gale {
namespace {

TEST(TensorBox, IntersectAndContain) {
  Box a{{0, 2}, {4, 4}};
  Box b{{3, 5}, {4, 4}};
  std::optional<Box> i = intersect_boxes(a, b);
  ASSERT_TRUE(i.has_value());
  EXPECT_EQ(*i, (Box{{3, 5}, {1, 1}}));
  EXPECT_EQ(box_string(*i), "[3:4, 5:6]");
  EXPECT_FALSE(intersect_boxes(a, Box{{4, 0}, {1, 10}}).has_value());  // touching is not overlapping
  EXPECT_TRUE(box_contains(a, *i) && box_contains(b, *i));
  EXPECT_FALSE(box_contains(a, b));
  EXPECT_EQ(whole_box({2, 3}), (Box{{0, 0}, {2, 3}}));
  EXPECT_EQ(box_string(whole_box({})), "[]");
}

// Global tensor G of shape [5, 7, 6] with G[i] = i; random pieces and destinations; every copied
// element must equal the global value at its coordinates.
TEST(TensorBox, RegionCopyMatchesGlobalIndexing) {
  const Shape global = {5, 7, 6};
  std::mt19937 rng(7);
  auto random_box = [&] {
    Box b;
    for (int64_t n : global) {
      int64_t lo = std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
      int64_t hi = std::uniform_int_distribution<int64_t>(lo + 1, n)(rng);
      b.offsets.push_back(lo);
      b.shape.push_back(hi - lo);
    }
    return b;
  };
  auto global_index = [&](int64_t i, int64_t j, int64_t k) { return (i * global[1] + j) * global[2] + k; };
  int copies = 0;
  for (int trial = 0; trial < 600; ++trial) {
    Box src = random_box(), dst = random_box();
    std::optional<Box> region = intersect_boxes(src, dst);
    if (!region) continue;
    ++copies;
    std::vector<float> s(static_cast<size_t>(src.numel()));
    for (int64_t i = 0; i < src.shape[0]; ++i)
      for (int64_t j = 0; j < src.shape[1]; ++j)
        for (int64_t k = 0; k < src.shape[2]; ++k)
          s[static_cast<size_t>((i * src.shape[1] + j) * src.shape[2] + k)] =
              static_cast<float>(global_index(src.offsets[0] + i, src.offsets[1] + j, src.offsets[2] + k));
    std::vector<double> d(static_cast<size_t>(dst.numel()), -1.0);
    ASSERT_TRUE(copy_box_region(s.data(), StDType::kF32, src, d.data(), DType::kF64, dst, *region, "t").ok());
    for (int64_t i = 0; i < dst.shape[0]; ++i)
      for (int64_t j = 0; j < dst.shape[1]; ++j)
        for (int64_t k = 0; k < dst.shape[2]; ++k) {
          int64_t gi = dst.offsets[0] + i, gj = dst.offsets[1] + j, gk = dst.offsets[2] + k;
          bool inside = box_contains(*region, Box{{gi, gj, gk}, {1, 1, 1}});
          double got = d[static_cast<size_t>((i * dst.shape[1] + j) * dst.shape[2] + k)];
          ASSERT_EQ(got, inside ? static_cast<double>(global_index(gi, gj, gk)) : -1.0)
              << "trial " << trial << " src " << box_string(src) << " dst " << box_string(dst) << " at " << gi << ","
              << gj << "," << gk;
        }
  }
  EXPECT_GT(copies, 60);
}

TEST(TensorBox, ScalarAndConvertingCopies) {
  float x = 3.0f;
  float y = 0.0f;
  ASSERT_TRUE(copy_box_region(&x, StDType::kF32, Box{}, &y, DType::kF32, Box{}, Box{}, "s").ok());
  EXPECT_EQ(y, 3.0f);
  uint16_t b[2] = {float_to_bf16(1.5f).bits, float_to_bf16(-2.0f).bits};
  float out[2] = {0, 0};
  ASSERT_TRUE(
      copy_box_region(b, StDType::kBF16, whole_box({2}), out, DType::kF32, whole_box({2}), whole_box({2}), "b").ok());
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
  Status s =
      copy_box_region(out, StDType::kF32, whole_box({2}), b, DType::kI32, whole_box({2}), whole_box({2}), "named");
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("named"), std::string::npos);
}

}  // namespace
}  // namespace gale
