// GPTDataset indices: megatron.md §3.6 golden vectors (from Megatron's own code) and 40 random
// configurations computed with NumPy by tools/reference/gpt_dataset_reference.py.
#include "data/gpt_indices.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"

namespace gale {
namespace {

std::vector<std::vector<int64_t>> rows(const std::vector<int64_t>& flat) {
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i + 1 < flat.size(); i += 2) out.push_back({flat[i], flat[i + 1]});
  return out;
}

const std::vector<int32_t> kGoldenSizes = {5, 3, 8, 2, 7, 4, 6, 1, 9, 3};

TEST(GptIndices, MegatronGoldenOneEpoch) {
  GptIndexParams p;
  p.seq_length = 8;
  p.num_samples = 4;
  p.seed = 1234;
  UnalignedArray<int32_t> sizes(kGoldenSizes.data(), 10);
  auto g = build_gpt_indices(sizes, 0, 10, p, "golden");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->num_epochs, 1);
  EXPECT_EQ(g->document_index, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  EXPECT_EQ(rows(g->sample_index), (std::vector<std::vector<int64_t>>{{0, 0}, {1, 7}, {4, 1}, {5, 4}, {6, 3}, {8, 0}}));
  EXPECT_EQ(g->shuffle_index, (std::vector<int64_t>{0, 4, 3, 2, 1}));
}

TEST(GptIndices, MegatronGoldenSeparateFinalEpoch) {
  GptIndexParams p;
  p.seq_length = 8;
  p.num_samples = 12;
  p.seed = 1234;
  UnalignedArray<int32_t> sizes(kGoldenSizes.data(), 10);
  auto g = build_gpt_indices(sizes, 0, 10, p, "golden");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->num_epochs, 3);
  EXPECT_TRUE(g->separate_final_epoch);
  EXPECT_EQ(g->document_index, (std::vector<int32_t>{3, 3, 2, 6, 4, 5, 4, 0, 8, 8, 7, 1, 0, 9, 7,
                                                     1, 9, 2, 6, 5, 8, 1, 7, 6, 9, 5, 4, 3, 0, 2}));
  EXPECT_EQ(g->shuffle_index, (std::vector<int64_t>{8, 5, 6, 1, 4, 10, 2, 3, 9, 0, 7, 12, 11, 16, 13, 15, 14}));
}

TEST(GptIndices, MatchNumpyReferenceOnRandomConfigurations) {
  auto j = testing::load_json(testing::reference_path("gpt_indices_golden.json"));
  int checked = 0;
  for (const auto& c : j["gpt_indices"]) {
    auto sizes_v = c["sizes"].get<std::vector<int32_t>>();
    UnalignedArray<int32_t> sizes(sizes_v.data(), static_cast<int64_t>(sizes_v.size()));
    GptIndexParams p;
    p.seq_length = c["seq_length"].get<int64_t>();
    p.num_samples = c["num_samples"].is_null() ? -1 : c["num_samples"].get<int64_t>();
    p.seed = c["seed"].get<uint32_t>();
    p.drop_last = c["drop_last"].get<bool>();
    auto g = build_gpt_indices(sizes, c["begin"].get<int64_t>(), c["end"].get<int64_t>(), p, "case");
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    SCOPED_TRACE(c.dump().substr(0, 200));
    EXPECT_EQ(g->num_epochs, c["epochs"].get<int64_t>());
    EXPECT_EQ(g->separate_final_epoch, c["separate"].get<bool>());
    EXPECT_EQ(g->document_index, c["document_index"].get<std::vector<int32_t>>());
    EXPECT_EQ(rows(g->sample_index), c["sample_index"].get<std::vector<std::vector<int64_t>>>());
    EXPECT_EQ(g->shuffle_index, c["shuffle_index"].get<std::vector<int64_t>>());
    if (p.num_samples >= 0) {
      EXPECT_GE(g->size(), p.num_samples);
    }
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

TEST(GptIndices, EmptySplitIsAnErrorNotAnEndlessLoop) {
  std::vector<int32_t> s = {4, 4, 4};
  UnalignedArray<int32_t> sizes(s.data(), 3);
  GptIndexParams p;
  p.seq_length = 4;
  p.num_samples = 10;
  auto g = build_gpt_indices(sizes, 3, 3, p, "corpus (test split)");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("corpus (test split)"), std::string::npos);
  EXPECT_NE(g.status().message().find("loop forever"), std::string::npos);
}

TEST(GptIndices, RejectsBadParameters) {
  std::vector<int32_t> s = {4, 4};
  UnalignedArray<int32_t> sizes(s.data(), 2);
  GptIndexParams p;
  p.seq_length = 1;
  EXPECT_FALSE(build_gpt_indices(sizes, 0, 2, p, "x").ok());
  p.seq_length = 4;
  EXPECT_FALSE(build_gpt_indices(sizes, 0, 3, p, "x").ok());
  EXPECT_FALSE(build_gpt_indices(sizes, 2, 1, p, "x").ok());
}

TEST(GptIndices, EverySampleHasSeqLengthPlusOneTokens) {
  // Walk the sample index and count tokens: each sample spans S + 1 tokens (sharing one).
  std::vector<int32_t> s;
  for (int i = 0; i < 200; ++i) s.push_back(1 + (i * 37) % 50);
  UnalignedArray<int32_t> sizes(s.data(), 200);
  GptIndexParams p;
  p.seq_length = 16;
  p.num_samples = 900;
  auto g = build_gpt_indices(sizes, 0, 200, p, "walk");
  ASSERT_TRUE(g.ok());
  const auto& si = g->sample_index;
  for (int64_t j = 0; j < g->size(); ++j) {
    int64_t d0 = si[2 * j], o0 = si[2 * j + 1], d1 = si[2 * j + 2], o1 = si[2 * j + 3];
    int64_t n = 0;
    if (d0 == d1) {
      n = o1 - o0 + 1;
    } else {
      n = s[g->document_index[d0]] - o0;
      for (int64_t d = d0 + 1; d < d1; ++d) n += s[g->document_index[d]];
      n += o1 + 1;
    }
    ASSERT_EQ(n, 17) << "sample " << j;
  }
}

}  // namespace
}  // namespace gale
