// Blending: --data-path parsing, per-dataset sizes and the greedy blending indices.
#include "data/blending.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "data/numpy_math.h"

namespace gale {
namespace {

TEST(Blending, MegatronExample) {
  // megatron.md §3.7 (from Megatron's own helpers.cpp).
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  std::vector<double> w = {0.3, 0.7};
  build_blending_indices(w, 10, &di, &dsi);
  EXPECT_EQ(di, (std::vector<int16_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(dsi, (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6}));
}

TEST(Blending, MatchesNumpyReference) {
  auto j = testing::load_json(testing::reference_path("gpt_indices_golden.json"));
  for (const auto& c : j["blending"]) {
    auto w = numpy_normalize(c["weights"].get<std::vector<double>>());
    std::vector<int16_t> di;
    std::vector<int64_t> dsi;
    build_blending_indices(w, c["size"].get<int64_t>(), &di, &dsi);
    EXPECT_EQ(di, c["dataset_index"].get<std::vector<int16_t>>());
    EXPECT_EQ(dsi, c["dataset_sample_index"].get<std::vector<int64_t>>());
  }
}

TEST(Blending, ExhaustiveTakesEverySampleExactlyOnce) {
  std::vector<int64_t> sizes = {3, 0, 5, 1};
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_exhaustive_blending_indices(sizes, &di, &dsi);
  ASSERT_EQ(di.size(), 9u);
  std::vector<int64_t> next(4, 0);
  for (size_t t = 0; t < di.size(); ++t) {
    EXPECT_NE(di[t], 1);
    EXPECT_EQ(dsi[t], next[static_cast<size_t>(di[t])]++);
  }
  EXPECT_EQ(next, sizes);
  // Same greedy rule as the weighted version while every dataset has samples left.
  std::vector<int16_t> di2;
  std::vector<int64_t> dsi2;
  std::vector<double> w = {3.0 / 9, 0.0, 5.0 / 9, 1.0 / 9};
  build_blending_indices(w, 3, &di2, &dsi2);
  EXPECT_EQ(std::vector<int16_t>(di.begin(), di.begin() + 3), di2);
}

TEST(Blending, SamplesPerDatasetHasHalfPercentMargin) {
  std::vector<double> w = {0.3, 0.7};
  EXPECT_EQ(samples_per_dataset(w, 1000, 0.0), (std::vector<int64_t>{300, 700}));
  EXPECT_EQ(samples_per_dataset(w, 1000, 0.005), (std::vector<int64_t>{302, 704}));
  EXPECT_EQ(samples_per_dataset(w, 1, 0.005), (std::vector<int64_t>{2, 2}));
}

TEST(Blending, ParseDataPath) {
  auto one = parse_blend({"corpus_text_document"}, "--data-path");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->prefixes, (std::vector<std::string>{"corpus_text_document"}));
  EXPECT_FALSE(one->weights.has_value());

  auto weighted = parse_blend({"0.3", "a", "70", "b"}, "--data-path");
  ASSERT_TRUE(weighted.ok());
  EXPECT_EQ(weighted->prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(*weighted->weights, (std::vector<double>{0.3, 70.0}));

  auto list = parse_blend({"a", "b"}, "--data-path");  // even, but no weights: a list
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(list->weights.has_value());

  auto three = parse_blend({"a", "b", "c"}, "--data-path");
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->prefixes.size(), 3u);

  auto mixed = parse_blend({"0.5", "a", "b", "c"}, "--data-path");
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("--data-path"), std::string::npos);

  EXPECT_FALSE(parse_blend({"0", "a", "0", "b"}, "--train-data-path").ok());  // weights add up to 0
  EXPECT_FALSE(parse_blend({"-1", "a", "2", "b"}, "--data-path").ok());       // negative weight
  EXPECT_FALSE(parse_blend({}, "--data-path").ok());
}

}  // namespace
}  // namespace gale
