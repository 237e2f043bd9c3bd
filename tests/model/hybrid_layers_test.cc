// The hybrid model's layer allocation against Megatron's allocate_layers (core_v0.12.1), and its errors.
#include "model/hybrid_layers.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

struct Case {
  int64_t layers;
  double attention, mlp;
  const char* pattern;
  const char* expected;
};

// Expected values computed by Megatron's megatron/core/ssm/mamba_hybrid_layer_allocation.py
// (allocate_layers, run standalone with Python 3).
TEST(HybridLayers, MatchesMegatronsAllocation) {
  const Case cases[] = {
      {10, 0.2, 0.0, "", "MMM*MM*MMM"},
      {10, 0.0, 0.0, "", "MMMMMMMMMM"},
      {8, 0.25, 0.25, "", "MM*-M*M-"},
      {10, 0.3, 0.3, "", "M-*MM*-*M-"},
      {48, 0.5, 0.2, "", "M*-*M*M*-*M*-*M*M*-*M*-**M*-*M*M*-*M*-*M*M*-*M*-"},
      {10, 0.0, 0.1, "", "MMMMMMMMM-"},
      {10, 0.5, 0.5, "", "-*-*-**-*-"},
      {7, 0.15, 0.0, "", "MMM*MMM"},
      {12, 0.125, 0.0, "", "MMM*MMMM*MMM"},  // round(1.5) = 2: half to even, as Python
      {6, 0.5, 0.0, "", "M*M**M"},
      {5, 0.5, 0.0, "", "M*M*M"},
      {9, 0.0, 0.0, "M*-M*-M*-", "M*-M*-M*-"},
      {10, 0.3, 0.2, "MMM*-*M*M-", "MMM*-*M*M-"},
      {10, 0.3, 0.2, "MM*M-*M*M-", "MM*M-*M*M-"},
  };
  for (const Case& c : cases) {
    std::string layers;
    ASSERT_TRUE(allocate_hybrid_layers(c.layers, c.attention, c.mlp, c.pattern, &layers).ok())
        << c.layers << " " << c.attention << " " << c.mlp << " " << c.pattern;
    EXPECT_EQ(layers, c.expected) << c.layers << " " << c.attention << " " << c.mlp << " " << c.pattern;
  }
}

// Megatron's ValueErrors: wrong length, unknown symbol, counts that differ from the ratios'.
TEST(HybridLayers, RefusesInvalidPatternsAsMegatron) {
  std::string layers;
  Status st = allocate_hybrid_layers(4, 0.0, 0.0, "MM*", &layers);
  EXPECT_NE(st.message().find("wrong length: expected 4"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("found 3"), std::string::npos) << st.message();
  st = allocate_hybrid_layers(4, 0.0, 0.0, "MMXM", &layers);
  EXPECT_NE(st.message().find("'X' is not a layer symbol"), std::string::npos) << st.message();
  st = allocate_hybrid_layers(4, 0.25, 0.0, "MMMM", &layers);
  EXPECT_NE(st.message().find("number of each type of layer"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'MM*M'"), std::string::npos) << st.message();  // what the ratio gives
  st = allocate_hybrid_layers(4, 0.7, 0.5, "", &layers);
  EXPECT_NE(st.message().find("expected at most 1"), std::string::npos) << st.message();
  st = allocate_hybrid_layers(4, -0.1, 0.0, "", &layers);
  EXPECT_NE(st.message().find("--hybrid-attention-ratio: expected a value in [0, 1]"), std::string::npos);
}

// Megatron-Core's 'E' (Symbols.MOE): a MoE layer in a pattern; the ratios never give one, so a
// pattern with 'E' beside a positive ratio has the wrong counts.
TEST(HybridLayers, MoeLayersComeFromThePatternOnly) {
  std::string layers;
  ASSERT_TRUE(allocate_hybrid_layers(5, 0.0, 0.0, "ME*EM", &layers).ok());
  EXPECT_EQ(layers, "ME*EM");
  EXPECT_EQ(hybrid_moe_layer_flags(layers), (std::vector<int>{0, 1, 0, 1, 0}));
  Status st = allocate_hybrid_layers(4, 0.25, 0.0, "ME*M", &layers);
  EXPECT_NE(st.message().find("number of each type of layer"), std::string::npos) << st.message();
  st = allocate_hybrid_layers(4, 0.0, 0.0, "MMFM", &layers);
  EXPECT_NE(st.message().find("expected one of M (Mamba), G (Gated DeltaNet), * (attention), + (multi-latent "
                              "attention), D (DeepSeek sparse attention), - (MLP), E (MoE)"),
            std::string::npos)
      << st.message();
}

// Megatron-Core main's 'G' (Symbols.GDN): a Gated DeltaNet layer in a pattern, counted like the
// others against the ratios (which never give one).
TEST(HybridLayers, GatedDeltaNetLayersComeFromThePattern) {
  std::string layers;
  ASSERT_TRUE(allocate_hybrid_layers(5, 0.0, 0.0, "MG-*G", &layers).ok());
  EXPECT_EQ(layers, "MG-*G");
  EXPECT_EQ(hybrid_gdn_layer_flags(layers), (std::vector<int>{0, 1, 0, 0, 1}));
  EXPECT_EQ(hybrid_moe_layer_flags("MGE"), (std::vector<int>{0, 0, 1}));
  const Status st = allocate_hybrid_layers(4, 0.25, 0.0, "MG*M", &layers);
  EXPECT_NE(st.message().find("number of each type of layer"), std::string::npos) << st.message();
}

// '+' and 'D' (Symbols.MLA, DS_ATTENTION) are layer symbols, with Megatron's rule that '*' does not
// mix with '+' or 'D'; '+' layers are built (tests/model/hybrid_mla_test.cc), 'D' is refused as not
// supported yet.
TEST(HybridLayers, LatentAttentionSymbolsAreKnownAndDsaRefused) {
  std::string layers = "unchanged";
  struct Refusal {
    const char* pattern;
    StatusCode code;
    const char* text;
  };
  for (const Refusal& r : {
           Refusal{"MD-M", StatusCode::kUnimplemented, "the DeepSeek sparse attention layers ('D') of 'MD-M': not "
                                                        "supported yet (Gale's hybrid stack builds M, G, *, +, - and E layers)"},
           Refusal{"M+D-", StatusCode::kUnimplemented, "DeepSeek sparse attention layers ('D') of 'M+D-'"},
           Refusal{"M*+M", StatusCode::kInvalidArgument, "not both in one model, found 'M*+M'"},
           Refusal{"GD*M", StatusCode::kInvalidArgument, "not both in one model, found 'GD*M'"},
       }) {
    const Status st = allocate_hybrid_layers(4, 0.0, 0.0, r.pattern, &layers);
    EXPECT_EQ(st.code(), r.code) << r.pattern << ": " << st.message();
    EXPECT_NE(st.message().find(r.text), std::string::npos) << r.pattern << ": " << st.message();
    EXPECT_EQ(st.message().rfind("--hybrid-override-pattern: ", 0), 0u) << st.message();
  }
  EXPECT_EQ(layers, "unchanged");  // nothing allocated for a refused pattern
  ASSERT_TRUE(allocate_hybrid_layers(4, 0.0, 0.0, "MG+-", &layers).ok());
  EXPECT_EQ(layers, "MG+-");
}

}  // namespace
}  // namespace gale
