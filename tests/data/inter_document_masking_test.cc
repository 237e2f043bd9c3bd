// Megatron's --dataloader-inter-document-masking on GPT samples: the parts' arithmetic (extra token,
// padding), Megatron-LM main's own samples (megatron_inter_document_reference.py), and, on documents that each end with one EOD, samples equal to --reset-attention-mask
// --reset-position-ids (the EOD-based documents are then the dataset's documents); without EODs the
// documents still separate, which --reset-attention-mask cannot see.
#include <gtest/gtest.h>

#include <random>

#include "data/data_test_util.h"
#include "data/gpt_dataset.h"
#include "data/sample.h"
#include "data/token_source.h"

namespace gale {
namespace {

TrainingSample blank(int64_t S) {
  TrainingSample s;
  s.position_ids.assign(static_cast<size_t>(S), 7);
  s.document_ids.assign(static_cast<size_t>(S), 7);
  s.tokens.assign(static_cast<size_t>(S), 1);
  return s;
}

TEST(InterDocumentMasking, PartsBecomeDocumentsWithTheirOwnPositions) {
  TrainingSample s = blank(10);
  apply_inter_document_masking({3, 4, 4}, 1, &s);  // 11 ids: the extra token comes off the last part
  EXPECT_EQ(s.document_ids, (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(s.position_ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 0, 1, 2}));
  s = blank(4);
  apply_inter_document_masking({4, 1}, 1, &s);  // the last part is only the extra token: dropped
  EXPECT_EQ(s.document_ids, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(s.position_ids, (std::vector<int32_t>{0, 1, 2, 3}));
  s = blank(10);
  apply_inter_document_masking({2, 3}, 1, &s);  // padded sample: the shortfall joins the last part
  EXPECT_EQ(s.document_ids, (std::vector<int32_t>{0, 0, 1, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(s.position_ids, (std::vector<int32_t>{0, 1, 0, 1, 2, 3, 4, 5, 6, 7}));
  s = blank(3);
  apply_inter_document_masking({2, 0, 2}, 1, &s);  // an empty document in between is no document
  EXPECT_EQ(s.document_ids, (std::vector<int32_t>{0, 0, 1}));
}

// tools/reference/megatron_inter_document_reference.py: Megatron-LM main's GPTDataset.__getitem__
// with inter_document_masking on six hand-made samples (across documents, a padded last sample, a
// last part of only the extra token), plain and with --reset-attention-mask --reset-position-ids
// --eod-mask-loss (which the document parts override).
TEST(InterDocumentMasking, SamplesEqualMegatrons) {
  const auto golden = testing::load_json(std::string(GALE_TEST_DATA_DIR) + "/megatron_sft/inter_document.json");
  const int64_t S = golden["seq_length"].get<int64_t>();
  int checked = 0;
  for (const auto& flags : golden["flags"]) {
    SCOPED_TRACE(flags["name"].get<std::string>());
    SampleOptions o;
    o.eod = golden["eod"].get<int32_t>();
    o.pad = golden["pad"].get<int32_t>();
    o.reset_position_ids = flags["reset_position_ids"].get<bool>();
    o.reset_attention_mask = flags["reset_attention_mask"].get<bool>();
    o.eod_mask_loss = flags["eod_mask_loss"].get<bool>();
    o.inter_document_masking = true;
    for (const auto& want : flags["samples"]) {
      const auto text = want["text"].get<std::vector<int32_t>>();
      const auto parts = want["parts"].get<std::vector<int64_t>>();
      TrainingSample got;
      assemble_sample(text, 1, o, &got);
      apply_inter_document_masking(parts, 1, &got);
      EXPECT_EQ(got.tokens, want["tokens"].get<std::vector<int32_t>>());
      EXPECT_EQ(got.labels, want["labels"].get<std::vector<int32_t>>());
      EXPECT_EQ(got.position_ids, want["position_ids"].get<std::vector<int32_t>>());
      std::vector<int32_t> mask(got.loss_mask.begin(), got.loss_mask.end());
      EXPECT_EQ(mask, want["loss_mask"].get<std::vector<int32_t>>());
      // Megatron's cu_seqlens as document ids: segment k covers [cu[k], cu[k+1]).
      const auto cu = want["cu_seqlens"].get<std::vector<int32_t>>();
      std::vector<int32_t> documents(static_cast<size_t>(S));
      for (size_t k = 0; k + 1 < cu.size(); ++k)
        for (int32_t i = cu[k]; i < cu[k + 1]; ++i) documents[static_cast<size_t>(i)] = static_cast<int32_t>(k);
      EXPECT_EQ(got.document_ids, documents);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
}

struct Corpus {
  testing::TempDir dir;
  std::shared_ptr<TokenSource> source;
  explicit Corpus(bool eod_at_end) {
    std::mt19937 rng(5);
    std::vector<std::vector<int32_t>> docs;
    for (int d = 0; d < 60; ++d) {
      std::vector<int32_t> doc(2 + rng() % 9);
      for (int32_t& t : doc) t = static_cast<int32_t>(rng() % 50);
      if (eod_at_end) doc.push_back(50);
      docs.push_back(doc);
    }
    testing::write_dataset(dir.file("docs"), docs);
    auto s = open_indexed_source(dir.file("docs"));
    EXPECT_TRUE(s.ok()) << s.status().message();
    source = *s;
  }
  std::unique_ptr<SampleDataset> samples(const SampleOptions& o) const {
    GptIndexParams p;
    p.seq_length = 16;
    p.num_samples = 40;
    auto g = GptDataset::build(source, DataSplit::kTrain, 0, source->num_sequences(), p, "", "1");
    EXPECT_TRUE(g.ok()) << g.status().message();
    return make_sample_dataset(std::move(*g), o);
  }
};

TEST(InterDocumentMasking, EqualsTheEodResetsWhenEveryDocumentEndsWithOne) {
  Corpus corpus(true);
  SampleOptions inter;
  inter.eod = 50;
  inter.inter_document_masking = true;
  SampleOptions resets = inter;
  resets.inter_document_masking = false;
  resets.reset_attention_mask = true;
  resets.reset_position_ids = true;
  auto a = corpus.samples(inter), b = corpus.samples(resets);
  int multi = 0;
  for (int64_t k = 0; k < a->size(); ++k) {
    TrainingSample x, y;
    ASSERT_TRUE(a->get(k, &x).ok());
    ASSERT_TRUE(b->get(k, &y).ok());
    EXPECT_EQ(x.tokens, y.tokens) << k;
    EXPECT_EQ(x.labels, y.labels) << k;
    EXPECT_EQ(x.loss_mask, y.loss_mask) << k;
    EXPECT_EQ(x.position_ids, y.position_ids) << k;
    EXPECT_EQ(x.document_ids, y.document_ids) << k;
    multi += x.document_ids.back() > 0;
  }
  EXPECT_GT(multi, 30);  // most samples hold several documents
}

TEST(InterDocumentMasking, SeparatesDocumentsWithoutEods) {
  Corpus corpus(false);
  SampleOptions inter;
  inter.eod = 50;
  inter.inter_document_masking = true;
  SampleOptions resets = inter;
  resets.inter_document_masking = false;
  resets.reset_attention_mask = true;
  auto a = corpus.samples(inter), b = corpus.samples(resets);
  TrainingSample x, y;
  ASSERT_TRUE(a->get(0, &x).ok());
  ASSERT_TRUE(b->get(0, &y).ok());
  EXPECT_EQ(y.document_ids, std::vector<int32_t>(16, 0)) << "no EOD: one document for --reset-attention-mask";
  EXPECT_GT(x.document_ids.back(), 0) << "the dataset's documents still separate";
  EXPECT_EQ(x.position_ids[0], y.position_ids[0]);
  EXPECT_EQ(x.tokens, y.tokens);
}

}  // namespace
}  // namespace gale
