// `gale preprocess` and `gale merge-datasets` end to end: byte-identical to Megatron's
// preprocess_data.py outputs (tests/data/reference/preprocess, made by
// tools/reference/preprocess_reference.py), the same with 2 workers and gzip input, and clear
// errors that name the file and line.
#include <gtest/gtest.h>
#include <zlib.h>


#include "cli/cli_test_util.h"
#include "scoped_env.h"
#include "data/data_test_util.h"
#include "data/indexed_dataset.h"

namespace gale {
namespace {

using testing::read_file;
using testing::run_gale;
using testing::TempDir;
using testing::ScopedEnv;

const std::string kRef = std::string(GALE_TEST_DATA_DIR) + "/reference/preprocess";
const std::string kRepo = std::string(GALE_TEST_DATA_DIR) + "/../..";
const std::string kGpt2 = "--tokenizer-type GPT2BPETokenizer --vocab-file " + kRepo +
                          "/data/tokenizers/gpt2/vocab.json --merge-file " + kRepo + "/data/tokenizers/gpt2/merges.txt";
const std::string kLlama3 = "--tokenizer-type HuggingFaceTokenizer --tokenizer-model " +
                            std::string(GALE_TEST_DATA_DIR) + "/tokenizers/llama3_style";
const std::string kTiktoken = "--tokenizer-type TikTokenizer --tiktoken-pattern v2 --vocab-size 4256 --tokenizer-model " +
                              std::string(GALE_TEST_DATA_DIR) + "/tokenizers/tiktoken_gpt2_3k.json";

void expect_same_files(const std::string& ours, const std::string& megatron) {
  for (const char* ext : {".bin", ".idx"}) {
    std::string a = read_file(ours + ext), b = read_file(megatron + ext);
    ASSERT_FALSE(b.empty()) << megatron << ext;
    EXPECT_TRUE(a == b) << ours << ext << " differs from " << megatron << ext << " (" << a.size() << " vs " << b.size()
                        << " bytes)";
  }
}

struct PreprocessRun {
  const char* name;
  std::string flags;
};

TEST(Preprocess, ByteIdenticalToMegatronForEveryKey) {
  for (const PreprocessRun& run : {PreprocessRun{"gpt2_eod", kGpt2 + " --append-eod"}, PreprocessRun{"gpt2", kGpt2},
                                   PreprocessRun{"llama3_eod", kLlama3 + " --append-eod"},
                                   PreprocessRun{"tiktoken_v2_eod", kTiktoken + " --append-eod"}}) {
    for (int workers : {1, 2}) {
      TempDir dir;
      auto r = run_gale("preprocess --input " + kRef + "/input.jsonl --output-prefix " + dir.file("out") +
                            " --json-keys text title --workers " + std::to_string(workers) + " " + run.flags,
                        dir.path());
      ASSERT_EQ(r.exit_code, 0) << r.err;
      for (const char* key : {"text", "title"}) {
        SCOPED_TRACE(std::string(run.name) + " key " + key + " workers " + std::to_string(workers));
        expect_same_files(dir.file(std::string("out_") + key + "_document"),
                          kRef + "/megatron_" + run.name + "_" + key + "_document");
      }
    }
  }
}


// Megatron's two runs of preprocess_data.py --split-sentences (split, then encode) against Gale's one,
// with Punkt parameters trained on the Austen corpus (tools/reference/punkt_reference.py).
TEST(Preprocess, SplitSentencesByteIdenticalToMegatron) {
  TempDir home;
  ScopedEnv nltk("NLTK_DATA", std::string(GALE_TEST_DATA_DIR) + "/nltk_data");
  ScopedEnv env_home("HOME", home.path());
  for (const PreprocessRun& run : {PreprocessRun{"gpt2_eod_split", ""},
                                   PreprocessRun{"gpt2_eod_split_keep_newlines", " --keep-newlines"}}) {
    for (int workers : {1, 2}) {
      SCOPED_TRACE(std::string(run.name) + " workers " + std::to_string(workers));
      TempDir dir;
      auto r = run_gale("preprocess --input " + kRef + "/split_input.jsonl --output-prefix " + dir.file("out") +
                            " --split-sentences --append-eod --workers " + std::to_string(workers) + " " + kGpt2 +
                            run.flags,
                        dir.path());
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_NE(r.err.find("splitting sentences with the Punkt parameters in "), std::string::npos) << r.err;
      expect_same_files(dir.file("out_text_sentence"), kRef + "/megatron_" + run.name + "_text_sentence");
      auto ds = IndexedDataset::open(dir.file("out_text_sentence"));
      ASSERT_TRUE(ds.ok()) << ds.status().message();
      EXPECT_GT((*ds)->num_sequences(), 3 * (*ds)->num_documents());  // many sentences per document
    }
  }
  // Without parameters the error says where it looked and how to get them.
  ScopedEnv none("NLTK_DATA", home.path());
  TempDir dir;
  auto r = run_gale("preprocess --input " + kRef + "/split_input.jsonl --output-prefix " + dir.file("out") +
                        " --split-sentences --lang german --workers 1 " + kGpt2,
                    dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--split-sentences: no Punkt parameters for --lang german"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nltk.download('punkt_tab')"), std::string::npos) << r.err;
}

TEST(Preprocess, GzipInputAndManyWorkersKeepInputOrder) {
  TempDir dir;
  // 3000 documents, numbered, gzip-compressed.
  std::string jsonl;
  for (int i = 0; i < 3000; ++i) jsonl += "{\"text\": \"document " + std::to_string(i) + " of many\"}\n";
  gzFile gz = gzopen(dir.file("in.jsonl.gz").c_str(), "wb");
  gzwrite(gz, jsonl.data(), static_cast<unsigned>(jsonl.size()));
  gzclose(gz);
  testing::write_file(dir.file("in.jsonl"), jsonl);
  auto a = run_gale(
      "preprocess --input " + dir.file("in.jsonl") + " --output-prefix " + dir.file("plain") + " --workers 1 " + kGpt2,
      dir.path());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  auto b = run_gale("preprocess --input " + dir.file("in.jsonl.gz") + " --output-prefix " + dir.file("gz") +
                        " --workers 3 --log-interval 1000 " + kGpt2,
                    dir.path());
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_NE(b.err.find("Processed 3000 documents ("), std::string::npos) << b.err;
  EXPECT_NE(b.err.find(" docs/s, "), std::string::npos);
  EXPECT_EQ(read_file(dir.file("plain_text_document.bin")), read_file(dir.file("gz_text_document.bin")));
  EXPECT_EQ(read_file(dir.file("plain_text_document.idx")), read_file(dir.file("gz_text_document.idx")));
  auto ds = IndexedDataset::open(dir.file("gz_text_document"));
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->num_documents(), 3000);
}

