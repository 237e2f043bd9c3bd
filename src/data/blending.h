// Blending several datasets into one (megatron.md §3.7): --data-path parsing, per-dataset
// sample counts, and helpers.cpp's greedy blending indices.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

// get_blend_from_list: an odd number of entries is a list of prefixes; an even number is
// (weight, prefix) pairs when every weight parses as a float, else a list of prefixes.
struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;  // as given (not normalised)
};
StatusOr<Blend> parse_blend(const std::vector<std::string>& entries, const std::string& flag);

// _get_size_per_split_per_dataset for one split: ceil(ceil(target * w_i) * (1 + surplus)).
std::vector<int64_t> samples_per_dataset(std::span<const double> normalized_weights, int64_t target, double surplus);

// helpers.cpp build_blending_indices: for each t, the first i maximising w_i*max(t,1) - count_i.
void build_blending_indices(std::span<const double> weights, int64_t size, std::vector<int16_t>* dataset_index,
                            std::vector<int64_t>* dataset_sample_index);

// helpers.cpp build_exhaustive_blending_indices: the same greedy rule over the datasets that
// still have samples, until every dataset has given exactly sizes[i]. Datasets of size 0 are
// never chosen.
void build_exhaustive_blending_indices(std::span<const int64_t> sizes, std::vector<int16_t>* dataset_index,
                                       std::vector<int64_t>* dataset_sample_index);

}  // namespace gale
