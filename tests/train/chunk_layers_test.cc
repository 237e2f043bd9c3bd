// Layer placement over pipeline ranks and virtual stages (also with
// --account-for-embedding/loss-in-pipeline-split) equals Megatron-Core's
// (get_transformer_layer_offset / get_num_layers_to_build, recorded in
// tests/data/schedule/megatron_layers.json by tools/reference/pipeline_order.py), and every
// layout places every layer exactly once, in order along the virtual stages; so do the explicit
// counts of --num-layer-list / --pipeline-num-transformer-layers; DualPipeV's V placement.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "train/engine.h"

namespace gale {
namespace {

Arguments layout(int64_t num_layers, int64_t pp, int64_t vpp, int64_t first, int64_t last, bool embedding = false,
                 bool loss = false) {
  Arguments a;
  a.model.num_layers = num_layers;
  a.parallel.pipeline_model_parallel_size = pp;
  a.parallel.virtual_pipeline_model_parallel_size = vpp;
  a.parallel.decoder_first_pipeline_num_layers = first;
  a.parallel.decoder_last_pipeline_num_layers = last;
  a.parallel.account_for_embedding_in_pipeline_split = embedding;
  a.parallel.account_for_loss_in_pipeline_split = loss;
  return a;
}

TEST(ChunkLayers, MatchMegatron) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/schedule/megatron_layers.json");
  ASSERT_TRUE(in.good()) << "tests/data/schedule/megatron_layers.json is missing";
  int cases = 0, accounting = 0;
  for (const auto& j : nlohmann::json::parse(in)) {
    auto opt = [&](const char* key) { return j.at(key).is_null() ? kUnset : j.at(key).get<int64_t>(); };
    const int64_t pp = j.at("pp").get<int64_t>(), vpp = j.at("vpp").is_null() ? 1 : j.at("vpp").get<int64_t>();
    // --account-for-embedding/loss-in-pipeline-split, recorded only when set.
    const bool embedding = j.value("embedding", false), loss = j.value("loss", false);
    Arguments a = layout(j.at("num_layers").get<int64_t>(), pp, vpp, opt("first"), opt("last"), embedding, loss);
    accounting += embedding || loss;
    const auto& ranks = j.at("chunks");
    ASSERT_EQ(static_cast<int64_t>(ranks.size()), pp);
    for (int64_t r = 0; r < pp; ++r)
      for (int64_t v = 0; v < vpp; ++v) {
        auto expected = ranks[static_cast<size_t>(r)][static_cast<size_t>(v)].get<std::pair<int64_t, int64_t>>();
        EXPECT_EQ(chunk_layers(a, r, v), expected) << j.dump() << " rank " << r << " chunk " << v;
      }
    ++cases;
  }
  EXPECT_GE(cases, 20);
  EXPECT_GE(accounting, 9);
}

// Virtual stage s = v·P + r holds the layers right after those of stage s − 1 (at least one,
// except the first (last) virtual stage when it counts the embedding (loss) as a layer).
void expect_contiguous(const Arguments& a) {
  const int64_t pp = a.parallel.pipeline_model_parallel_size, vpp = a.parallel.virtual_pipeline_model_parallel_size;
  int64_t next = 0;
  for (int64_t v = 0; v < vpp; ++v)
    for (int64_t r = 0; r < pp; ++r) {
      auto [first, count] = chunk_layers(a, r, v);
      EXPECT_EQ(first, next) << "rank " << r << " chunk " << v;
      const bool may_be_empty = (v == 0 && r == 0 && a.parallel.account_for_embedding_in_pipeline_split) ||
                                (v == vpp - 1 && r == pp - 1 && a.parallel.account_for_loss_in_pipeline_split);
      EXPECT_GE(count, may_be_empty ? 0 : 1);
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

// --schedules-method dualpipev: 2·PP equal chunks along the V, rank r holding chunk r (its chunk 0)
// and chunk 2PP−1−r (its chunk 1): down the ranks, then back up.
TEST(ChunkLayers, DualPipeVPlacesTheLayersAlongTheV) {
  Arguments a = layout(16, 4, 2, kUnset, kUnset);
  a.parallel.schedules_method = "dualpipev";
  using Range = std::pair<int64_t, int64_t>;
  const Range expected[4][2] = {{{0, 2}, {14, 2}}, {{2, 2}, {12, 2}}, {{4, 2}, {10, 2}}, {{6, 2}, {8, 2}}};
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t v = 0; v < 2; ++v) {
      EXPECT_EQ(chunk_layers(a, r, v), expected[r][v]) << "rank " << r << " chunk " << v;
      EXPECT_EQ(virtual_stage_of(a, r, v), v == 0 ? r : 7 - r);
    }
  Arguments two = layout(4, 2, 2, kUnset, kUnset);
  two.parallel.schedules_method = "dualpipev";
  EXPECT_EQ(chunk_layers(two, 0, 1), (Range{3, 1}));
  EXPECT_EQ(chunk_layers(two, 1, 1), (Range{2, 1}));
}

// --account-for-embedding/loss-in-pipeline-split: the embedding (loss) takes one layer's place on
// the first (last) virtual stage.
TEST(ChunkLayers, EmbeddingAndLossCountAsLayers) {
  // 7 layers + the embedding on 4 stages: 1, 2, 2, 2.
  Arguments embedding = layout(7, 4, 1, kUnset, kUnset, true, false);
  expect_contiguous(embedding);
  EXPECT_EQ(chunk_layers(embedding, 0, 0), (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(chunk_layers(embedding, 3, 0), (std::pair<int64_t, int64_t>{5, 2}));
  // 10 layers + embedding + loss on 2 stages x 3 virtual stages of 2: the first virtual stage holds
  // the embedding and layer 0, the last layer 9 and the loss.
  Arguments both = layout(10, 2, 3, kUnset, kUnset, true, true);
  expect_contiguous(both);
  EXPECT_EQ(chunk_layers(both, 0, 0), (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(chunk_layers(both, 1, 0), (std::pair<int64_t, int64_t>{1, 2}));
  EXPECT_EQ(chunk_layers(both, 1, 2), (std::pair<int64_t, int64_t>{9, 1}));
  // One slot per virtual stage: the first and the last build no transformer layer.
  Arguments empty_ends = layout(2, 2, 2, kUnset, kUnset, true, true);
  expect_contiguous(empty_ends);
  EXPECT_EQ(chunk_layers(empty_ends, 0, 0), (std::pair<int64_t, int64_t>{0, 0}));
  EXPECT_EQ(chunk_layers(empty_ends, 1, 1), (std::pair<int64_t, int64_t>{2, 0}));
  // Without pipelining the flags change nothing.
  expect_contiguous(layout(5, 1, 1, kUnset, kUnset, true, true));
  EXPECT_EQ(chunk_layers(layout(5, 1, 1, kUnset, kUnset, true, true), 0, 0), (std::pair<int64_t, int64_t>{0, 5}));
}

// MindSpeed's --pipeline-num-transformer-layers / MindSpeed-LLM's --num-layer-list: each virtual
// stage holds its count, in virtual-stage order (MindSpeed's get_layer_offset_pp_vp_unaligned).
Arguments explicit_layout(std::vector<std::vector<int64_t>> rows) {
  int64_t total = 0;
  for (const auto& row : rows)
    for (int64_t n : row) total += n;
  Arguments a = layout(total, static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size()), kUnset, kUnset);
  a.parallel.pipeline_layers = std::move(rows);
  return a;
}

TEST(ChunkLayers, ExplicitCountsPerStage) {
  using Range = std::pair<int64_t, int64_t>;
  // --num-layer-list 1,3 and 4,6,6,4 (no virtual stages).
  Arguments two = explicit_layout({{1}, {3}});
  expect_contiguous(two);
  EXPECT_EQ(chunk_layers(two, 0, 0), (Range{0, 1}));
  EXPECT_EQ(chunk_layers(two, 1, 0), (Range{1, 3}));
  Arguments four = explicit_layout({{4}, {6}, {6}, {4}});
  expect_contiguous(four);
  EXPECT_EQ(chunk_layers(four, 2, 0), (Range{10, 6}));
  EXPECT_EQ(chunk_layers(four, 3, 0), (Range{16, 4}));
  // MindSpeed's example [[0,1],[1,1]*4,[1,0]]: 6 ranks, 2 virtual stages; chunk 0 of every rank
  // first (layers 0-4), then chunk 1 (layers 5-9).
  Arguments vpp = explicit_layout({{0, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 0}});
  EXPECT_EQ(chunk_layers(vpp, 0, 0), (Range{0, 0}));
  EXPECT_EQ(chunk_layers(vpp, 1, 0), (Range{0, 1}));
  EXPECT_EQ(chunk_layers(vpp, 5, 0), (Range{4, 1}));
  EXPECT_EQ(chunk_layers(vpp, 0, 1), (Range{5, 1}));
  EXPECT_EQ(chunk_layers(vpp, 4, 1), (Range{9, 1}));
  EXPECT_EQ(chunk_layers(vpp, 5, 1), (Range{10, 0}));
  // Uneven virtual stages inside a rank: [[1,2],[4,1]] -> rank 0 holds 0 and 5-6, rank 1 1-4 and 7.
  Arguments uneven = explicit_layout({{1, 2}, {4, 1}});
  EXPECT_EQ(chunk_layers(uneven, 0, 0), (Range{0, 1}));
  EXPECT_EQ(chunk_layers(uneven, 1, 0), (Range{1, 4}));
  EXPECT_EQ(chunk_layers(uneven, 0, 1), (Range{5, 2}));
  EXPECT_EQ(chunk_layers(uneven, 1, 1), (Range{7, 1}));
  // Megatron's flags are the special case of the same table: first 2, last 2, middle 4 each.
  EXPECT_EQ(pipeline_layer_counts(layout(12, 4, 2, 2, 2)),
            (std::vector<std::vector<int64_t>>{{1, 1}, {2, 2}, {2, 2}, {1, 1}}));
  EXPECT_EQ(pipeline_layer_counts(layout(10, 2, 3, kUnset, kUnset, true, true)),
            (std::vector<std::vector<int64_t>>{{1, 2, 2}, {2, 2, 1}}));
}

}  // namespace
}  // namespace gale
