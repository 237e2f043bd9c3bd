// build_pretrain_data with Megatron-LM main's data flags, against Megatron-LM main's own dataset
// code (tests/data/reference/samples/main_data_flags.json, tools/reference/
// megatron_main_data_flags_reference.py): --mid-level-dataset-surplus gives Megatron's sample order
// for a weighted blend at several values (and the default without the flag), a negative one its
// oversampling error; --per-dataset-sequences-path gives the same samples as without it, or a clear
// error; --allow-ambiguous-pad-tokens keeps or drops a HuggingFaceTokenizer pad equal to its eod.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "train/arg_parser.h"
#include "train/data_setup.h"

namespace gale {
namespace {

using json = nlohmann::json;

const std::string kSamples = std::string(GALE_TEST_DATA_DIR) + "/reference/samples";
const std::string kGpt2 = std::string(GALE_TEST_DATA_DIR) + "/../../data/tokenizers/gpt2";
const std::string kQwen = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/qwen2_style";

const json& golden() {
  static json j = testing::load_json(kSamples + "/main_data_flags.json");
  return j;
}

std::string substitute(std::string s) {
  for (auto [from, to] : {std::pair<std::string, std::string>{"@SAMPLES@", kSamples}, {"@GPT2@", kGpt2}})
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from)) s.replace(p, from.size(), to);
  return s;
}

StatusOr<Arguments> parse_flags(std::vector<std::string> flags) {
  Arguments a;
  ArgParser p("gale pretrain", "test");
  add_all_pretrain_args(p, a);
  std::vector<std::string> args = {"gale"};
  for (auto& f : flags) args.push_back(substitute(f));
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  GALE_RETURN_IF_ERROR(p.parse(static_cast<int>(argv.size()), argv.data()));
  GALE_RETURN_IF_ERROR(validate_data_args(a, p));
  return a;
}

// The golden run's flags followed by `extra`.
std::vector<std::string> blend_flags(const std::vector<std::string>& extra) {
  std::vector<std::string> f = golden()["flags"].get<std::vector<std::string>>();
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

// The first tokens of every sample of `ds`, as the golden file records them.
std::vector<std::vector<int32_t>> heads(const SampleDataset& ds) {
  std::vector<std::vector<int32_t>> out;
  TrainingSample s;
  for (int64_t k = 0; k < ds.size(); ++k) {
    EXPECT_TRUE(ds.get(k, &s).ok());
    out.emplace_back(s.tokens.begin(), s.tokens.begin() + 3);
  }
  return out;
}

std::string surplus_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

TEST(MidLevelDatasetSurplus, SampleOrderMatchesMegatronAtEachValue) {
  for (const json& g : golden()["surplus"]) {
    const double surplus = g["surplus"].get<double>();
    SCOPED_TRACE("surplus " + surplus_text(surplus));
    auto args = parse_flags(blend_flags({"--mid-level-dataset-surplus", surplus_text(surplus)}));
    ASSERT_TRUE(args.ok()) << args.status().to_string();
    EXPECT_EQ(args->data.mid_level_dataset_surplus, surplus);
    auto data = build_pretrain_data(*args, [](const std::string&) {});
    ASSERT_TRUE(data.ok()) << data.status().to_string();
    ASSERT_EQ(data->train->size(), g["train_size"].get<int64_t>());
    ASSERT_EQ(data->valid->size(), g["valid_size"].get<int64_t>());
    EXPECT_EQ(heads(*data->train), g["train_heads"].get<std::vector<std::vector<int32_t>>>());
    EXPECT_EQ(heads(*data->valid), g["valid_heads"].get<std::vector<std::vector<int32_t>>>());
  }
}

TEST(MidLevelDatasetSurplus, DefaultIsMegatronsAndTheValueChangesTheOrder) {
  const json& g = golden()["surplus"];
  ASSERT_EQ(g[0]["surplus"].get<double>(), 0.005);
  auto args = parse_flags(blend_flags({}));
  ASSERT_TRUE(args.ok());
  EXPECT_EQ(args->data.mid_level_dataset_surplus, 0.005);
  auto data = build_pretrain_data(*args, [](const std::string&) {});
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  EXPECT_EQ(heads(*data->train), g[0]["train_heads"].get<std::vector<std::vector<int32_t>>>());
  // The golden values at 1.0 and 2.5 differ from the default's, so the test above fails when the
  // flag is not applied.
  for (int i : {2, 3}) EXPECT_NE(g[i]["train_heads"], g[0]["train_heads"]) << g[i]["surplus"];
}

TEST(MidLevelDatasetSurplus, OversamplingIsMegatronsErrorNamingTheFlag) {
  // Megatron: "The valid blend oversamples ... requests 21 samples from GPTDataset number 1 in
  // excess of its size 6 ... mid_level_dataset_surplus ... (-0.9)".
  ASSERT_NE(golden()["negative_surplus_error"].get<std::string>().find("requests 21 samples"), std::string::npos);
  auto args = parse_flags(blend_flags({"--mid-level-dataset-surplus", "-0.9"}));
  ASSERT_TRUE(args.ok()) << args.status().to_string();
  Status s = build_pretrain_data(*args, [](const std::string&) {}).status();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("the valid blend: dataset 1 (", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("has 6 samples but the blend draws 21: its datasets were built with "
                             "--mid-level-dataset-surplus -0.9; increase it"),
            std::string::npos)
      << s.message();
}

TEST(MidLevelDatasetSurplus, BadValuesAreRefused) {
  for (const char* v : {"-1", "-3"}) {
    auto args = parse_flags(blend_flags({"--mid-level-dataset-surplus", v}));
    ASSERT_FALSE(args.ok()) << v;
    EXPECT_EQ(args.status().message(), std::string("--mid-level-dataset-surplus: expected a finite number > -1 (a "
                                                   "blend's datasets get ceil(ceil(n*w)*(1+surplus)) samples), found ") +
                                           v);
  }
  for (const char* v : {"nan", "inf", "x"}) {  // refused by the parser or by the range check, naming the flag
    auto args = parse_flags(blend_flags({"--mid-level-dataset-surplus", v}));
    ASSERT_FALSE(args.ok()) << v;
    EXPECT_NE(args.status().message().find("--mid-level-dataset-surplus"), std::string::npos)
        << args.status().message();
  }
}

// Megatron's file for corpora a, b and c, with @SAMPLES@ spelled out; `drop` is left out.
std::string sequences_file(const testing::TempDir& dir, const std::string& drop = "") {
  json j = golden()["sequences_per_dataset"]["json"];
  json real = json::object();
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != drop) real[substitute(it.key())] = it.value();
  testing::write_file(dir.file("sequences.json"), real.dump());
  return dir.file("sequences.json");
}

