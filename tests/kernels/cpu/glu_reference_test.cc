// The reference gated activation (kernels/cpu/activation.h GluSpec) against a float64 torch golden of
// Megatron's glu() with quick_gelu, --glu-linear-offset and --activation-func-clamp-value
// (tools/reference/quick_geglu_reference.py -> tests/data/reference/quick_geglu.json).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../reference_fixture.h"
#include "kernels/cpu/activation.h"

namespace gale {
namespace {

// float32 arithmetic (exp, products) against float64: a few ulp of each value's scale.
constexpr double kRelTol = 2e-6;

void expect_close(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], kRelTol * std::max(1.0, std::fabs(want[i]))) << what << "[" << i << "]";
}

TEST(GluReference, MatchesMegatronFormulaInFloat64) {
  const nlohmann::json j = testing::load_reference_json("quick_geglu.json");
  const int64_t rows = j["rows"].get<int64_t>(), F = j["F"].get<int64_t>();
  ASSERT_EQ(j["cases"].size(), 5u);
  for (const nlohmann::json& c : j["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    GluSpec spec;
    spec.alpha = c["alpha"].get<float>();
    spec.linear_offset = c["linear_offset"].get<float>();
    spec.clamp = c["clamp"].is_null() ? HUGE_VALF : c["clamp"].get<float>();
    const std::vector<float> x = c["x"].get<std::vector<float>>(), dy = c["dy"].get<std::vector<float>>();
    ASSERT_EQ(static_cast<int64_t>(x.size()), rows * 2 * F);
    std::vector<float> y(rows * F), dx(rows * 2 * F);
    glu_forward_ref(spec, x.data(), y.data(), rows, F);
    glu_backward_ref(spec, dy.data(), x.data(), dx.data(), rows, F);
    expect_close(y, c["y"].get<std::vector<double>>(), "y");
    expect_close(dx, c["dx"].get<std::vector<double>>(), "dx");
  }
}

}  // namespace
}  // namespace gale
