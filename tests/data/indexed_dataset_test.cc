// Indexed dataset (.bin/.idx): Megatron's exact bytes, round trips, merging, and every kind of bad file.
#include "data/indexed_dataset.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"

namespace gale {
namespace {

using testing::hex;
using testing::read_file;
using testing::TempDir;
using testing::write_dataset;
using testing::write_file;

// megatron.md §1.3: bytes produced by Megatron's own _IndexWriter for [[1,2,3],[4,5]], uint16.
TEST(IndexedDataset, WriterMatchesMegatronBytes) {
  TempDir dir;
  std::string prefix = dir.file("ex");
  write_dataset(prefix, {{1, 2, 3}, {4, 5}}, TokenDType::kUInt16);
  std::string idx = read_file(prefix + ".idx");
  EXPECT_EQ(idx.size(), 82u);
  EXPECT_EQ(hex(idx),
            "4d4d4944494458"
            "0000"
            "0100000000000000"
            "08"
            "0200000000000000"
            "0300000000000000"
            "03000000"
            "02000000"
            "0000000000000000"
            "0600000000000000"
            "0000000000000000"
            "0100000000000000"
            "0200000000000000");
  EXPECT_EQ(hex(read_file(prefix + ".bin")), "01000200030004000500");
  // No temporary files are left behind.
  EXPECT_FALSE(std::filesystem::exists(prefix + ".bin.tmp"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".idx.tmp"));
}

TEST(IndexedDataset, OptimalDtypeUsesMegatronCut) {
  EXPECT_EQ(optimal_token_dtype(50257), TokenDType::kUInt16);
  EXPECT_EQ(optimal_token_dtype(65499), TokenDType::kUInt16);
  EXPECT_EQ(optimal_token_dtype(65500), TokenDType::kInt32);
  EXPECT_EQ(optimal_token_dtype(128256), TokenDType::kInt32);
}

TEST(IndexedDataset, RoundTripWithEmptyDocumentAndSeveralSequences) {
  TempDir dir;
  std::string prefix = dir.file("rt");
  {
    auto w = IndexedDatasetWriter::create(prefix, TokenDType::kInt32);
    ASSERT_TRUE(w.ok());
    std::vector<int32_t> a = {7, 8, 9, 100000, 11};
    ASSERT_TRUE((*w)->add_document(a, std::vector<int32_t>{2, 3}).ok());
    ASSERT_TRUE((*w)->add_document({}, {}).ok());  // empty document: repeated document index
    std::vector<int32_t> b = {42};
    ASSERT_TRUE((*w)->add_document(b, std::vector<int32_t>{1}).ok());
    ASSERT_TRUE((*w)->finalize().ok());
  }
  for (bool mmap : {true, false}) {
    auto ds = IndexedDataset::open(prefix, mmap);
    ASSERT_TRUE(ds.ok()) << ds.status().to_string();
    const IndexedDataset& d = **ds;
    EXPECT_EQ(d.dtype(), TokenDType::kInt32);
    EXPECT_EQ(d.num_sequences(), 3);
    EXPECT_EQ(d.num_documents(), 3);
    EXPECT_EQ(d.document_indices()[0], 0);
    EXPECT_EQ(d.document_indices()[1], 2);
    EXPECT_EQ(d.document_indices()[2], 2);
    EXPECT_EQ(d.document_indices()[3], 3);
    EXPECT_EQ(d.sequence_lengths()[1], 3);
    EXPECT_EQ(d.sequence_pointer(2), 20);
    int32_t out[3];
    ASSERT_TRUE(d.read(1, 0, 3, out).ok());
    EXPECT_EQ(out[0], 9);
    EXPECT_EQ(out[1], 100000);
    EXPECT_EQ(out[2], 11);
    ASSERT_TRUE(d.read(1, 2, 1, out).ok());
    EXPECT_EQ(out[0], 11);
    EXPECT_FALSE(d.read(1, 2, 2, out).ok());  // past the end of the sequence
    EXPECT_FALSE(d.read(3, 0, 1, out).ok());  // no such sequence
  }
}

TEST(IndexedDataset, AddIndexMergesLikeMegatron) {
  TempDir dir;
  write_dataset(dir.file("a"), {{1, 2}, {3}});
  write_dataset(dir.file("b"), {{4, 5, 6}, {}, {7}});
  auto w = IndexedDatasetWriter::create(dir.file("m"), TokenDType::kUInt16);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->add_index(dir.file("a")).ok());
  ASSERT_TRUE((*w)->add_index(dir.file("b")).ok());
  ASSERT_TRUE((*w)->finalize().ok());
  auto m = IndexedDataset::open(dir.file("m"));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->num_sequences(), 4);
  std::vector<int64_t> docs;
  for (int64_t k = 0; k < (*m)->document_indices().size(); ++k) docs.push_back((*m)->document_indices()[k]);
  EXPECT_EQ(docs, (std::vector<int64_t>{0, 1, 2, 3, 3, 4}));
  EXPECT_EQ(hex(read_file(dir.file("m.bin"))), "0100020003000400050006000700");
  EXPECT_EQ(read_file(dir.file("m.bin")), read_file(dir.file("a.bin")) + read_file(dir.file("b.bin")));
  // Mismatched dtypes are refused.
  write_dataset(dir.file("c"), {{1}}, TokenDType::kInt32);
  auto w2 = IndexedDatasetWriter::create(dir.file("n"), TokenDType::kUInt16);
  Status s = (*w2)->add_index(dir.file("c"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("int32"), std::string::npos) << s.message();
}

TEST(IndexedDataset, WriterRejectsTokensOutsideDtypeAndBadLengths) {
  TempDir dir;
  auto w = IndexedDatasetWriter::create(dir.file("x"), TokenDType::kUInt16);
  ASSERT_TRUE(w.ok());
  std::vector<int32_t> too_big = {1, 70000};
  Status s = (*w)->add_document(too_big, std::vector<int32_t>{2});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("70000"), std::string::npos);
  std::vector<int32_t> negative = {-1};
  EXPECT_FALSE((*w)->add_document(negative, std::vector<int32_t>{1}).ok());
  std::vector<int32_t> three = {1, 2, 3};
  EXPECT_FALSE((*w)->add_document(three, std::vector<int32_t>{2}).ok());
}