class PreprocessErrors : public ::testing::Test {
 protected:
  testing::CommandResult run(const std::string& jsonl, const std::string& extra = "") {
    testing::write_file(dir_.file("in.jsonl"), jsonl);
    return run_gale("preprocess --input " + dir_.file("in.jsonl") + " --output-prefix " + dir_.file("out") +
                        " --workers 2 " + kGpt2 + " " + extra,
                    dir_.path());
  }
  void expect_fails_with(const testing::CommandResult& r, const std::string& fragment) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_.file("out_text_document.idx"))) << "no output on error";
    EXPECT_FALSE(std::filesystem::exists(dir_.file("out_text_document.bin.tmp"))) << "no temporary left";
  }
  TempDir dir_;
};

TEST_F(PreprocessErrors, MalformedJsonNamesFileAndLine) {
  expect_fails_with(run("{\"text\": \"ok\"}\n{\"text\": \"broken\n{\"text\": \"ok\"}\n"), "in.jsonl:2: malformed JSON");
}
TEST_F(PreprocessErrors, NumberOutOfRangeIsMalformedNotACrash) {
  // Found by fuzz_jsonl: nlohmann throws out_of_range (not parse_error) for 1e99999.
  expect_fails_with(run("{\"text\": \"ok\"}\n{\"text\": \"a\", \"n\": 100e91111}\n"), "in.jsonl:2: malformed JSON");
}
TEST_F(PreprocessErrors, MissingKey) {
  expect_fails_with(run("{\"text\": \"a\"}\n{\"body\": \"b\"}\n"), "in.jsonl:2: missing key 'text'");
}
TEST_F(PreprocessErrors, WrongValueType) {
  expect_fails_with(run("{\"text\": 5}\n"), "in.jsonl:1: key 'text' is a number");
}
TEST_F(PreprocessErrors, InvalidUtf8) {
  expect_fails_with(run("{\"text\": \"ok\"}\n{\"text\": \"bad \xC3\x28\"}\n"), "in.jsonl:2:");
}
TEST_F(PreprocessErrors, NotAnObject) { expect_fails_with(run("[1, 2]\n"), "in.jsonl:1: expected a JSON object"); }

