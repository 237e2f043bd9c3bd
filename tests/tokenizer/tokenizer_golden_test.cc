// Every tokenizer type against ids from Megatron's own tokenizer classes (cross-checked with
// tiktoken, Hugging Face tokenizers and sentencepiece): tests/data/reference/tokenizer_golden.json,
// made by tools/reference/tokenizer_reference.py. Tokenizers whose files live in ../shared/data
// are skipped when it is absent.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace gale {
namespace {

using json = nlohmann::json;

const json& golden() {
  static json j = [] {
    std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/tokenizer_golden.json");
    std::stringstream ss;
    ss << in.rdbuf();
    return json::parse(ss.str());
  }();
  return j;
}

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

std::string repo_path(const std::string& rel) { return std::string(GALE_TEST_DATA_DIR) + "/../../" + rel; }

// Options for a golden entry; empty type when its files are missing.
TokenizerOptions options_for(const std::string& name, const json& e) {
  TokenizerOptions o;
  std::string base = e["needs_shared"].get<bool>() ? std::string(GALE_SHARED_DATA_DIR) + "/" : repo_path("");
  std::vector<std::string> files;
  for (const auto& f : e["files"]) files.push_back(base + f.get<std::string>());
  for (const auto& f : files)
    if (!exists(f)) return o;
  if (name == "gpt2") {
    o.type = "GPT2BPETokenizer";
    o.vocab_file = files[0];
    o.merge_file = files[1];
  } else if (e.contains("type")) {
    o.type = e["type"].get<std::string>();
    o.tokenizer_model = files[0];
    o.vocab_extra_ids = e["vocab_extra_ids"].get<int64_t>();
  } else {
    o.type = "HuggingFaceTokenizer";
    o.tokenizer_model = files[0];
  }
  return o;
}

class GoldenTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTokenizer, IdsVocabularyEodPadAndDecodeMatchMegatron) {
  const std::string name = GetParam();
  const json& e = golden()["tokenizers"][name];
  TokenizerOptions o = options_for(name, e);
  if (o.type.empty()) GTEST_SKIP() << name << ": tokenizer files not present (../shared/data absent?)";
  auto t = build_tokenizer(o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.vocab_size(), e["vocab_size"].get<int64_t>());
  EXPECT_EQ(tok.eod(), e["eod"].get<int32_t>());
  EXPECT_EQ(tok.pad(), e["pad"].get<int32_t>());
  const auto& texts = golden()["texts"];
  const json& decoded = e.contains("decoded_tokenizers") ? e["decoded_tokenizers"] : e["decoded"];
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string text = texts[i].get<std::string>();
    std::vector<int32_t> ids;
    Status s = tok.encode(text, &ids);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(ids, e["ids"][i].get<std::vector<int32_t>>()) << name << " text " << i << ": " << json(text).dump();
    auto d = tok.decode(e["ids"][i].get<std::vector<int32_t>>());
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(*d, decoded[i].get<std::string>()) << name << " decode of text " << i << ": " << json(text).dump();
  }
}

std::vector<std::string> golden_names() {
  std::vector<std::string> names;
  for (auto it = golden()["tokenizers"].begin(); it != golden()["tokenizers"].end(); ++it) names.push_back(it.key());
  return names;
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Megatron, GoldenTokenizer, ::testing::ValuesIn(golden_names()), param_name);

TEST(NullTokenizer, MatchesMegatron) {
  const json& n = golden()["null"];
  TokenizerOptions o;
  o.type = "NullTokenizer";
  o.vocab_size = 1000;
  auto t = build_tokenizer(o);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->vocab_size(), n["vocab_size"].get<int64_t>());
  EXPECT_EQ((*t)->eod(), n["eod"].get<int32_t>());
  for (const auto& ex : n["examples"]) {
    std::vector<int32_t> ids;
    ASSERT_TRUE((*t)->encode(ex[0].get<std::string>(), &ids).ok());
    EXPECT_EQ(ids, ex[1].get<std::vector<int32_t>>());
  }
  std::vector<int32_t> ids;
  for (const char* bad : {"", " 5", "1  2", "x", "1.5", "99999999999"}) {
    Status s = (*t)->encode(bad, &ids);
    EXPECT_FALSE(s.ok()) << "'" << bad << "'";
  }
  auto d = (*t)->decode(std::vector<int32_t>{1, 2, 1000});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, "1 2 1000");
}

}  // namespace
}  // namespace gale
