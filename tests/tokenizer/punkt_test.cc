// The Punkt sentence splitter against NLTK 3.8.1's PunktSentenceTokenizer (and Megatron's
// --keep-newlines language variables): tests/data/reference/punkt_golden.json, made with the
// parameters in tests/data/nltk_data/tokenizers/punkt_tab/english by tools/reference/punkt_reference.py.
// Also the parameter files' errors and the NLTK data search.
#include "tokenizer/punkt.h"

#include <gtest/gtest.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ckpt/temp_dir.h"
#include "scoped_env.h"

namespace gale {
namespace {

using json = nlohmann::json;
using testing_util::TempDir;
using testing::ScopedEnv;

const std::string kNltkData = std::string(GALE_TEST_DATA_DIR) + "/nltk_data";
const std::string kEnglish = kNltkData + "/tokenizers/punkt_tab/english";

const json& golden() {
  static json j = [] {
    std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/punkt_golden.json", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return json::parse(ss.str());
  }();
  return j;
}

const PunktParameters& english() {
  static PunktParameters p = [] {
    auto loaded = load_punkt_tab(kEnglish);
    EXPECT_TRUE(loaded.ok()) << loaded.status().message();
    return loaded.ok() ? *loaded : PunktParameters{};
  }();
  return p;
}

void expect_golden_spans(bool keep_newlines, const char* key) {
  const PunktSentenceSplitter splitter(english(), keep_newlines);
  const json& texts = golden()["texts"];
  const json& spans = golden()[key];
  ASSERT_EQ(texts.size(), spans.size());
  ASSERT_GT(texts.size(), 600u);
  size_t sentences = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<std::pair<size_t, size_t>> want;
    for (const auto& s : spans[i]) want.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
    EXPECT_EQ(splitter.span_tokenize(texts[i].get<std::string>()), want) << key << " text " << i << ": " << texts[i];
    sentences += want.size();
  }
  EXPECT_GT(sentences, 1500u);  // the corpus excerpts split into many sentences
}

TEST(Punkt, ParametersLoad) {
  const PunktParameters& p = english();
  EXPECT_TRUE(p.abbrev_types.count("mr"));
  EXPECT_TRUE(p.abbrev_types.count("h.m.s"));
  EXPECT_TRUE(p.collocations.count({"st", "james"}));
  EXPECT_TRUE(p.sent_starters.count("elinor"));
  EXPECT_GT(p.ortho_context.size(), 10000u);
}

TEST(Punkt, SpansEqualNltk) { expect_golden_spans(false, "standard"); }

TEST(Punkt, KeepNewlinesSpansEqualMegatronsCustomLanguageVars) { expect_golden_spans(true, "keep_newlines"); }

TEST(Punkt, SplitGivesTheSentencesAsByteRanges) {
  const PunktSentenceSplitter splitter(english(), false);
  const std::string text = "Émile came home. Mr. Smith left! \"Why?\" she asked.  ";
  std::vector<std::string_view> got = splitter.split(text);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0], "Émile came home.");
  EXPECT_EQ(got[1], "Mr. Smith left!");
  EXPECT_EQ(got[2], "\"Why?\"");
  EXPECT_EQ(got[3], "she asked.");
  const PunktSentenceSplitter keep(english(), true);
  got = keep.split("One.\nTwo.\n\nThree.");
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], "One.\n");
  EXPECT_EQ(got[1], "Two.\n\n");
  EXPECT_EQ(got[2], "Three.");
}

TEST(Punkt, ParameterFileErrorsNameTheFileAndLine) {
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.file(name), std::ios::binary) << text;
  };
  auto st = load_punkt_tab(dir.path()).status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find(dir.file("abbrev_types.txt")), std::string::npos) << st.message();
  write("abbrev_types.txt", "mr\ndr");
  write("sent_starters.txt", "but\n");
  write("collocations.tab", "st\tjames\nbad line\n");
  write("ortho_context.tab", "the\t34\n");
  st = load_punkt_tab(dir.path()).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("collocations.tab:2: expected two types separated by one tab, found 'bad line'"),
            std::string::npos)
      << st.message();
  write("collocations.tab", "st\tjames\n");
  write("ortho_context.tab", "the\t34\nword\tmany\n");
  st = load_punkt_tab(dir.path()).status();
  EXPECT_NE(st.message().find("ortho_context.tab:2: expected a type, a tab and flags 0..127, found 'word\tmany'"),
            std::string::npos)
      << st.message();
  write("ortho_context.tab", "the\t34\n");
  write("sent_starters.txt", "bad \xff utf8\n");
  st = load_punkt_tab(dir.path()).status();
  EXPECT_NE(st.message().find("sent_starters.txt:1: expected UTF-8 text"), std::string::npos) << st.message();
  write("sent_starters.txt", "but\n");
  auto ok = load_punkt_tab(dir.path());
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->abbrev_types.size(), 2u);
  EXPECT_EQ(ok->ortho_context.at("the"), 34);
}


TEST(Punkt, FindsParametersAlongNltkDataAndSaysWhereItLooked) {
  TempDir empty;
  {
    ScopedEnv env("NLTK_DATA", empty.path() + ":" + kNltkData);
    auto found = find_punkt_tab("english");
    ASSERT_TRUE(found.ok()) << found.status().message();
    EXPECT_EQ(*found, kEnglish);
  }
  std::filesystem::create_directories(empty.file("tokenizers/punkt/PY3"));
  std::ofstream(empty.file("tokenizers/punkt/PY3/german.pickle")) << "x";
  ScopedEnv env("NLTK_DATA", empty.path());
  ScopedEnv home("HOME", empty.path());
  auto st = find_punkt_tab("german").status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("no Punkt parameters for --lang german: expected tokenizers/punkt_tab/german/"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(empty.path() + ", "), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("nltk.download('punkt_tab')"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("found " + empty.file("tokenizers/punkt/PY3/german.pickle")), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace gale