TEST(IndexedDataset, UnfinalizedWriterLeavesNoFiles) {
  TempDir dir;
  {
    auto w = IndexedDatasetWriter::create(dir.file("gone"), TokenDType::kUInt16);
    std::vector<int32_t> t = {1};
    ASSERT_TRUE((*w)->add_document(t, std::vector<int32_t>{1}).ok());
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

class BadIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = dir_.file("d");
    write_dataset(prefix_, {{1, 2, 3}, {4, 5}});
    idx_ = read_file(prefix_ + ".idx");
    bin_ = read_file(prefix_ + ".bin");
  }
  Status open_with(const std::string& idx, const std::string& bin) {
    write_file(prefix_ + ".idx", idx);
    write_file(prefix_ + ".bin", bin);
    auto ds = IndexedDataset::open(prefix_);
    return ds.status();
  }
  void expect_error(const std::string& idx, const std::string& bin, const std::string& fragment) {
    Status s = open_with(idx, bin);
    ASSERT_FALSE(s.ok()) << "expected an error containing '" << fragment << "'";
    EXPECT_NE(s.message().find(fragment), std::string::npos) << s.to_string();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << "errors are one line";
  }
  TempDir dir_;
  std::string prefix_, idx_, bin_;
};

TEST_F(BadIndexTest, ValidFileOpens) { EXPECT_TRUE(open_with(idx_, bin_).ok()); }

TEST_F(BadIndexTest, MissingFiles) {
  auto ds = IndexedDataset::open(dir_.file("nope"));
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find("nope.idx"), std::string::npos);
  std::filesystem::remove(prefix_ + ".bin");
  auto ds2 = IndexedDataset::open(prefix_);
  ASSERT_FALSE(ds2.ok());
  EXPECT_NE(ds2.status().message().find("d.bin"), std::string::npos);
}

TEST_F(BadIndexTest, TruncatedBin) { expect_error(idx_, bin_.substr(0, 7), "truncated"); }
TEST_F(BadIndexTest, LongerBin) { expect_error(idx_, bin_ + "xx", "expected 10 bytes"); }
TEST_F(BadIndexTest, TruncatedIdx) { expect_error(idx_.substr(0, 60), bin_, "expected 82 bytes"); }
TEST_F(BadIndexTest, ShortHeader) { expect_error(idx_.substr(0, 20), bin_, "header"); }
TEST_F(BadIndexTest, EmptyIdx) { expect_error("", bin_, "header"); }

TEST_F(BadIndexTest, WrongMagic) {
  std::string bad = idx_;
  bad[0] = 'X';
  expect_error(bad, bin_, "magic");
}

TEST_F(BadIndexTest, WrongVersion) {
  std::string bad = idx_;
  bad[9] = 2;
  expect_error(bad, bin_, "version 2");
}

TEST_F(BadIndexTest, WrongDtype) {
  std::string bad = idx_;
  bad[17] = 9;
  expect_error(bad, bin_, "dtype code");
  bad[17] = 0;
  expect_error(bad, bin_, "dtype code");
}

TEST_F(BadIndexTest, DtypeChangeMakesBinSizeWrong) {
  std::string bad = idx_;
  bad[17] = 4;  // int32 claims 20 bytes of .bin
  expect_error(bad, bin_, "pointers must follow");
}

TEST_F(BadIndexTest, HugeCounts) {
  std::string bad = idx_;
  bad[25] = '\x7f';
  expect_error(bad, bin_, "implausible");
}

TEST_F(BadIndexTest, DocumentIndicesMustEndAtSequenceCount) {
  std::string bad = idx_;
  bad[82 - 8] = 1;  // last document index 1 instead of 2
  expect_error(bad, bin_, "document");
}

TEST_F(BadIndexTest, NegativeLength) {
  std::string bad = idx_;
  bad[34 + 3] = '\x80';
  expect_error(bad, bin_, "negative length");
}

TEST_F(BadIndexTest, MultimodalIsNamed) { expect_error(idx_ + std::string(2, '\0'), bin_, "multimodal"); }

TEST(IndexedDataset, ReadsUnalignedArraysOfLargeFiles) {
  // 1000 sequences of varied lengths: the int64 arrays start at odd offsets (34 + 4*1000).
  TempDir dir;
  std::vector<std::vector<int32_t>> docs;
  for (int i = 0; i < 1000; ++i) docs.push_back(std::vector<int32_t>(static_cast<size_t>(i % 7 + 1), i));
  write_dataset(dir.file("big"), docs);
  auto ds = IndexedDataset::open(dir.file("big"));
  ASSERT_TRUE(ds.ok());
  int64_t expected_ptr = 0;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ((*ds)->sequence_pointer(i), expected_ptr);
    expected_ptr += 2 * (i % 7 + 1);
    int32_t t;
    ASSERT_TRUE((*ds)->read(i, 0, 1, &t).ok());
    EXPECT_EQ(t, i);
  }
  EXPECT_EQ((*ds)->total_tokens(), expected_ptr / 2);
}

}  // namespace
}  // namespace gale
