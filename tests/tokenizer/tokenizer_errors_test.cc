// Bad tokenizer input: missing files, files of the wrong kind, unsupported tokenizer.json parts,
// invalid UTF-8 and unknown ids are one-line errors naming the flag or file.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace gale {
namespace {

std::string repo(const std::string& rel) { return std::string(GALE_TEST_DATA_DIR) + "/../../" + rel; }
const std::string kVocab = repo("data/tokenizers/gpt2/vocab.json");
const std::string kMerges = repo("data/tokenizers/gpt2/merges.txt");
const std::string kLlama3 = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/llama3_style/tokenizer.json";
const std::string kSpm = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/spm_austen.model";

void expect_error(const TokenizerOptions& o, const std::string& fragment) {
  auto t = build_tokenizer(o);
  ASSERT_FALSE(t.ok()) << "expected an error containing '" << fragment << "'";
  EXPECT_NE(t.status().message().find(fragment), std::string::npos) << t.status().to_string();
  EXPECT_EQ(t.status().message().find('\n'), std::string::npos) << t.status().to_string();
}

TokenizerOptions gpt2(const std::string& vocab, const std::string& merges) {
  TokenizerOptions o;
  o.type = "GPT2BPETokenizer";
  o.vocab_file = vocab;
  o.merge_file = merges;
  return o;
}
TokenizerOptions model(const std::string& type, const std::string& path) {
  TokenizerOptions o;
  o.type = type;
  o.tokenizer_model = path;
  return o;
}

TEST(TokenizerErrors, MissingFilesAndFlags) {
  expect_error(gpt2("/nonexistent/vocab.json", kMerges), "--vocab-file /nonexistent/vocab.json");
  expect_error(gpt2(kVocab, ""), "--merge-file is required");
  expect_error(model("HuggingFaceTokenizer", "/nonexistent/tok.json"), "--tokenizer-model /nonexistent/tok.json");
  expect_error(model("HuggingFaceTokenizer", std::string(GALE_TEST_DATA_DIR) + "/reference"), "no tokenizer.json");
  expect_error(model("Llama2Tokenizer", ""), "--tokenizer-model is required");
  TokenizerOptions null;
  null.type = "NullTokenizer";
  expect_error(null, "--vocab-size is required");
  expect_error(model("BertWordPieceCase", kVocab), "--tokenizer-type BertWordPieceCase is not supported");
}

TEST(TokenizerErrors, FilesOfTheWrongKind) {
  expect_error(gpt2(kLlama3, kMerges), "HuggingFaceTokenizer");  // tokenizer.json as vocab.json
  expect_error(gpt2(kSpm, kMerges), "not JSON");                 // binary as vocab.json
  expect_error(gpt2(kVocab, kVocab), "merges.txt");              // vocab.json as merges.txt
  expect_error(model("HuggingFaceTokenizer", kVocab), "GPT2BPETokenizer");
  expect_error(model("HuggingFaceTokenizer", kSpm), "SentencePiece");
  expect_error(model("SentencePieceTokenizer", kLlama3), "HuggingFaceTokenizer");
  expect_error(model("GPTSentencePieceTokenizer", kMerges), "expected a SentencePiece model");
}

StatusOr<std::unique_ptr<HuggingFaceTokenizer>> parse_with(const std::string& field, const std::string& value) {
  std::ifstream in(kLlama3);
  nlohmann::json j = nlohmann::json::parse(in);
  j[field] = nlohmann::json::parse(value);
  return HuggingFaceTokenizer::parse(j.dump(), "", "test.json");
}

TEST(TokenizerErrors, UnsupportedTokenizerJsonPartsAreNamed) {
  auto a = parse_with("pre_tokenizer", R"({"type": "Whitespace"})");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("pre_tokenizer type 'Whitespace'"), std::string::npos) << a.status().message();
  auto b = parse_with("pre_tokenizer",
                      R"({"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated", "invert": false})");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("\\\\w+"), std::string::npos) << b.status().message();
  auto c = parse_with("normalizer", R"({"type": "BertNormalizer"})");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("BertNormalizer"), std::string::npos);
  auto d = parse_with("decoder", R"({"type": "WordPiece"})");
  ASSERT_FALSE(d.ok());
  auto e = parse_with("model", R"({"type": "WordPiece", "vocab": {}})");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("WordPiece"), std::string::npos);
  auto f = parse_with("model", R"({"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]})");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("not in the vocabulary"), std::string::npos) << f.status().message();
}

// A post-processor's ids must be non-negative integers (found by fuzz/tokenizer_json_fuzz.cc: a
// negative id was encoded).
TEST(TokenizerErrors, PostProcessorIdsAreNonNegativeIntegers) {
  for (const char* ids : {"[-28]", "[\"x\"]", "[1.5]", "[4294967296]"}) {
    auto t = parse_with("post_processor",
                        std::string(R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
                                        {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": )") +
                            ids + "}}}");
    ASSERT_FALSE(t.ok()) << ids;
    EXPECT_NE(t.status().message().find("special token '<s>': expected a non-negative token id"), std::string::npos)
        << t.status().message();
  }
  auto r = parse_with("post_processor", R"({"type": "RobertaProcessing", "cls": ["<s>", -1], "sep": ["</s>", 2]})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cls: expected a non-negative token id, found -1"), std::string::npos)
      << r.status().message();
  auto ok = parse_with("post_processor", R"({"type": "RobertaProcessing", "cls": ["<s>", 0], "sep": ["</s>", 2]})");
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
}

TEST(TokenizerErrors, InvalidUtf8AndUnknownIds) {
  auto t = build_tokenizer(gpt2(kVocab, kMerges));
  ASSERT_TRUE(t.ok());
  std::vector<int32_t> ids;
  Status s = (*t)->encode("ok \xC3(", &ids);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("byte 3"), std::string::npos) << s.message();
  EXPECT_FALSE((*t)->decode(std::vector<int32_t>{1, 50257}).ok());
  EXPECT_FALSE((*t)->decode(std::vector<int32_t>{-1}).ok());
  for (const std::string& path : {kLlama3}) {
    auto h = build_tokenizer(model("HuggingFaceTokenizer", path));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    EXPECT_FALSE((*h)->encode("\xFF", &ids).ok());
    EXPECT_FALSE((*h)->decode(std::vector<int32_t>{1 << 20}).ok());
  }
  auto sp = build_tokenizer(model("Llama2Tokenizer", kSpm));
  ASSERT_TRUE(sp.ok()) << sp.status().to_string();
  EXPECT_FALSE((*sp)->encode("\xFE", &ids).ok());
  EXPECT_FALSE((*sp)->decode(std::vector<int32_t>{600}).ok());
}

TEST(Tokenizer, EncodeAppendsAndIsThreadSafe) {
  auto t = build_tokenizer(gpt2(kVocab, kMerges));
  ASSERT_TRUE(t.ok());
  std::vector<int32_t> ids = {7};
  ASSERT_TRUE((*t)->encode("Hello", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{7, 15496}));
  // Many threads share one tokenizer (each has its own word cache).
  std::vector<int32_t> expected;
  ASSERT_TRUE((*t)->encode("It is a truth universally acknowledged, that a single man", &expected).ok());
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        std::vector<int32_t> got;
        if (!(*t)->encode("It is a truth universally acknowledged, that a single man", &got).ok() || got != expected)
          ++mismatches;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace gale
