// Gradient buckets (Megatron's param_and_grad_buffer): contiguous ranges of a model chunk's flat
// gradient buffer, in backward order, and each data-parallel rank's shard of every bucket.
//
// A chunk's ParamBuffer lays its parameters out in forward order (embedding, layers, head), so
// backward completes them roughly from the highest offset down. Buckets are therefore cut from the
// end of the buffer: bucket 0 holds the last parameters (the head), the last bucket starts at
// offset 0. A bucket closes at a parameter boundary once it holds at least `bucket_size` elements
// (Megatron's rule), so no parameter straddles two buckets.
//
// With the distributed optimizer every bucket is split into DP equal shards of
// ceil(numel / dp) elements (Megatron pads each bucket to a multiple of DP; Gale pads only the
// communication staging, not the buffers): rank r owns elements [r·s, min((r+1)·s, numel)) of the
// bucket, which may be shorter than s, or empty, for the last ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "model/params.h"

namespace gale {

// A half-open range [begin, end) of elements of a flat buffer.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool operator==(const FlatRange&) const = default;
};

struct GradBucket {
  FlatRange range;             // elements of the chunk's flat parameter/gradient buffers
  std::vector<int> param_ids;  // the parameters it holds (whole), highest offset first
  int64_t padded_numel = 0;    // range.size() rounded up to a multiple of the DP size

  int64_t numel() const { return range.size(); }
  int64_t shard_numel(int64_t dp) const { return padded_numel / dp; }
};

// Megatron's default bucket size in elements for `dp` data-parallel ranks: max(40M, 1M·dp).
int64_t default_bucket_size(int64_t dp);

// Megatron's choice of bucket size for one model chunk (DistributedDataParallel): the default
// size only with --overlap-grad-reduce, on the first pipeline stage and the first virtual chunk;
// otherwise one bucket for the whole chunk (0 = unbounded). `configured_size` > 0 is Megatron's
// configured bucket size (--ddp-bucket-size, or the parameter count / --ddp-num-buckets), which
// takes the default's place under the same rule. `override_size` > 0 replaces the rule (tests use
// it to get many buckets from a tiny model).
int64_t chunk_bucket_size(bool overlap_grad_reduce, int64_t pp_rank, int64_t chunk_index, int64_t dp,
                          int64_t override_size = 0, int64_t configured_size = 0);

struct BucketPlanOptions {
  int64_t bucket_size = 0;  // 0 = one bucket (unbounded)
  int64_t dp = 1;           // data-parallel size: buckets are padded to a multiple of it
  // Parameters that get a bucket of their own: Megatron's shared embedding with pipeline
  // parallelism and the distributed optimizer, so that the first and last stage shard it alike.
  std::vector<int> separate_params;
  // The part of the buffer to cut into buckets (Megatron's dense or expert-parallel buffer); only
  // the parameters inside it get buckets. end < 0: the whole buffer.
  FlatRange region{0, -1};
};

// The buckets of `pb`'s region, in backward order (bucket 0 ends at the region's end, the last
// starts at its beginning); they tile the region exactly. A parameter of zero elements belongs to the bucket around it.
std::vector<GradBucket> plan_grad_buckets(const ParamBuffer& pb, const BucketPlanOptions& options);

// MindSpeed's --param-and-grad-buffer-pad (features/feature_param_and_grad_buffer_pad.cc): pads
// `buckets` (plan_grad_buckets of `pb` with `options`) in place so that every bucket starts at a
// multiple of `align` elements of the flat buffers and its size is a multiple of `align` — with
// `sharded` (the distributed optimizer) a multiple of dp·align, so every rank's shard starts at a
// multiple of `align` too (MindSpeed's padding of each bucket's end). The zeros go at each bucket's
// high end (ParamBuffer::insert_padding), inside the bucket's range, so the buckets still tile
// the (grown) region. Returns the region in the padded layout. The region must start at a
// multiple of `align` (the dense region starts at 0; the expert one after the padded dense one).
FlatRange pad_grad_buckets(ParamBuffer* pb, std::vector<GradBucket>* buckets, const BucketPlanOptions& options,
                           int64_t align, bool sharded);

// Rank `rank`'s shard of `bucket` in flat-buffer offsets (possibly empty).
FlatRange bucket_shard(const GradBucket& bucket, int64_t dp, int64_t rank);

// The ranges of `pb` that rank `rank` owns with the distributed optimizer: its shard of every
// bucket, in bucket order, empty shards left out.
std::vector<FlatRange> owned_ranges(const std::vector<GradBucket>& buckets, int64_t dp, int64_t rank);

}  // namespace gale
