// Megatron's --split: "969, 30, 1" -> normalised weights -> book-ends -> sequence ranges.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "core/status.h"

namespace gale {

enum class DataSplit { kTrain = 0, kValid = 1, kTest = 2 };
const char* split_name(DataSplit s);  // "train", "valid", "test"
inline constexpr DataSplit kAllSplits[3] = {DataSplit::kTrain, DataSplit::kValid, DataSplit::kTest};

using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;

// parse_and_normalize_split + convert_split_vector_to_split_matrix: the numbers matching
// [.0-9]+ are read as floats, padded to three with zeros and divided by their sum; split i is
// (lo_i, hi_i) of the running sums, or nullopt when hi_i <= lo_i. Errors name --split.
StatusOr<SplitMatrix> parse_split(const std::string& split);

// [round(lo * numel), round(hi * numel)) with Python's round-half-to-even.
std::pair<int64_t, int64_t> split_range(const std::pair<double, double>& bookends, int64_t numel);

}  // namespace gale
