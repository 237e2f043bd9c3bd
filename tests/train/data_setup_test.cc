// build_pretrain_data against Megatron's own dataset code: for six flag sets (one prefix with the
// default split, many epochs with --eod-mask-loss/--reset-position-ids/--reset-attention-mask,
// weighted and unweighted blends, per-split paths, mock data) the split sizes and sampled
// training samples equal tests/data/reference/samples/golden.json, written by
// tools/reference/gpt_samples_reference.py with Megatron core_v0.12.1.
#include "train/data_setup.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/data_test_util.h"
#include "train/arg_parser.h"

namespace gale {
namespace {

using json = nlohmann::json;

const std::string kSamples = std::string(GALE_TEST_DATA_DIR) + "/reference/samples";
const std::string kGpt2 = std::string(GALE_TEST_DATA_DIR) + "/../../data/tokenizers/gpt2";

const json& golden() {
  static json j = testing::load_json(kSamples + "/golden.json");
  return j;
}

std::string substitute(std::string s) {
  for (auto [from, to] : {std::pair<std::string, std::string>{"@SAMPLES@", kSamples}, {"@GPT2@", kGpt2}}) {
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from)) s.replace(p, from.size(), to);
  }
  return s;
}

// Parses the flags as `gale pretrain` would and applies the data-flag validation.
StatusOr<Arguments> parse_flags(const std::vector<std::string>& flags, const std::vector<std::string>& extra = {}) {
  Arguments a;
  ArgParser p("gale pretrain", "test");
  add_all_pretrain_args(p, a);
  std::vector<std::string> args = {"gale"};
  for (const auto& f : flags) args.push_back(substitute(f));
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  GALE_RETURN_IF_ERROR(p.parse(static_cast<int>(argv.size()), argv.data()));
  GALE_RETURN_IF_ERROR(validate_data_args(a, p));
  return a;
}

class MegatronSamples : public ::testing::TestWithParam<std::string> {};

TEST_P(MegatronSamples, SizesAndSamplesMatchMegatron) {
  const json& sc = golden()["scenarios"][GetParam()];
  auto args = parse_flags(sc["flags"].get<std::vector<std::string>>());
  ASSERT_TRUE(args.ok()) << args.status().to_string();
  auto counts = pretrain_sample_counts(*args);
  EXPECT_EQ(counts.train, sc["sizes"][0].get<int64_t>());
  EXPECT_EQ(counts.valid, sc["sizes"][1].get<int64_t>());
  EXPECT_EQ(counts.test, sc["sizes"][2].get<int64_t>());
  auto data = build_pretrain_data(*args, [](const std::string&) {});
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  const SampleDataset* splits[3] = {data->train.get(), data->valid.get(), data->test.get()};
  const char* names[3] = {"train", "valid", "test"};
  bool reset_mask = args->data.reset_attention_mask;
  for (int i = 0; i < 3; ++i) {
    const json& g = sc["splits"][names[i]];
    SCOPED_TRACE(std::string(names[i]));
    if (g.is_null()) {
      EXPECT_EQ(splits[i], nullptr);
      continue;
    }
    ASSERT_NE(splits[i], nullptr);
    EXPECT_EQ(splits[i]->size(), g["size"].get<int64_t>());
    TrainingSample s;
    for (const json& want : g["samples"]) {
      int64_t k = want["index"].get<int64_t>();
      ASSERT_TRUE(splits[i]->get(k, &s).ok());
      EXPECT_EQ(s.tokens, want["tokens"].get<std::vector<int32_t>>()) << "sample " << k;
      EXPECT_EQ(s.labels, want["labels"].get<std::vector<int32_t>>()) << "sample " << k;
      std::vector<int> loss(s.loss_mask.begin(), s.loss_mask.end());
      EXPECT_EQ(loss, want["loss_mask"].get<std::vector<int>>()) << "sample " << k;
      EXPECT_EQ(s.position_ids, want["position_ids"].get<std::vector<int32_t>>()) << "sample " << k;
      // Megatron's mask row i lets token i see columns [attn_start[i], i]; ours: equal document ids.
      std::vector<int> start(s.document_ids.size());
      for (size_t t = 0; t < start.size(); ++t) {
        size_t j = t;
        while (j > 0 && s.document_ids[j - 1] == s.document_ids[t]) --j;
        start[t] = static_cast<int>(j);
      }
      EXPECT_EQ(start, want["attn_start"].get<std::vector<int>>()) << "sample " << k;
      if (!reset_mask) {
        EXPECT_EQ(std::count(s.document_ids.begin(), s.document_ids.end(), 0),
                  static_cast<long>(s.document_ids.size()));
      }
    }
  }
}

