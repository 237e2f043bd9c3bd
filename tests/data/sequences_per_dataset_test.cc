// --per-dataset-sequences-path: the file Megatron's tools/build_sequences_per_dataset.py writes
// (tests/data/reference/samples/main_data_flags.json, from Megatron-LM main's _IndexReader) is read
// and agrees with the corpora; a missing prefix, a stale count, a wrong dtype and malformed files
// are clear errors naming the flag.
#include "data/sequences_per_dataset.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"

namespace gale {
namespace {

using json = nlohmann::json;

const std::string kSamples = std::string(GALE_TEST_DATA_DIR) + "/reference/samples";

// Megatron's file for corpora a, b and c, with @SAMPLES@ spelled out.
std::string megatron_file(const testing::TempDir& dir) {
  json j = testing::load_json(kSamples + "/main_data_flags.json")["sequences_per_dataset"]["json"];
  json real = json::object();
  for (auto it = j.begin(); it != j.end(); ++it)
    real[kSamples + it.key().substr(std::string("@SAMPLES@").size())] = it.value();
  const std::string path = dir.file("sequences.json");
  testing::write_file(path, real.dump());
  return path;
}

TEST(SequencesPerDataset, MegatronsFileAgreesWithTheCorpora) {
  testing::TempDir dir;
  auto file = load_sequences_per_dataset(megatron_file(dir));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  ASSERT_EQ(file->counts.size(), 3u);
  for (const char* name : {"a", "b", "c"}) {
    auto ds = IndexedDataset::open(kSamples + "/" + name);
    ASSERT_TRUE(ds.ok());
    EXPECT_EQ(file->counts.at(kSamples + "/" + name),
              std::make_pair((*ds)->num_sequences(), (*ds)->num_documents() + 1));
    EXPECT_TRUE(check_declared_index(*file, **ds, 50257).ok()) << name;
  }
}

TEST(SequencesPerDataset, TokenDtypeFollowsTheVocabularySize) {
  EXPECT_EQ(sequences_per_dataset_dtype(50257), TokenDType::kUInt16);
  EXPECT_EQ(sequences_per_dataset_dtype(65536), TokenDType::kUInt16);
  EXPECT_EQ(sequences_per_dataset_dtype(65537), TokenDType::kInt32);
  // Not DType.optimal_dtype's threshold (65500), which preprocessing uses.
  EXPECT_EQ(optimal_token_dtype(65520), TokenDType::kInt32);
  EXPECT_EQ(sequences_per_dataset_dtype(65520), TokenDType::kUInt16);
}

TEST(SequencesPerDataset, MissingStaleOrMistypedEntriesAreRefused) {
  testing::TempDir dir;
  auto file = load_sequences_per_dataset(megatron_file(dir));
  ASSERT_TRUE(file.ok());
  auto a = IndexedDataset::open(kSamples + "/a");
  ASSERT_TRUE(a.ok());

  SequencesPerDataset missing = *file;
  missing.counts.erase(kSamples + "/a");
  Status s = check_declared_index(missing, **a, 50257);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("--per-dataset-sequences-path " + file->path + ": no entry for dataset prefix '" +
                             kSamples + "/a'"),
            std::string::npos)
      << s.message();

  for (int which = 0; which < 2; ++which) {
    SequencesPerDataset stale = *file;
    auto& entry = stale.counts.at(kSamples + "/a");
    (which == 0 ? entry.first : entry.second) += 1;
    s = check_declared_index(stale, **a, 50257);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("the file is stale"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("holds [704, 301]"), std::string::npos) << s.message();
  }

  s = check_declared_index(*file, **a, 100000);  // int32 for this vocabulary; the corpus is uint16
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("holds uint16 tokens but with this file Megatron reads them as int32"), std::string::npos)
      << s.message();
}

TEST(SequencesPerDataset, MalformedFilesAreRefused) {
  testing::TempDir dir;
  auto expect_error = [&](const std::string& text, const std::string& fragment) {
    const std::string path = dir.file("f.json");
    testing::write_file(path, text);
    auto f = load_sequences_per_dataset(path);
    ASSERT_FALSE(f.ok()) << text;
    EXPECT_NE(f.status().message().find("--per-dataset-sequences-path " + path + ": " + fragment), std::string::npos)
        << f.status().message();
  };
  expect_error("not json", "expected a JSON object {prefix: [sequence_count, document_count]}, found text that is not JSON");
  expect_error("[1, 2]", "expected a JSON object {prefix: [sequence_count, document_count]}, found array");
  expect_error("{\"p\": [1]}", "expected 'p' to map to [sequence_count, document_count] (two non-negative integers), found [1]");
  expect_error("{\"p\": [1, -2]}", "expected 'p' to map to");
  expect_error("{\"p\": [1.5, 2]}", "expected 'p' to map to");
  expect_error("{\"p\": {\"a\": 1}}", "expected 'p' to map to");
  auto none = load_sequences_per_dataset(dir.file("absent.json"));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--per-dataset-sequences-path " + dir.file("absent.json") + ": cannot open"),
            std::string::npos);
  testing::write_file(dir.file("empty.json"), "{}");
  auto empty = load_sequences_per_dataset(dir.file("empty.json"));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->counts.empty());
}

}  // namespace
}  // namespace gale