TEST_F(PreprocessErrors, SkipBadLinesCountsAndSkips) {
  auto r = run("{\"text\": \"one\"}\nnot json\n\n{\"text\": \"two\"}\n{\"x\": 1}\n", "--skip-bad-lines");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("skipped 2 bad lines"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("in.jsonl:2:"), std::string::npos) << r.err;
  auto ds = IndexedDataset::open(dir_.file("out_text_document"));
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->num_documents(), 2);  // the blank line is ignored, not a document
}

TEST_F(PreprocessErrors, BadFlagsAndFiles) {
  auto r = run_gale("preprocess --input " + dir_.file("missing.jsonl") + " --output-prefix " + dir_.file("o") +
                        " --workers 1 " + kGpt2,
                    dir_.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("missing.jsonl: no such file"), std::string::npos) << r.err;
  testing::write_file(dir_.file("in.jsonl"), "{\"text\": \"a\"}\n");
  r = run_gale(
      "preprocess --input " + dir_.file("in.jsonl") + " --output-prefix /nonexistent/dir/o --workers 1 " + kGpt2,
      dir_.path());
  EXPECT_NE(r.err.find("/nonexistent/dir does not exist"), std::string::npos) << r.err;
  r = run_gale("preprocess --input " + dir_.file("in.jsonl") + " --output-prefix " + dir_.file("o") + " " + kGpt2,
               dir_.path());
  EXPECT_NE(r.err.find("--workers is required"), std::string::npos) << r.err;
  r = run_gale("preprocess --input " + dir_.file("in.jsonl") + " --output-prefix " + dir_.file("o") +
                   " --workers 1 --partitions 2 " + kGpt2,
               dir_.path());
  EXPECT_NE(r.err.find("--partitions 2"), std::string::npos) << r.err;
  r = run_gale("preprocess --input " + dir_.file("in.jsonl") + " --output-prefix " + dir_.file("o") + " --workers 1",
               dir_.path());
  EXPECT_NE(r.err.find("--tokenizer-type is required"), std::string::npos) << r.err;
}

TEST_F(PreprocessErrors, NullTokenizerIdsOutsideVocabulary) {
  testing::write_file(dir_.file("in.jsonl"), "{\"text\": \"1 2 3\"}\n{\"text\": \"4 5000\"}\n");
  auto r = run_gale("preprocess --input " + dir_.file("in.jsonl") + " --output-prefix " + dir_.file("out") +
                        " --workers 1 --tokenizer-type NullTokenizer --vocab-size 1000",
                    dir_.path());
  expect_fails_with(r, "in.jsonl:2: token id 5000");
}

TEST(MergeDatasets, MatchesMegatronsConcatenation) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("parts"));
  // Megatron merges in sorted prefix order: b before c; the output equals add_index of each.
  testing::write_dataset(dir.file("parts/c"), {{5, 6}, {7}});
  testing::write_dataset(dir.file("parts/b"), {{1, 2, 3}, {}, {4}});
  testing::write_file(dir.file("parts/README.txt"), "ignored");
  auto r =
      run_gale("merge-datasets --input " + dir.file("parts") + " --output-prefix " + dir.file("merged"), dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  testing::write_dataset(dir.file("expected"), {{1, 2, 3}, {}, {4}, {5, 6}, {7}});
  EXPECT_EQ(read_file(dir.file("merged.bin")), read_file(dir.file("expected.bin")));
  EXPECT_EQ(read_file(dir.file("merged.idx")), read_file(dir.file("expected.idx")));
  // A .bin without its .idx is an error naming it.
  testing::write_file(dir.file("parts/d.bin"), "xx");
  r = run_gale("merge-datasets --input " + dir.file("parts") + " --output-prefix " + dir.file("merged2"), dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("d.bin has no d.idx"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace gale
