// TikTokenizer against Megatron's CustomTikTokenizer (tiktoken inside) and the v1/v2 split patterns
// against Python's `regex` cross-checked with tiktoken's engine: tests/data/reference/tiktoken_golden.json
// and the vocabulary tests/data/tokenizers/tiktoken_gpt2_3k.json, made by
// tools/reference/tiktoken_reference.py. Also the file and flag errors.
#include "tokenizer/tiktoken_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/split_pieces.h"
#include "tokenizer/tokenizer.h"

namespace gale {
namespace {

using json = nlohmann::json;

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const json& golden() {
  static json j = json::parse(read(std::string(GALE_TEST_DATA_DIR) + "/reference/tiktoken_golden.json"));
  return j;
}

const std::string& vocab_path() {
  static std::string p = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/tiktoken_gpt2_3k.json";
  return p;
}

TEST(TiktokenPattern, PiecesMatchTheRegexOnTextsAndRandomStrings) {
  const json& g = golden();
  std::vector<std::string> texts = g["texts"].get<std::vector<std::string>>();
  for (const auto& f : g["fuzz"]) texts.push_back(f.get<std::string>());
  for (const auto& [name, pattern] : {std::pair{"v1", SplitPattern::kTiktokenV1}, {"v2", SplitPattern::kTiktokenV2}}) {
    const json& pieces = g["pieces"][name];
    ASSERT_EQ(pieces.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i)
      EXPECT_EQ(split(pattern, texts[i]), pieces[i].get<std::vector<std::string>>()) << name << " text " << i;
  }
}

TEST(TiktokenPattern, HandCheckedCases) {
  using V = std::vector<std::string>;
  // v1: no contractions; one digit per piece; a symbol run keeps its trailing newlines.
  EXPECT_EQ(split(SplitPattern::kTiktokenV1, "it's 42!\n\nx"), (V{"it", "'s", " ", "4", "2", "!\n\n", "x"}));
  // v2: a word ends where a lower-case run meets an upper-case letter (upper-case letters then
  // lower-case ones make one piece); '/' joins a symbol run's tail.
  EXPECT_EQ(split(SplitPattern::kTiktokenV2, "helloWorld HelloWORLDFoo ABC"),
            (V{"hello", "World", " Hello", "WORLDFoo", " ABC"}));
  EXPECT_EQ(split(SplitPattern::kTiktokenV2, " XMLHttp a,\n/b"), (V{" XMLHttp", " a", ",\n/", "b"}));
}

TokenizerOptions options(const json& c) {
  TokenizerOptions o;
  o.type = "TikTokenizer";
  o.tokenizer_model = vocab_path();
  o.tiktoken_pattern = c["pattern"].get<std::string>();
  o.vocab_size = c["vocab_size"].get<int64_t>();
  o.tiktoken_num_special_tokens = c["num_special_tokens"].get<int64_t>();
  if (!c["special_tokens"].is_null()) o.tiktoken_special_tokens = c["special_tokens"].get<std::vector<std::string>>();
  return o;
}

TEST(TikTokenizer, IdsAndDecodingEqualMegatrons) {
  const json& g = golden();
  std::vector<std::string> texts = g["texts"].get<std::vector<std::string>>();
  ASSERT_EQ(g["configs"].size(), 3u);
  for (const json& c : g["configs"]) {
    auto built = build_tokenizer(options(c));
    ASSERT_TRUE(built.ok()) << built.status().to_string();
    const auto& t = dynamic_cast<const TikTokenizer&>(**built);
    std::string what = c["pattern"].get<std::string>() + " vocab " + std::to_string(c["vocab_size"].get<int64_t>());
    EXPECT_EQ(t.type(), "TikTokenizer");
    EXPECT_EQ(t.vocab_size(), c["reported_vocab_size"].get<int64_t>()) << what;
    EXPECT_EQ(t.eod(), c["eod"].get<int32_t>()) << what;
    EXPECT_EQ(t.bos(), c["bos"].get<int32_t>()) << what;
    EXPECT_EQ(t.unk(), c["unk"].get<int32_t>()) << what;
    EXPECT_EQ(t.pad(), -1);  // Megatron's class has no pad: GPTDataset falls back to -1
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int32_t> ids;
      ASSERT_TRUE(t.encode(texts[i], &ids).ok());
      EXPECT_EQ(ids, c["ids"][i].get<std::vector<int32_t>>()) << what << " text " << i;
      auto text = t.decode(ids);
      ASSERT_TRUE(text.ok());
      EXPECT_EQ(*text, c["decoded"][i].get<std::string>()) << what << " text " << i;
    }
    for (size_t i = 0; i < c["decode_ids"].size(); ++i) {  // special tokens, split UTF-8 bytes
      std::vector<int32_t> ids = c["decode_ids"][i].get<std::vector<int32_t>>();
      auto text = t.decode(ids);
      ASSERT_TRUE(text.ok());
      EXPECT_EQ(*text, c["decode_text"][i].get<std::string>()) << what << " decode " << i;
    }
    std::vector<int32_t> bad = {static_cast<int32_t>(t.vocab_size())};
    EXPECT_FALSE(t.decode(bad).ok());
  }
}

TEST(TikTokenizer, Base64) {
  std::string out;
  EXPECT_TRUE(base64_decode("aGVsbG8=", &out));
  EXPECT_EQ(out, "hello");
  EXPECT_TRUE(base64_decode("IGlz", &out));
  EXPECT_EQ(out, " is");
  EXPECT_TRUE(base64_decode("/w==", &out));
  EXPECT_EQ(out, "\xFF");
  EXPECT_FALSE(base64_decode("aGVsbG8", &out));   // length not a multiple of 4
  EXPECT_FALSE(base64_decode("aGV*bG8=", &out));  // not in the alphabet
}

class TikTokenizerErrors : public ::testing::Test {
 protected:
  TokenizerOptions base() {
    TokenizerOptions o;
    o.type = "TikTokenizer";
    o.tokenizer_model = vocab_path();
    o.tiktoken_pattern = "v1";
    o.vocab_size = 1000 + 3256;
    return o;
  }
  void expect_error(const TokenizerOptions& o, const std::string& needle) {
    auto t = build_tokenizer(o);
    ASSERT_FALSE(t.ok()) << needle;
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().message();
  }
  // A vocabulary file built from `entries` (valid byte ranks 0..255 first unless `bytes` is false).
  std::string write(const std::string& tail, bool bytes = true) {
    std::string path = "/tmp/gale_tiktoken_" + std::to_string(::getpid()) + "_" + std::to_string(files_.size()) + ".json";
    json j = json::array();
    if (bytes)
      for (int b = 0; b < 256; ++b) {
        std::string e(1, static_cast<char>(b)), b64;
        static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        unsigned v = static_cast<unsigned char>(b);
        b64 = {kAlphabet[v >> 2], kAlphabet[(v & 3) << 4], '=', '='};
        j.push_back({{"rank", b}, {"token_bytes", b64}, {"token_str", ""}});
      }
    std::string text = j.dump();
    if (!tail.empty()) text = text.substr(0, text.size() - 1) + (bytes ? "," : "") + tail + "]";
    std::ofstream(path) << text;
    files_.push_back(path);
    return path;
  }
  void TearDown() override {
    for (const auto& f : files_) ::unlink(f.c_str());
  }
  std::vector<std::string> files_;
};

TEST_F(TikTokenizerErrors, FlagsAndFiles) {
  TokenizerOptions o = base();
  o.tiktoken_pattern = "";
  expect_error(o, "--tiktoken-pattern: TikTokenizer needs v1 or v2, found ''");
  o = base();
  o.tokenizer_model = "";
  expect_error(o, "--tokenizer-model is required for TikTokenizer");
  o.tokenizer_model = "/nonexistent/tok.json";
  expect_error(o, "--tokenizer-model /nonexistent/tok.json: cannot open file");
  o.tokenizer_model = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/spm_austen.model";
  expect_error(o, "TikTokenizer expects a .json vocabulary file");
  o = base();
  o.tiktoken_special_tokens = {"<s>", "</s>"};
  expect_error(o, "--tiktoken-special-tokens: the list must include <unk>, <s> and </s>, found no <unk>");
  o.tiktoken_special_tokens = {"<unk>", "<s>", "</s>", "<s>"};
  expect_error(o, "--tiktoken-special-tokens: the special tokens must be unique");
  o = base();
  o.tiktoken_num_special_tokens = 2;
  expect_error(o, "--tiktoken-num-special-tokens: expected 3 (the special tokens given) <= N < the vocabulary size");
  o = base();
  o.vocab_size = 1000 + 3257;
  expect_error(o, "holds 3256 tokens, but --vocab-size 4257 minus 1000 special tokens needs 3257");
  o.vocab_size = 1200;
  expect_error(o, "--vocab-size 1200 minus --tiktoken-num-special-tokens 1000 leaves 200 ranks");
}

TEST_F(TikTokenizerErrors, MalformedVocabulary) {
  TokenizerOptions o = base();
  o.vocab_size = 1000 + 257;
  o.tokenizer_model = write(R"({"rank": 256, "token_bytes": "aGk=", "token_str": "hi", "extra": 1})");
  expect_error(o, "entry 256 is {\"extra\":1");
  o.tokenizer_model = write(R"({"rank": 7, "token_bytes": "aGk=", "token_str": "hi"})");
  expect_error(o, "entry 256 has rank 7, expected 256");
  o.tokenizer_model = write(R"({"rank": 256, "token_bytes": "a*k=", "token_str": "hi"})");
  expect_error(o, "entry 256: token_bytes \"a*k=\" is not non-empty base64");
  o.tokenizer_model = write(R"({"rank": 256, "token_bytes": "YQ==", "token_str": "a"})");
  expect_error(o, "rank 256 repeats the bytes of rank 97");
  o.tokenizer_model = write(R"({"rank": 256, "token_bytes": "PHM+", "token_str": "<s>"})");
  expect_error(o, "the special token <s> is also an ordinary token (rank 256)");
  o.vocab_size = 1000 + 256;
  o.tokenizer_model = write(R"({"rank": 0, "token_bytes": "YQ==", "token_str": "a"})", /*bytes=*/false);
  expect_error(o, "holds 1 tokens");
  o.tokenizer_model = write("", /*bytes=*/false);
  std::ofstream(o.tokenizer_model) << R"({"a": 1})";
  expect_error(o, "expected Megatron's TikTokenizer vocabulary (a JSON list of {rank, token_bytes, token_str}), found other JSON");
}

}  // namespace
}  // namespace gale