TEST(PerDatasetSequencesPath, SamplesEqualMegatronsWithTheFile) {
  testing::TempDir dir;
  auto args = parse_flags(blend_flags({"--per-dataset-sequences-path", sequences_file(dir)}));
  ASSERT_TRUE(args.ok()) << args.status().to_string();
  auto data = build_pretrain_data(*args, [](const std::string&) {});
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  EXPECT_EQ(heads(*data->train), golden()["sequences_per_dataset"]["train_heads"].get<std::vector<std::vector<int32_t>>>());
  // An empty object stands for no file, as in Megatron.
  testing::write_file(dir.file("empty.json"), "{}");
  auto empty = parse_flags(blend_flags({"--per-dataset-sequences-path", dir.file("empty.json")}));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(build_pretrain_data(*empty, [](const std::string&) {}).ok());
}

TEST(PerDatasetSequencesPath, MissingPrefixOrStaleCountIsRefused) {
  testing::TempDir dir;
  auto args = parse_flags(blend_flags({"--per-dataset-sequences-path", sequences_file(dir, "@SAMPLES@/b")}));
  ASSERT_TRUE(args.ok());
  Status s = build_pretrain_data(*args, [](const std::string&) {}).status();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no entry for dataset prefix '" + kSamples + "/b'"), std::string::npos) << s.message();

  json stale = testing::load_json(sequences_file(dir));
  stale[kSamples + "/a"][0] = 700;
  testing::write_file(dir.file("stale.json"), stale.dump());
  auto args2 = parse_flags(blend_flags({"--per-dataset-sequences-path", dir.file("stale.json")}));
  ASSERT_TRUE(args2.ok());
  s = build_pretrain_data(*args2, [](const std::string&) {}).status();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is listed with [700, 301] but"), std::string::npos) << s.message();
}

TEST(PerDatasetSequencesPath, RefusedWithDatasetsWithoutIdxHeaders) {
  auto args = parse_flags({"--mock-data", "--vocab-size", "5000", "--seq-length", "64", "--global-batch-size", "2",
                           "--train-iters", "2", "--per-dataset-sequences-path", "x.json"});
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().message(), "--per-dataset-sequences-path with --mock-data: not supported (it stands for "
                                     "the .idx headers of GPT pretraining datasets only)");
}

// A small corpus of ids below 1100 whose documents end with <|endoftext|> (1100), the qwen2_style
// tokenizer's eos and pad; and a copy of that tokenizer whose pad is <|im_end|> (1102) instead.
struct HfCorpus {
  testing::TempDir dir;
  std::string unique_pad_tokenizer;
  HfCorpus() {
    std::vector<std::vector<int32_t>> docs;
    for (int d = 0; d < 80; ++d) {
      std::vector<int32_t> doc(3 + d % 5);
      for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>((d * 37 + i * 11) % 1100);
      if (d % 4 == 1) doc[1] = 1102;  // <|im_end|>, the pad of unique_pad_tokenizer
      doc.push_back(1100);
      docs.push_back(doc);
    }
    testing::write_dataset(dir.file("hf"), docs);
    unique_pad_tokenizer = dir.file("tok");
    std::filesystem::create_directory(unique_pad_tokenizer);
    std::filesystem::copy_file(kQwen + "/tokenizer.json", unique_pad_tokenizer + "/tokenizer.json");
    testing::write_file(unique_pad_tokenizer + "/tokenizer_config.json",
                        R"({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", )"
                        R"("pad_token": "<|im_end|>"})");
  }
  StatusOr<PretrainData> build(const std::string& tokenizer, bool allow, std::vector<std::string>* logs) {
    std::vector<std::string> f = {"--seq-length", "8", "--micro-batch-size", "1", "--global-batch-size", "2",
                                  "--train-iters", "20", "--split", "1,0,0", "--data-path", dir.file("hf"),
                                  "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer};
    if (allow) f.push_back("--allow-ambiguous-pad-tokens");
    auto args = parse_flags(f);
    if (!args.ok()) return args.status();
    return build_pretrain_data(*args, [&](const std::string& l) { logs->push_back(l); });
  }
};

