// --split parsing and ranges (round half to even), and numpy.sum's pairwise summation.
#include "data/split.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "data/numpy_math.h"

namespace gale {
namespace {

TEST(Split, DefaultSplitOn500Sequences) {
  // megatron.md §3.1: numel=500 with 969,30,1 gives [0,484), [484,500), [500,500).
  auto m = parse_split("969, 30, 1");
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE((*m)[0] && (*m)[1] && (*m)[2]);
  EXPECT_EQ(split_range(*(*m)[0], 500), (std::pair<int64_t, int64_t>(0, 484)));
  EXPECT_EQ(split_range(*(*m)[1], 500), (std::pair<int64_t, int64_t>(484, 500)));
  EXPECT_EQ(split_range(*(*m)[2], 500), (std::pair<int64_t, int64_t>(500, 500)));
}

TEST(Split, MatchesPythonReference) {
  auto j = testing::load_json(testing::reference_path("gpt_indices_golden.json"));
  for (const auto& c : j["splits"]) {
    auto m = parse_split(c["split"].get<std::string>());
    ASSERT_TRUE(m.ok());
    for (int i = 0; i < 3; ++i) {
      const auto& r = c["ranges"][i];
      SCOPED_TRACE(c.dump());
      if (r.is_null()) {
        EXPECT_FALSE((*m)[i].has_value());
      } else {
        ASSERT_TRUE((*m)[i].has_value());
        auto range = split_range(*(*m)[i], c["numel"].get<int64_t>());
        EXPECT_EQ(range.first, r[0].get<int64_t>());
        EXPECT_EQ(range.second, r[1].get<int64_t>());
      }
    }
  }
}

TEST(Split, RoundHalfToEven) {
  EXPECT_EQ(python_round(0.5), 0);
  EXPECT_EQ(python_round(1.5), 2);
  EXPECT_EQ(python_round(2.5), 2);
  EXPECT_EQ(python_round(2.5000001), 3);
  // "1,1,2" on 2 sequences: bookends 0.25 and 0.5 -> round(0.5)=0, round(1.0)=1.
  auto m = parse_split("1,1,2");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(split_range(*(*m)[0], 2), (std::pair<int64_t, int64_t>(0, 0)));
  EXPECT_EQ(split_range(*(*m)[1], 2), (std::pair<int64_t, int64_t>(0, 1)));
}

TEST(Split, BadValues) {
  for (const char* bad : {"1,2,3,4", "0,0,0", "", "abc", "1.2.3,1"}) {
    auto m = parse_split(bad);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_NE(m.status().message().find("--split"), std::string::npos);
  }
}

TEST(NumpySum, PairwiseSummationMatchesNumpy) {
  auto j = testing::load_json(testing::reference_path("gpt_indices_golden.json"));
  for (const auto& c : j["numpy_sum"]) {
    auto v = c["values"].get<std::vector<double>>();
    EXPECT_EQ(numpy_sum(v), c["sum"].get<double>()) << v.size() << " values";
  }
}

}  // namespace
}  // namespace gale
