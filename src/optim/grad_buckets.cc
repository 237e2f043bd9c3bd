// Bucket planning and shard ranges.
#include "optim/grad_buckets.h"

#include <algorithm>

#include "core/check.h"

namespace gale {

int64_t default_bucket_size(int64_t dp) { return std::max<int64_t>(40000000, 1000000 * dp); }

int64_t chunk_bucket_size(bool overlap_grad_reduce, int64_t pp_rank, int64_t chunk_index, int64_t dp,
                          int64_t override_size, int64_t configured_size) {
  if (override_size > 0) return override_size;
  if (!overlap_grad_reduce || pp_rank > 0 || chunk_index > 0) return 0;
  return configured_size > 0 ? configured_size : default_bucket_size(dp);
}

std::vector<GradBucket> plan_grad_buckets(const ParamBuffer& pb, const BucketPlanOptions& options) {
  GALE_CHECK_GE(options.dp, 1);
  // Frozen parameters (after trainable_numel()) have no gradient: no region reaches them.
  const FlatRange region = options.region.end < 0 ? FlatRange{0, pb.trainable_numel()} : options.region;
  GALE_CHECK_LE(region.end, pb.trainable_numel());
  // The region's parameters, highest offset first (registration order, except that expert-parallel
  // parameters sit after all others: ParamBuffer::finalize).
  std::vector<int> ids;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    const bool inside = s.local_numel() > 0 ? region.begin <= s.offset && s.offset + s.local_numel() <= region.end
                                            : region.begin <= s.offset && s.offset <= region.end;
    if (inside) ids.push_back(id);
  }
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return pb.spec(a).offset > pb.spec(b).offset; });
  std::vector<GradBucket> buckets;
  GradBucket current;
  current.range.end = region.end;
  auto close = [&](int64_t begin) {
    if (current.param_ids.empty()) return;
    current.range.begin = begin;
    current.padded_numel = (current.numel() + options.dp - 1) / options.dp * options.dp;
    buckets.push_back(std::move(current));
    current = GradBucket{};
    current.range.end = begin;
  };
  for (int id : ids) {
    const ParamSpec& s = pb.spec(id);
    if (!s.trainable) continue;
    const bool separate =
        std::find(options.separate_params.begin(), options.separate_params.end(), id) != options.separate_params.end();
    if (separate) close(s.offset + s.local_numel());
    current.param_ids.push_back(id);
    const int64_t held = current.range.end - s.offset;
    if (separate || (options.bucket_size > 0 && held >= options.bucket_size)) close(s.offset);
  }
  close(region.begin);
  return buckets;
}

FlatRange pad_grad_buckets(ParamBuffer* pb, std::vector<GradBucket>* buckets, const BucketPlanOptions& options,
                           int64_t align, bool sharded) {
  GALE_CHECK_GE(align, 1);
  const FlatRange region = options.region.end < 0 ? FlatRange{0, pb->trainable_numel()} : options.region;
  GALE_CHECK_EQ(region.begin % align, 0) << "the bucket region must start aligned to " << align << " elements";
  const int64_t multiple = sharded ? align * options.dp : align;
  // Buckets in flat order are the reverse of the list (the last one starts at region.begin): each
  // gets its zeros at its old end, and the ones below it move everything above them up.
  std::vector<std::pair<int64_t, int64_t>> gaps;
  for (const GradBucket& b : *buckets) gaps.emplace_back(b.range.end, (multiple - b.numel() % multiple) % multiple);
  pb->insert_padding(gaps);
  int64_t at = region.begin;
  for (auto it = buckets->rbegin(); it != buckets->rend(); ++it) {
    const int64_t size = (it->numel() + multiple - 1) / multiple * multiple;
    it->range = FlatRange{at, at + size};
    it->padded_numel = (size + options.dp - 1) / options.dp * options.dp;
    at += size;
  }
  return FlatRange{region.begin, at};
}

FlatRange bucket_shard(const GradBucket& bucket, int64_t dp, int64_t rank) {
  GALE_CHECK(rank >= 0 && rank < dp) << "rank " << rank << " of " << dp;
  const int64_t s = bucket.shard_numel(dp);
  const int64_t lo = std::min(rank * s, bucket.numel()), hi = std::min((rank + 1) * s, bucket.numel());
  return FlatRange{bucket.range.begin + lo, bucket.range.begin + hi};
}

std::vector<FlatRange> owned_ranges(const std::vector<GradBucket>& buckets, int64_t dp, int64_t rank) {
  std::vector<FlatRange> out;
  for (const GradBucket& b : buckets) {
    FlatRange r = bucket_shard(b, dp, rank);
    if (!r.empty()) out.push_back(r);
  }
  return out;
}

}  // namespace gale