// How many labels of the training samples equal `id`, and how many of those get a loss.
std::pair<int, int> labels_with_loss(const SampleDataset& ds, int32_t id) {
  int labels = 0, with_loss = 0;
  TrainingSample s;
  for (int64_t k = 0; k < ds.size(); ++k) {
    EXPECT_TRUE(ds.get(k, &s).ok());
    for (size_t i = 0; i < s.labels.size(); ++i) {
      if (s.labels[i] != id) continue;
      ++labels;
      with_loss += s.loss_mask[i] > 0;
    }
  }
  return {labels, with_loss};
}

bool warned(const std::vector<std::string>& logs) {
  return std::any_of(logs.begin(), logs.end(), [](const std::string& l) {
    return l.rfind("WARNING: The pad token id in the tokenizer collides with another special token id.", 0) == 0;
  });
}

TEST(AllowAmbiguousPadTokens, PadEqualToEodIsDroppedUnlessAllowed) {
  HfCorpus corpus;
  std::vector<std::string> logs;
  auto plain = corpus.build(kQwen, false, &logs);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_TRUE(warned(logs));
  EXPECT_EQ(plain->eod, 1100);
  auto [labels, with_loss] = labels_with_loss(*plain->train, 1100);
  ASSERT_GT(labels, 5);
  EXPECT_EQ(with_loss, labels);  // pad -1: every end-of-document label is learned

  logs.clear();
  auto allowed = corpus.build(kQwen, true, &logs);
  ASSERT_TRUE(allowed.ok()) << allowed.status().to_string();
  EXPECT_TRUE(warned(logs));
  TrainingSample s;
  int masked = 0;
  for (int64_t k = 0; k < allowed->train->size(); ++k) {
    ASSERT_TRUE(allowed->train->get(k, &s).ok());
    TrainingSample p;
    ASSERT_TRUE(plain->train->get(k, &p).ok());
    for (size_t i = 0; i < p.labels.size(); ++i) {
      if (p.labels[i] != 1100) {
        EXPECT_EQ(s.labels[i], p.labels[i]);
        EXPECT_EQ(s.loss_mask[i], p.loss_mask[i]);
        continue;
      }
      EXPECT_EQ(s.labels[i], 0);  // Megatron: labels equal to the pad become 0, without loss
      EXPECT_EQ(s.loss_mask[i], 0.0f);
      ++masked;
    }
    for (size_t i = 0; i < p.tokens.size(); ++i) EXPECT_EQ(s.tokens[i], p.tokens[i] == 1100 ? 0 : p.tokens[i]);
  }
  EXPECT_EQ(masked, labels);
}

// Megatron-LM main's HuggingFaceTokenizer.pad is the pad_token's id: a unique one is kept (labels
// equal to it get no loss and become 0, tokens equal to it become 0), without a warning.
TEST(AllowAmbiguousPadTokens, UniquePadIsKeptSilently) {
  HfCorpus corpus;
  std::vector<std::string> logs;
  auto plain = corpus.build(kQwen, false, &logs);
  ASSERT_TRUE(plain.ok());
  logs.clear();
  auto data = corpus.build(corpus.unique_pad_tokenizer, false, &logs);
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  EXPECT_FALSE(warned(logs));
  auto [eods, eods_with_loss] = labels_with_loss(*data->train, 1100);
  EXPECT_GT(eods, 0);
  EXPECT_EQ(eods_with_loss, eods);
  EXPECT_EQ(labels_with_loss(*data->train, 1102).first, 0);
  auto [pads, pads_with_loss] = labels_with_loss(*plain->train, 1102);  // pad -1 there: 1102 is a plain token
  ASSERT_GT(pads, 0);
  EXPECT_EQ(pads_with_loss, pads);
  TrainingSample s, p;
  int masked = 0;
  for (int64_t k = 0; k < data->train->size(); ++k) {
    ASSERT_TRUE(data->train->get(k, &s).ok());
    ASSERT_TRUE(plain->train->get(k, &p).ok());
    for (size_t i = 0; i < p.labels.size(); ++i)
      if (p.labels[i] == 1102) masked += s.labels[i] == 0 && s.loss_mask[i] == 0.0f;
  }
  EXPECT_EQ(masked, pads);
}

}  // namespace
}  // namespace gale
