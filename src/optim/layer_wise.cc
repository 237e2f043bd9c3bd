// The layer-wise distributed optimizer's ping-pong assignment of whole parameters to ranks.
#include "optim/layer_wise.h"

#include <algorithm>

#include "core/check.h"

namespace gale {

std::vector<int> layer_wise_owners(const ParamBuffer& pb, int64_t dp_size, int64_t expert_dp_size) {
  GALE_CHECK(dp_size >= 1 && expert_dp_size >= 1) << "layer-wise group sizes " << dp_size << ", " << expert_dp_size;
  std::vector<int> owners(static_cast<size_t>(pb.size()), -1);
  for (const bool expert : {false, true}) {
    std::vector<int> ids;
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      if (s.trainable && !s.buffer && s.expert_parallel == expert) ids.push_back(id);
    }
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) {
      return shape_numel(pb.spec(a).global_shape) < shape_numel(pb.spec(b).global_shape);
    });
    const int64_t n = expert ? expert_dp_size : dp_size;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t at = static_cast<int64_t>(i) % (2 * n);  // 0 … n−1 then n−1 … 0
      owners[static_cast<size_t>(ids[i])] = static_cast<int>(at < n ? at : 2 * n - 1 - at);
    }
  }
  return owners;
}

std::vector<FlatRange> layer_wise_ranges(const ParamBuffer& pb, const std::vector<int>& owners, int dense_rank,
                                         int expert_rank) {
  GALE_CHECK_EQ(static_cast<int>(owners.size()), pb.size());
  std::vector<FlatRange> ranges;
  std::vector<int> ids;
  for (int id = 0; id < pb.size(); ++id) {
    const int owner = owners[static_cast<size_t>(id)];
    if (owner >= 0 && owner == (pb.spec(id).expert_parallel ? expert_rank : dense_rank)) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int a, int b) { return pb.spec(a).offset < pb.spec(b).offset; });
  for (int id : ids) {
    const ParamSpec& s = pb.spec(id);
    const FlatRange r{s.offset, s.offset + s.local_numel()};
    if (!ranges.empty() && ranges.back().end == r.begin)
      ranges.back().end = r.end;
    else
      ranges.push_back(r);
  }
  return ranges;
}

}  // namespace gale