std::vector<std::string> scenario_names() {
  std::vector<std::string> out;
  for (auto it = golden()["scenarios"].begin(); it != golden()["scenarios"].end(); ++it) out.push_back(it.key());
  return out;
}
INSTANTIATE_TEST_SUITE_P(Megatron, MegatronSamples, ::testing::ValuesIn(scenario_names()),
                         [](const auto& info) { return info.param; });

TEST(DataSetup, CachedIndicesGiveTheSameSamples) {
  testing::TempDir dir;
  const json& sc = golden()["scenarios"]["weighted_blend"];
  auto args = parse_flags(sc["flags"].get<std::vector<std::string>>(), {"--data-cache-path", dir.file("cache")});
  ASSERT_TRUE(args.ok());
  auto first = build_pretrain_data(*args, [](const std::string&) {});
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  std::vector<std::string> logs;
  auto second = build_pretrain_data(*args, [&](const std::string& l) { logs.push_back(l); });
  ASSERT_TRUE(second.ok());
  bool from_cache = false;
  for (const auto& l : logs) from_cache = from_cache || l.find("indices from cache") != std::string::npos;
  EXPECT_TRUE(from_cache);
  TrainingSample a, b;
  for (int64_t k = 0; k < first->train->size(); k += 7) {
    ASSERT_TRUE(first->train->get(k, &a).ok());
    ASSERT_TRUE(second->train->get(k, &b).ok());
    EXPECT_EQ(a.tokens, b.tokens);
  }
  // A damaged cache entry is rebuilt, not trusted.
  for (const auto& e : std::filesystem::directory_iterator(dir.file("cache")))
    if (e.path().string().find("shuffle_index.npy") != std::string::npos)
      testing::write_file(e.path().string(), "garbage");
  auto third = build_pretrain_data(*args, [](const std::string&) {});
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE(third->train->get(5, &b).ok());
  ASSERT_TRUE(first->train->get(5, &a).ok());
  EXPECT_EQ(a.tokens, b.tokens);
}

TEST(DataSetup, MockDataUsesNullTokenizer) {
  auto args = parse_flags({"--mock-data", "--vocab-size", "5000", "--seq-length", "1024", "--global-batch-size", "2",
                           "--micro-batch-size", "1", "--train-iters", "3"});
  ASSERT_TRUE(args.ok());
  auto data = build_pretrain_data(*args, [](const std::string&) {});
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  EXPECT_EQ(data->tokenizer->type(), "NullTokenizer");
  EXPECT_EQ(data->vocab_size, 5001);
  EXPECT_EQ(data->eod, 5000);
}

TEST(DataSetup, ClearErrors) {
  auto expect_error = [](const std::vector<std::string>& flags, const std::string& fragment) {
    auto args = parse_flags(flags);
    Status s = args.status();
    if (s.ok()) s = build_pretrain_data(*args, [](const std::string&) {}).status();
    ASSERT_FALSE(s.ok()) << "expected: " << fragment;
    EXPECT_NE(s.message().find(fragment), std::string::npos) << s.to_string();
  };
  std::vector<std::string> base = {"--seq-length",        "16",
                                   "--global-batch-size", "4",
                                   "--micro-batch-size",  "1",
                                   "--train-iters",       "10",
                                   "--tokenizer-type",    "GPT2BPETokenizer",
                                   "--vocab-file",        kGpt2 + "/vocab.json",
                                   "--merge-file",        kGpt2 + "/merges.txt"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> f = base;
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  };
  // c has 65 sequences: with 969,30,1 the test split [65, 65) is empty but 400 samples are needed.
  expect_error(with({"--data-path", kSamples + "/c"}), "test split is empty");
  expect_error(with({"--data-path", kSamples + "/missing"}), "missing.idx: no such file");
  expect_error(with({"--data-path", kSamples + "/c", "--split", "0,1,0"}), "train split");
  expect_error(with({"--data-path", kSamples + "/c", "--train-data-path", kSamples + "/c"}), "exclusive");
  expect_error(with({"--mock-data", "--data-path", kSamples + "/c"}), "exclusive");
  expect_error({"--mock-data", "--seq-length", "8", "--global-batch-size", "1", "--train-iters", "1"}, "--vocab-size");
  expect_error(
      {"--mock-data", "--vocab-size", "100", "--seq-length", "8", "--global-batch-size", "1", "--train-iters", "1"},
      "--vocab-size 4095 or more");
  expect_error(with({"--data-path", "0.5", kSamples + "/a", "b", kSamples + "/c"}), "--data-path");
  expect_error({"--seq-length", "16", "--global-batch-size", "4", "--micro-batch-size", "1", "--train-iters", "10000",
                "--eval-iters", "0", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", kGpt2 + "/vocab.json",
                "--merge-file", kGpt2 + "/merges.txt", "--train-data-path", kSamples + "/a", kSamples + "/c"},
               "samples but 40000 are needed");
}

