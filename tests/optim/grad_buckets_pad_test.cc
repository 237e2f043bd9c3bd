// --param-and-grad-buffer-pad's layout (optim/grad_buckets.h pad_grad_buckets,
// ParamBuffer::insert_padding): every bucket starts at a multiple of the alignment and is padded to
// a multiple of it (of dp·alignment with the distributed optimizer, so every shard starts aligned
// too); the buckets still tile the grown region; values and gradients move with their parameters;
// the padding is zero and its size exactly what the rule says; frozen parameters move up too.
#include <gtest/gtest.h>

#include "optim/grad_buckets.h"

namespace gale {
namespace {

// Parameters of the given element counts (1-D), registration order; the last `frozen` frozen.
// Values: parameter i's element j holds 1000·(i + 1) + j, its gradient the negative.
ParamBuffer filled_buffer(const std::vector<int64_t>& sizes, size_t frozen = 0) {
  ParamBuffer pb;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ParamSpec s;
    s.name = "p" + std::to_string(i);
    s.global_shape = {sizes[i]};
    const int id = pb.add(s);
    if (i + frozen >= sizes.size()) pb.freeze(id);
  }
  pb.finalize();
  for (int id = 0; id < pb.size(); ++id)
    for (int64_t j = 0; j < pb.spec(id).local_numel(); ++j) {
      pb.param_data(id)[j] = static_cast<float>(1000 * (id + 1) + j);
      if (pb.spec(id).trainable) pb.grad_data(id)[j] = -pb.param_data(id)[j];
    }
  return pb;
}

void expect_values_kept(const ParamBuffer& pb) {
  for (int id = 0; id < pb.size(); ++id)
    for (int64_t j = 0; j < pb.spec(id).local_numel(); ++j) {
      ASSERT_EQ(pb.param_data(id)[j], static_cast<float>(1000 * (id + 1) + j)) << pb.spec(id).name << "[" << j << "]";
      if (pb.spec(id).trainable) ASSERT_EQ(pb.grad_data(id)[j], -pb.param_data(id)[j]);
    }
}

// The padding is zero in both buffers and covers exactly the elements of no parameter.
void expect_padding_zero_and_exact(const ParamBuffer& pb) {
  std::vector<bool> owned(static_cast<size_t>(pb.numel()), false);
  for (const ParamSpec& s : pb.specs())
    for (int64_t j = 0; j < s.local_numel(); ++j) owned[static_cast<size_t>(s.offset + j)] = true;
  int64_t unowned = 0;
  for (bool o : owned) unowned += !o;
  EXPECT_EQ(unowned, pb.padding_numel());
  for (const auto& [at, count] : pb.padding())
    for (int64_t k = at; k < at + count; ++k) {
      EXPECT_FALSE(owned[static_cast<size_t>(k)]) << k;
      EXPECT_EQ(pb.flat_params().data<float>()[k], 0.0f) << k;
      EXPECT_EQ(pb.flat_grads().data<float>()[k], 0.0f) << k;
    }
}

TEST(GradBucketsPad, DistributedOptimizerBucketsAndShardsStartAligned) {
  // Offsets: p0 [0,10) p1 [10,30) p2 [30,60) p3 [60,65) p4 [65,100); buckets {p4,p3} {p2,p1} {p0}.
  ParamBuffer pb = filled_buffer({10, 20, 30, 5, 35});
  const BucketPlanOptions options{40, 3, {}};
  std::vector<GradBucket> buckets = plan_grad_buckets(pb, options);
  ASSERT_EQ(buckets.size(), 3u);
  const FlatRange region = pad_grad_buckets(&pb, &buckets, options, /*align=*/4, /*sharded=*/true);
  // Sizes 10, 50, 40 padded to multiples of 3·4 = 12: 12, 60, 48 (2 + 10 + 8 = 20 zeros).
  EXPECT_EQ(buckets[2].range, (FlatRange{0, 12}));
  EXPECT_EQ(buckets[1].range, (FlatRange{12, 72}));
  EXPECT_EQ(buckets[0].range, (FlatRange{72, 120}));
  EXPECT_EQ(region, (FlatRange{0, 120}));
  EXPECT_EQ(pb.padding_numel(), 20);
  EXPECT_EQ(pb.numel(), 120);
  EXPECT_EQ(pb.trainable_numel(), 120);
  EXPECT_EQ(buckets[0].param_ids, (std::vector<int>{4, 3}));
  EXPECT_EQ(pb.spec(1).offset, 12);
  EXPECT_EQ(pb.spec(3).offset, 72);  // p3 opens bucket 0
  for (const GradBucket& b : buckets) {
    EXPECT_EQ(b.range.begin % 4, 0);
    EXPECT_EQ(b.numel() % 12, 0);
    EXPECT_EQ(b.padded_numel, b.numel());
    for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(bucket_shard(b, 3, r).begin % 4, 0) << r;
  }
  expect_values_kept(pb);
  expect_padding_zero_and_exact(pb);
}

TEST(GradBucketsPad, PlainDataParallelBucketsStartAligned) {
  ParamBuffer pb = filled_buffer({10, 20, 30, 5, 35});
  const BucketPlanOptions options{40, 3, {}};
  std::vector<GradBucket> buckets = plan_grad_buckets(pb, options);
  pad_grad_buckets(&pb, &buckets, options, /*align=*/16, /*sharded=*/false);
  // Sizes 10, 50, 40 padded to multiples of 16: 16, 64, 48.
  EXPECT_EQ(buckets[2].range, (FlatRange{0, 16}));
  EXPECT_EQ(buckets[1].range, (FlatRange{16, 80}));
  EXPECT_EQ(buckets[0].range, (FlatRange{80, 128}));
  EXPECT_EQ(buckets[1].padded_numel, 66);  // the communication staging: a multiple of dp, as before
  EXPECT_EQ(pb.padding_numel(), 28);
  expect_values_kept(pb);
  expect_padding_zero_and_exact(pb);
}

TEST(GradBucketsPad, AlignedBucketsGetNoPaddingAndFrozenParametersMoveUp) {
  ParamBuffer pb = filled_buffer({8, 8, 6, 3}, /*frozen=*/1);  // p3 frozen, after the trainable ones
  const BucketPlanOptions options{8, 2, {}};
  std::vector<GradBucket> buckets = plan_grad_buckets(pb, options);
  ASSERT_EQ(buckets.size(), 2u);  // {p2, p1} (14 elements) {p0} (8)
  pad_grad_buckets(&pb, &buckets, options, /*align=*/4, /*sharded=*/true);
  // 8 is a multiple of 2·4: no padding; 14 becomes 16.
  EXPECT_EQ(pb.padding_numel(), 2);
  EXPECT_EQ(pb.trainable_numel(), 24);
  EXPECT_EQ(pb.spec(3).offset, 24);
  EXPECT_EQ(pb.numel(), 27);
  expect_values_kept(pb);
  expect_padding_zero_and_exact(pb);
}

TEST(GradBucketsPad, GemmCopyFollowsTheNewLayout) {
  ParamBuffer pb = filled_buffer({5, 7});
  pb.enable_gemm_copy(DType::kBF16);
  pb.refresh_gemm_copy();
  const BucketPlanOptions options{0, 1, {}};
  std::vector<GradBucket> buckets = plan_grad_buckets(pb, options);
  pad_grad_buckets(&pb, &buckets, options, /*align=*/8, /*sharded=*/false);
  EXPECT_EQ(pb.numel(), 16);
  for (int id = 0; id < pb.size(); ++id)
    for (int64_t j = 0; j < pb.spec(id).local_numel(); ++j)
      EXPECT_EQ(bf16_to_float(pb.param_bf16_data(id)[j]), bf16_to_float(float_to_bf16(pb.param_data(id)[j])));
}

}  // namespace
}  // namespace gale
