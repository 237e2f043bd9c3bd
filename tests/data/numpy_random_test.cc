// NumPy generators re-implemented: outputs compared with numpy 1.24's own (fixture from
// tools/reference/gpt_dataset_reference.py) and with megatron.md's verified vectors.
#include "data/numpy_random.h"

#include <gtest/gtest.h>

#include <numeric>

#include "data/data_test_util.h"

namespace gale {
namespace {

const nlohmann::json& golden() {
  static nlohmann::json j = testing::load_json(testing::reference_path("gpt_indices_golden.json"));
  return j;
}

TEST(NumpyRandomState, ShufflesMatchNumpy) {
  for (const auto& c : golden()["random_state_shuffles"]) {
    NumpyRandomState rs(c["seed"].get<uint32_t>());
    int n = c["n"].get<int>();
    std::vector<int32_t> a(static_cast<size_t>(n));
    std::iota(a.begin(), a.end(), 0);
    rs.shuffle(a.data(), n);
    EXPECT_EQ(a, c["first"].get<std::vector<int32_t>>()) << "seed " << c["seed"];
    std::vector<uint32_t> b(static_cast<size_t>(n / 2));
    std::iota(b.begin(), b.end(), 0u);
    rs.shuffle(b.data(), n / 2);  // the same RandomState continues
    EXPECT_EQ(b, c["second"].get<std::vector<uint32_t>>()) << "seed " << c["seed"];
  }
}

TEST(NumpyRandomState, SameStateAsStdMt19937) {
  NumpyRandomState rs(5489);
  std::mt19937 mt(5489);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(rs.next32(), static_cast<uint32_t>(mt()));
}

TEST(NumpyRandomState, BoundedStaysInRangeAndZeroDrawsNothing) {
  NumpyRandomState a(7), b(7);
  EXPECT_EQ(a.bounded(0), 0u);  // no draw
  EXPECT_EQ(a.next32(), b.next32());
  for (uint64_t m : {1ull, 2ull, 3ull, 1000ull, 0xFFFFFFFFull}) {
    for (int i = 0; i < 50; ++i) EXPECT_LE(a.bounded(m), m);
  }
}

TEST(NumpyDefaultRng, Pcg64RawOutputMatchesNumpy) {
  NumpyDefaultRng r(12345);
  for (const auto& s : golden()["pcg64_raw_seed_12345"]) EXPECT_EQ(r.next64(), std::stoull(s.get<std::string>()));
}

TEST(NumpyDefaultRng, MockDocumentLengthsMatchNumpy) {
  const auto& m = golden()["mock_lengths"];
  std::vector<int32_t> v = NumpyDefaultRng(0).integers_int32(1, 4096, 100000);
  ASSERT_EQ(v.size(), 100000u);
  auto first = m["first"].get<std::vector<int32_t>>();
  auto last = m["last"].get<std::vector<int32_t>>();
  EXPECT_EQ(std::vector<int32_t>(v.begin(), v.begin() + 64), first);
  EXPECT_EQ(std::vector<int32_t>(v.end() - 16, v.end()), last);
  int64_t sum = 0, weighted = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    sum += v[i];
    weighted = (weighted + v[i] * static_cast<int64_t>(i + 1)) % 1000000000;
  }
  EXPECT_EQ(sum, m["sum"].get<int64_t>());
  EXPECT_EQ(weighted, m["weighted_sum_mod_1e9"].get<int64_t>());
}

}  // namespace
}  // namespace gale

namespace gale {
namespace {

const nlohmann::json& binomial_golden() {
  static nlohmann::json j = testing::load_json(testing::reference_path("numpy_binomial.json"));
  return j;
}

TEST(NumpyRandomState, BinomialMatchesNumpyIncludingTheDrawsItConsumes) {
  ASSERT_EQ(binomial_golden()["binomial"].size(), 10u);
  for (const auto& c : binomial_golden()["binomial"]) {
    NumpyRandomState rs(c["seed"].get<uint32_t>());
    const int64_t n = c["n"].get<int64_t>();
    const double p = c["p"].get<double>();
    std::vector<int64_t> got;
    for (size_t i = 0; i < c["values"].size(); ++i) got.push_back(rs.binomial(n, p));
    EXPECT_EQ(got, c["values"].get<std::vector<int64_t>>()) << "n " << n << " p " << p;
    EXPECT_EQ(rs.random_sample(), c["next_random_sample"].get<double>()) << "n " << n << " p " << p;
  }
}

TEST(NumpyRandomState, BinomialOutsideTheInversionRangeIsRefused) {
  NumpyRandomState rs(1);
  EXPECT_DEATH(rs.binomial(100, 0.5), "numpy's BTPE range");  // not implemented
  EXPECT_EQ(rs.binomial(0, 0.5), 0);
  EXPECT_EQ(rs.binomial(3, 0.0), 0);
}

TEST(NumpyRandomState, RandintPairsMatchNumpy) {
  for (const auto& c : binomial_golden()["randint"]) {
    NumpyRandomState rs(c["seed"].get<uint32_t>());
    const int64_t high = c["high"].get<int64_t>();
    for (const auto& pair : c["pairs"]) {
      const int64_t a = rs.randint(0, high), b = rs.randint(0, high);
      EXPECT_EQ(a, pair[0].get<int64_t>()) << "high " << high;
      EXPECT_EQ(b, pair[1].get<int64_t>()) << "high " << high;
    }
    EXPECT_EQ(rs.random_sample(), c["next_random_sample"].get<double>()) << "high " << high;
  }
}

}  // namespace
}  // namespace gale
