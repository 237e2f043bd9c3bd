// Megatron main's unified hybrid pattern ('|' pipeline segments, '/' MTP depths): Gale's parser accepts, splits and
// refuses every pattern of tests/data/reference/hybrid_pattern/megatron_parse.json as Megatron's own
// hybrid_layer_allocation.py did (tools/reference/hybrid_pattern_reference.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/hybrid_pattern.h"

namespace gale {
namespace {

const char* kFlag = "--hybrid-layer-pattern";

nlohmann::json fixture() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/hybrid_pattern/megatron_parse.json");
  EXPECT_TRUE(in.good()) << "tests/data/reference/hybrid_pattern/megatron_parse.json is missing";
  return nlohmann::json::parse(in);
}

std::string or_empty(const nlohmann::json& j) { return j.is_null() ? "" : j.get<std::string>(); }

// Gale's one-line error says what Megatron's says: the kind the fixture recorded.
void expect_same_error(const Status& s, const nlohmann::json& megatron, const std::string& pattern) {
  ASSERT_FALSE(s.ok()) << pattern << ": Megatron says " << megatron.dump();
  const std::string& msg = s.message();
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(msg.find(kFlag), std::string::npos) << msg;
  const std::string kind = megatron.at("kind").get<std::string>();
  if (kind == "invalid_symbol") {
    const std::string where = megatron.at("where").get<std::string>(), symbol = megatron.at("symbol").get<std::string>();
    EXPECT_NE(msg.find("in the " + where + " pattern, '" + symbol + "' is not a valid layer symbol"), std::string::npos)
        << msg;
  } else if (kind == "attention_with_mla") {
    EXPECT_NE(msg.find("mixes attention ('*') with multi-latent or DeepSeek sparse attention"), std::string::npos)
        << msg;
  } else if (kind == "mtp_not_identical") {
    EXPECT_NE(msg.find("all MTP patterns (after each '/') must be identical"), std::string::npos) << msg;
    EXPECT_NE(msg.find("as MTP pattern " + std::to_string(megatron.at("index").get<int>())), std::string::npos) << msg;
  } else if (kind == "segments_not_divisible") {
    EXPECT_NE(msg.find("the number of pipe-delimited segments"), std::string::npos) << msg;
  } else {
    ADD_FAILURE() << "unexpected kind " << kind;
  }
}

TEST(HybridPattern, ParsesAsMegatronMain) {
  int accepted = 0, refused = 0, with_mtp = 0;
  for (const auto& c : fixture()) {
    const std::string pattern = c.at("pattern").get<std::string>();
    const nlohmann::json& expected = c.at("parse");
    StatusOr<HybridLayerPattern> p = parse_hybrid_layer_pattern(pattern, kFlag);
    if (!c.at("layers").is_null())
      EXPECT_EQ(static_cast<int64_t>(hybrid_pattern_layers(pattern).size()), c.at("layers").get<int64_t>()) << pattern;
    if (expected.contains("error")) {
      expect_same_error(p.status(), expected, pattern);
      ++refused;
      continue;
    }
    ASSERT_TRUE(p.ok()) << pattern << ": " << p.status().to_string();
    EXPECT_EQ(p->main, or_empty(expected.at("main"))) << pattern;
    EXPECT_EQ(p->mtp, or_empty(expected.at("mtp"))) << pattern;
    EXPECT_EQ(p->mtp_depths, expected.at("depths").get<int64_t>()) << pattern;
    EXPECT_EQ(static_cast<int64_t>(p->layers.size()), c.at("layers").get<int64_t>()) << pattern;
    EXPECT_EQ(static_cast<int64_t>(p->stages.size()), c.at("segments").get<int64_t>()) << pattern;
    EXPECT_EQ(has_hybrid_pipes(pattern), p->stages.size() > 1) << pattern;
    with_mtp += p->mtp_depths > 0;
    ++accepted;
  }
  EXPECT_GE(accepted, 20);
  EXPECT_GE(refused, 8);
  EXPECT_GE(with_mtp, 4);
}

// With '|': each (pipeline rank, virtual stage) gets the segment Megatron's select_pipeline_segment
// selects, and the segment count must divide among the pipeline ranks. (Patterns without '|' are
// split as Gale's other models are: tests/train/arguments_hybrid_test.cc.)
TEST(HybridPattern, PipeSegmentsSplitAsMegatronMain) {
  int splits = 0, errors = 0;
  for (const auto& c : fixture()) {
    const std::string pattern = c.at("pattern").get<std::string>();
    if (!c.contains("splits") || c.at("segments").get<int64_t>() < 2) continue;
    StatusOr<HybridLayerPattern> p = parse_hybrid_layer_pattern(pattern, kFlag);
    ASSERT_TRUE(p.ok()) << pattern;
    for (const auto& s : c.at("splits")) {
      const int64_t pp = s.at("pp").get<int64_t>();
      StatusOr<std::vector<std::vector<int64_t>>> layers = hybrid_pattern_stage_layers(*p, pp, kFlag);
      if (s.contains("error")) {
        expect_same_error(layers.status(), s, pattern);
        ++errors;
        continue;
      }
      ASSERT_TRUE(layers.ok()) << pattern << " pp " << pp << ": " << layers.status().to_string();
      const int64_t vpp = s.at("vpp").is_null() ? 1 : s.at("vpp").get<int64_t>();
      const auto& stages = s.at("stages");
      ASSERT_EQ(static_cast<int64_t>(layers->size()), pp) << pattern;
      for (int64_t r = 0; r < pp; ++r) {
        ASSERT_EQ(static_cast<int64_t>((*layers)[r].size()), vpp) << pattern << " pp " << pp;
        for (int64_t v = 0; v < vpp; ++v) {
          const std::string segment = stages[r][v][0].get<std::string>();
          EXPECT_EQ((*layers)[r][v], static_cast<int64_t>(segment.size()))
              << pattern << " pp " << pp << " rank " << r << " stage " << v;
          // The segment's layers are the pattern's layers from Megatron's offset on.
          EXPECT_EQ(p->layers.substr(stages[r][v][1].get<size_t>(), segment.size()), segment) << pattern;
        }
      }
      ++splits;
    }
  }
  EXPECT_GE(splits, 20);
  EXPECT_GE(errors, 15);
}

TEST(HybridPattern, LayersOfAPatternWithoutSeparatorsAreThePattern) {
  EXPECT_FALSE(has_hybrid_separators("M*-M"));
  EXPECT_TRUE(has_hybrid_separators("M*|-M"));
  EXPECT_TRUE(has_hybrid_separators("M*-M/MM"));
  EXPECT_EQ(hybrid_pattern_layers("M*-M"), "M*-M");
  EXPECT_EQ(hybrid_pattern_layers("M*|-M/M|M"), "M*-M");
  EXPECT_FALSE(has_hybrid_pipes("M*-M/M|M"));
}

}  // namespace
}  // namespace gale
