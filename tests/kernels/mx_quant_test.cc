// MX fake quantisation: the reference and the fast kernel against the numpy fixture (bit for bit),
// and the fast kernel against the reference on random and extreme inputs.
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/cpu/mx_quant.h"

namespace gale {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

std::vector<float> floats_of_bits(const nlohmann::json& j) {
  std::vector<float> v;
  for (const auto& b : j) {
    const uint32_t u = b.get<uint32_t>();
    float f;
    std::memcpy(&f, &u, sizeof f);
    v.push_back(f);
  }
  return v;
}

MxElement element_of(const std::string& name) {
  if (name == "fp8_e4m3") return MxElement::kFp8E4M3;
  if (name == "fp4_e2m1") return MxElement::kFp4E2M1;
  ADD_FAILURE() << "unknown element " << name;
  return MxElement::kNone;
}

nlohmann::json load_fixture() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/mx_quant/golden.json");
  EXPECT_TRUE(in.good()) << "tests/data/reference/mx_quant/golden.json (tools/reference/mx_quant_reference.py)";
  return nlohmann::json::parse(in);
}

using QuantFn = void (*)(const float*, float*, int64_t, int64_t, int64_t, MxElement);

void expect_fixture(QuantFn fn, const char* what) {
  const nlohmann::json golden = load_fixture();
  ASSERT_GE(golden["cases"].size(), 20u);
  for (const auto& c : golden["cases"]) {
    const std::vector<float> x = floats_of_bits(c["x"]), want = floats_of_bits(c["y"]);
    const int64_t rows = c["rows"], cols = c["cols"], block = c["block"];
    ASSERT_EQ(static_cast<int64_t>(x.size()), rows * cols);
    std::vector<float> y(x.size());
    fn(x.data(), y.data(), rows, cols, block, element_of(c["element"]));
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(bits_of(y[i]), bits_of(want[i]))
          << what << " case " << c["name"] << " " << c["element"] << " element " << i << ": x " << x[i] << " got "
          << y[i] << " want " << want[i];
  }
}

TEST(MxQuant, ReferenceMatchesFixture) { expect_fixture(mx_fake_quant_reference, "reference"); }
TEST(MxQuant, FastMatchesFixture) { expect_fixture(mx_fake_quant, "fast"); }

// Random values over many magnitudes, with ties, zeros, subnormals and saturating blocks mixed in.
std::vector<float> hard_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> kind(0, 9), exp(-140, 120), k(0, 63);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) {
    switch (kind(gen)) {
      case 0: f = 0.0f; break;
      case 1: f = -0.0f; break;
      case 2: f = std::ldexp(static_cast<float>(k(gen)) + 0.5f, exp(gen) / 8 - 6); break;  // midpoints
      case 3: f = std::ldexp(normal(gen), exp(gen)); break;                                 // any magnitude
      case 4: f = std::numeric_limits<float>::denorm_min() * static_cast<float>(k(gen) * 1000 + 1); break;
      case 5: f = 1.99f * (normal(gen) > 0 ? 1.0f : -1.0f); break;                         // saturating
      default: f = normal(gen) * 0.02f;
    }
  }
  return v;
}

TEST(MxQuant, FastEqualsReference) {
  for (MxElement e : {MxElement::kFp8E4M3, MxElement::kFp4E2M1})
    for (int64_t block : {1, 2, 32, 128})
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 31}, {5, 64}, {7, 300}, {64, 1000}}) {
        const std::vector<float> x = hard_values(rows * cols, static_cast<uint32_t>(block * 1000 + cols));
        std::vector<float> a(x.size()), b(x.size());
        mx_fake_quant_reference(x.data(), a.data(), rows, cols, block, e);
        mx_fake_quant(x.data(), b.data(), rows, cols, block, e);
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_EQ(bits_of(a[i]), bits_of(b[i])) << mx_element_name(e) << " block " << block << " " << rows << "x"
                                                  << cols << " element " << i << " x " << x[i];
      }
}

// In place (out aliases x) gives the same; quantising twice changes nothing (idempotent).
TEST(MxQuant, InPlaceAndIdempotent) {
  for (MxElement e : {MxElement::kFp8E4M3, MxElement::kFp4E2M1}) {
    const std::vector<float> x = hard_values(4 * 96, 7);
    std::vector<float> once(x.size()), in_place = x, twice(x.size());
    mx_fake_quant(x.data(), once.data(), 4, 96, 32, e);
    mx_fake_quant(in_place.data(), in_place.data(), 4, 96, 32, e);
    mx_fake_quant(once.data(), twice.data(), 4, 96, 32, e);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(bits_of(once[i]), bits_of(in_place[i])) << i;
      ASSERT_EQ(bits_of(once[i]), bits_of(twice[i])) << i;
    }
  }
}

// Every fp4 result is one of ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}·2^s with the block's one s.
TEST(MxQuant, Fp4ValuesOnTheGrid) {
  const std::vector<float> x = hard_values(32, 11);
  std::vector<float> y(32);
  mx_fake_quant(x.data(), y.data(), 1, 32, 32, MxElement::kFp4E2M1);
  float amax = 0;
  for (float f : x) amax = std::max(amax, std::fabs(f));
  int e = 0;
  std::frexp(amax, &e);
  const int s = std::max(e - 1 - 2, -127);
  for (size_t i = 0; i < y.size(); ++i) {
    const double q = std::fabs(std::ldexp(static_cast<double>(y[i]), -s));
    EXPECT_TRUE(q == 0 || q == 0.5 || q == 1 || q == 1.5 || q == 2 || q == 3 || q == 4 || q == 6)
        << "x " << x[i] << " y " << y[i] << " q " << q;
  }
}

}  // namespace
}  // namespace gale
