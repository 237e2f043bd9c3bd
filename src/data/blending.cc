// Blend parsing and blending indices.
#include "data/blending.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>

namespace gale {

namespace {
// Python float(): optional surrounding whitespace, decimal or exponent forms, inf/nan.
std::optional<double> python_float(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n\r\f\v"), e = s.find_last_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return std::nullopt;
  std::string t = s.substr(b, e - b + 1);
  for (char c : t)
    if (c == 'x' || c == 'X') return std::nullopt;  // strtod would accept hex; Python does not
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return v;
}

std::string strip(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n\r\f\v"), e = s.find_last_not_of(" \t\n\r\f\v");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}
}  // namespace

StatusOr<Blend> parse_blend(const std::vector<std::string>& entries, const std::string& flag) {
  if (entries.empty())
    return InvalidArgument(flag, ": expected a dataset prefix or 'weight prefix' pairs, found nothing");
  Blend b;
  bool weighted = entries.size() % 2 == 0;
  std::vector<double> weights;
  if (weighted) {
    for (size_t i = 0; i < entries.size(); i += 2) {
      auto w = python_float(entries[i]);
      if (!w) {
        weighted = false;
        break;
      }
      weights.push_back(*w);
    }
    if (!weighted) {
      // Megatron asserts that either every weight parses or none does.
      for (size_t i = 0; i < entries.size(); i += 2)
        if (python_float(entries[i]))
          return InvalidArgument(flag, ": '", entries[i], "' looks like a weight but '", entries[i == 0 ? 2 : 0],
                                 "' does not; give 'w1 p1 w2 p2 ...' or a list of prefixes");
    }
  }
  if (weighted) {
    for (size_t i = 0; i < weights.size(); ++i) {
      if (!(weights[i] >= 0.0) || std::isinf(weights[i]))
        return InvalidArgument(flag, ": weight '", entries[2 * i], "' must be a finite non-negative number");
      b.prefixes.push_back(strip(entries[2 * i + 1]));
    }
    double sum = 0;
    for (double w : weights) sum += w;
    if (!(sum > 0.0)) return InvalidArgument(flag, ": the weights add up to 0");
    b.weights = weights;
  } else {
    for (const auto& e : entries) b.prefixes.push_back(strip(e));
  }
  for (const auto& p : b.prefixes)
    if (p.empty()) return InvalidArgument(flag, ": empty dataset prefix");
  return b;
}

std::vector<int64_t> samples_per_dataset(std::span<const double> normalized_weights, int64_t target, double surplus) {
  std::vector<int64_t> out;
  for (double w : normalized_weights) {
    double a = std::ceil(static_cast<double>(target) * w);
    out.push_back(static_cast<int64_t>(std::ceil(a * (1.0 + surplus))));
  }
  return out;
}

void build_blending_indices(std::span<const double> weights, int64_t size, std::vector<int16_t>* dataset_index,
                            std::vector<int64_t>* dataset_sample_index) {
  const int64_t n = static_cast<int64_t>(weights.size());
  dataset_index->assign(static_cast<size_t>(size), 0);
  dataset_sample_index->assign(static_cast<size_t>(size), 0);
  std::vector<int64_t> count(static_cast<size_t>(n), 0);
  for (int64_t t = 0; t < size; ++t) {
    double x = std::max(static_cast<double>(t), 1.0);
    int64_t best = 0;
    double best_err = weights[0] * x - static_cast<double>(count[0]);
    for (int64_t i = 1; i < n; ++i) {
      double err = weights[static_cast<size_t>(i)] * x - static_cast<double>(count[static_cast<size_t>(i)]);
      if (err > best_err) {
        best_err = err;
        best = i;
      }
    }
    (*dataset_index)[static_cast<size_t>(t)] = static_cast<int16_t>(best);
    (*dataset_sample_index)[static_cast<size_t>(t)] = count[static_cast<size_t>(best)];
    ++count[static_cast<size_t>(best)];
  }
}

void build_exhaustive_blending_indices(std::span<const int64_t> sizes, std::vector<int16_t>* dataset_index,
                                       std::vector<int64_t>* dataset_sample_index) {
  const int32_t n = static_cast<int32_t>(sizes.size());
  int64_t total = 0;
  std::set<int32_t> unspent;
  for (int32_t i = 0; i < n; ++i) {
    total += sizes[static_cast<size_t>(i)];
    if (sizes[static_cast<size_t>(i)] > 0) unspent.insert(i);
  }
  std::vector<double> weights(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    weights[static_cast<size_t>(i)] = static_cast<double>(sizes[static_cast<size_t>(i)]) / static_cast<double>(total);
  std::vector<int64_t> count(static_cast<size_t>(n), 0);
  dataset_index->clear();
  dataset_sample_index->clear();
  dataset_index->reserve(static_cast<size_t>(total));
  dataset_sample_index->reserve(static_cast<size_t>(total));
  int64_t t = 0;
  while (!unspent.empty()) {
    double x = std::max(static_cast<double>(t), 1.0);
    int32_t best = -1;
    double best_err = std::numeric_limits<double>::lowest();
    for (int32_t i : unspent) {
      double err = weights[static_cast<size_t>(i)] * x - static_cast<double>(count[static_cast<size_t>(i)]);
      if (err > best_err) {
        best = i;
        best_err = err;
      }
    }
    dataset_index->push_back(static_cast<int16_t>(best));
    dataset_sample_index->push_back(count[static_cast<size_t>(best)]);
    ++count[static_cast<size_t>(best)];
    if (count[static_cast<size_t>(best)] == sizes[static_cast<size_t>(best)]) unspent.erase(best);
    ++t;
  }
}

}  // namespace gale
