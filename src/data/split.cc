// --split parsing.
#include "data/split.h"

#include <cstdlib>
#include <vector>

#include "data/numpy_math.h"

namespace gale {

const char* split_name(DataSplit s) {
  switch (s) {
    case DataSplit::kTrain:
      return "train";
    case DataSplit::kValid:
      return "valid";
    case DataSplit::kTest:
      return "test";
  }
  return "?";
}

StatusOr<SplitMatrix> parse_split(const std::string& split) {
  std::vector<double> v;
  size_t i = 0;
  auto is_num_char = [](char c) { return c == '.' || (c >= '0' && c <= '9'); };
  while (i < split.size()) {
    if (!is_num_char(split[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < split.size() && is_num_char(split[j])) ++j;
    std::string token = split.substr(i, j - i);
    char* end = nullptr;
    double x = std::strtod(token.c_str(), &end);
    if (end != token.c_str() + token.size() || token == ".")
      return InvalidArgument("--split '", split, "': '", token, "' is not a number");
    v.push_back(x);
    i = j;
  }
  if (v.size() > 3)
    return InvalidArgument("--split '", split, "': expected at most 3 numbers (train, valid, test), found ", v.size());
  while (v.size() < 3) v.push_back(0.0);
  double sum = numpy_sum(v);
  if (!(sum > 0.0)) return InvalidArgument("--split '", split, "': the proportions add up to 0");
  std::vector<double> w = numpy_normalize(v);
  double bookend[4] = {0.0, 0.0, 0.0, 0.0};
  for (int k = 0; k < 3; ++k) bookend[k + 1] = bookend[k] + w[static_cast<size_t>(k)];
  SplitMatrix m;
  for (int k = 0; k < 3; ++k) {
    if (bookend[k + 1] <= bookend[k]) continue;
    m[static_cast<size_t>(k)] = std::make_pair(bookend[k], bookend[k + 1]);
  }
  return m;
}

std::pair<int64_t, int64_t> split_range(const std::pair<double, double>& bookends, int64_t numel) {
  double n = static_cast<double>(numel);
  return {python_round(bookends.first * n), python_round(bookends.second * n)};
}

}  // namespace gale