TEST(DataSetup, TokenIdsBeyondTheVocabularyAreReported) {
  // A dataset written with ids of a bigger vocabulary than the tokenizer's.
  testing::TempDir dir;
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 50; ++d) docs.push_back(std::vector<int32_t>(30, d == 10 ? 60000 : 5));
  testing::write_dataset(dir.file("big"), docs, TokenDType::kInt32);
  auto args = parse_flags({"--seq-length",
                           "16",
                           "--global-batch-size",
                           "2",
                           "--micro-batch-size",
                           "1",
                           "--train-iters",
                           "20",
                           "--eval-iters",
                           "0",
                           "--data-path",
                           dir.file("big"),
                           "--split",
                           "1,0,0",
                           "--tokenizer-type",
                           "GPT2BPETokenizer",
                           "--vocab-file",
                           kGpt2 + "/vocab.json",
                           "--merge-file",
                           kGpt2 + "/merges.txt"});
  ASSERT_TRUE(args.ok()) << args.status().to_string();
  auto data = build_pretrain_data(*args, [](const std::string&) {});
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  TrainingSample s;
  int errors = 0;
  for (int64_t k = 0; k < data->train->size(); ++k) {
    Status st = data->train->get(k, &s);
    if (!st.ok()) {
      ++errors;
      EXPECT_NE(st.message().find("token id 60000"), std::string::npos) << st.message();
    }
  }
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace gale

namespace gale {
namespace {

TEST(DataSetup, RebuildingGivesTheSameSamplesSoResumeReadsTheSameData) {
  // A resumed run rebuilds the datasets and continues at consumed_train_samples: sample k must
  // not depend on anything but the flags.
  const json& sc = golden()["scenarios"]["single_many_epochs_flags"];
  auto args = parse_flags(sc["flags"].get<std::vector<std::string>>());
  ASSERT_TRUE(args.ok());
  auto a = build_pretrain_data(*args, [](const std::string&) {});
  auto b = build_pretrain_data(*args, [](const std::string&) {});
  ASSERT_TRUE(a.ok() && b.ok());
  TrainingSample x, y;
  for (int64_t consumed : {0, 8, 1600}) {
    for (int64_t k = consumed; k < consumed + 8; ++k) {
      ASSERT_TRUE(a->train->get(k, &x).ok());
      ASSERT_TRUE(b->train->get(k, &y).ok());
      EXPECT_EQ(x.tokens, y.tokens);
      EXPECT_EQ(x.labels, y.labels);
    }
  }
}

TEST(DataSetup, EmptyDatasetIsAnError) {
  testing::TempDir dir;
  testing::write_dataset(dir.file("empty"), {});
  auto args =
      parse_flags({"--seq-length", "16", "--global-batch-size", "2", "--micro-batch-size", "1", "--train-iters", "5",
                   "--data-path", dir.file("empty"), "--tokenizer-type", "NullTokenizer", "--vocab-size", "100"});
  ASSERT_TRUE(args.ok()) << args.status().to_string();
  auto data = build_pretrain_data(*args, [](const std::string&) {});
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.status().message().find("train split is empty"), std::string::npos) << data.status().message();
}

}  // namespace
}  // namespace gale
