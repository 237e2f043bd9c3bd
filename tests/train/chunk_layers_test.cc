// Layer placement over pipeline ranks and virtual stages equals Megatron-Core's
// (get_transformer_layer_offset / get_num_layers_to_build, recorded in
// tests/data/schedule/megatron_layers.json by tools/reference/pipeline_order.py), and every
// layout places every layer exactly once, in order along the virtual stages.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "train/engine.h"

namespace gale {
namespace {

Arguments layout(int64_t num_layers, int64_t pp, int64_t vpp, int64_t first, int64_t last) {
  Arguments a;
  a.model.num_layers = num_layers;
  a.parallel.pipeline_model_parallel_size = pp;
  a.parallel.virtual_pipeline_model_parallel_size = vpp;
  a.parallel.decoder_first_pipeline_num_layers = first;
  a.parallel.decoder_last_pipeline_num_layers = last;
  return a;
}

TEST(ChunkLayers, MatchMegatron) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/schedule/megatron_layers.json");
  ASSERT_TRUE(in.good()) << "tests/data/schedule/megatron_layers.json is missing";
  int cases = 0;
  for (const auto& j : nlohmann::json::parse(in)) {
    auto opt = [&](const char* key) { return j.at(key).is_null() ? kUnset : j.at(key).get<int64_t>(); };
    const int64_t pp = j.at("pp").get<int64_t>(), vpp = j.at("vpp").is_null() ? 1 : j.at("vpp").get<int64_t>();
    Arguments a = layout(j.at("num_layers").get<int64_t>(), pp, vpp, opt("first"), opt("last"));
    const auto& ranks = j.at("chunks");
    ASSERT_EQ(static_cast<int64_t>(ranks.size()), pp);
    for (int64_t r = 0; r < pp; ++r)
      for (int64_t v = 0; v < vpp; ++v) {
        auto expected = ranks[static_cast<size_t>(r)][static_cast<size_t>(v)].get<std::pair<int64_t, int64_t>>();
        EXPECT_EQ(chunk_layers(a, r, v), expected) << j.dump() << " rank " << r << " chunk " << v;
      }
    ++cases;
  }
  EXPECT_GE(cases, 10);
}

// Virtual stage s = v·P + r holds the layers right after those of stage s − 1.
void expect_contiguous(const Arguments& a) {
  const int64_t pp = a.parallel.pipeline_model_parallel_size, vpp = a.parallel.virtual_pipeline_model_parallel_size;
  int64_t next = 0;
  for (int64_t v = 0; v < vpp; ++v)
    for (int64_t r = 0; r < pp; ++r) {
      auto [first, count] = chunk_layers(a, r, v);
      EXPECT_EQ(first, next) << "rank " << r << " chunk " << v;
      EXPECT_GE(count, 1);
      next = first + count;
    }
  EXPECT_EQ(next, a.model.num_layers);
}

TEST(ChunkLayers, EveryLayerExactlyOnce) {
  expect_contiguous(layout(8, 4, 2, kUnset, kUnset));
  expect_contiguous(layout(12, 4, 2, 2, 2));
  expect_contiguous(layout(7, 4, 1, 1, kUnset));
  // Megatron core_v0.12.1 gives ranks 0 and 1 the same layers here (virtual stages with only
  // --decoder-last-pipeline-num-layers); Gale places them as the even stages plus the last one.
  Arguments last_only = layout(8, 4, 2, kUnset, 2);
  expect_contiguous(last_only);
  EXPECT_EQ(chunk_layers(last_only, 1, 0), (std::pair<int64_t, int64_t>{1, 1}));
  EXPECT_EQ(chunk_layers(last_only, 3, 1), (std::pair<int64_t, int64_t>{7, 1}));
  // Megatron divides by zero middle stages with PP 2 and both flags; Gale splits as asked.
  Arguments both = layout(6, 2, 1, 2, 4);
  expect_contiguous(both);
  EXPECT_EQ(chunk_layers(both, 1, 0), (std::pair<int64_t, int64_t>{2, 4}));
}

}  // namespace
}  // namespace gale
