// TensorBoard event files: CRC-32C and TFRecord framing against known values, the scalar records
// byte for byte against torch's SummaryWriter (tools/reference/tensorboard_reference.py), and the
// writer's file name, first record, queueing and errors.
#include "core/tensorboard_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>

#include "cli/cli_test_util.h"
#include "testing_tensorboard.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing::parse_event;
using testing::read_tfrecords;
using testing::slurp;

TEST(Crc32c, KnownValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);  // the CRC-32C check value
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720 B.4: 32 bytes of zeros, and of 0xff.
  std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62a8ab43u);
}

TEST(TfRecord, FramingMatchesTorchsFirstScalarRecord) {
  // torch's SummaryWriter framed a 29-byte Event: the masked CRC of its length is 0x23df2f60 and of
  // its payload 0xc84034a8 (printed by the reference script).
  const std::string records = slurp(GALE_TEST_DATA_DIR "/reference/tensorboard/scalars.records");
  ASSERT_GE(records.size(), 45u);
  const std::string length(records.data(), 8);
  EXPECT_EQ(masked_crc32c(length.data(), 8), 0x23df2f60u);
  const std::string payload = records.substr(12, 29);
  EXPECT_EQ(masked_crc32c(payload.data(), payload.size()), 0xc84034a8u);
  EXPECT_EQ(tfrecord_frame(payload), records.substr(0, 45));
}

struct Scalar {
  const char* tag;
  double value;
  int64_t step;
  double wall_time;
};

// The list of tools/reference/tensorboard_reference.py.
const Scalar kScalars[] = {
    {"lm loss", 10.8125, 1, 1700000000.25},
    {"learning-rate", 0.0, 0, 1700000000.5},
    {"learning-rate vs samples", 6e-4, 320, 1700000001.0},
    {"grad-norm", -1.0 / 3.0, 2, 1700000002.125},
    {"lm loss validation ppl", 3.0e38, int64_t{1} << 40, 1700000003.0},
    {"mem-allocated-bytes", 123456789.0, 7, 1.5},
    {"verlust \xc3\xbc", std::numeric_limits<double>::quiet_NaN(), 8, 1700000004.0},
    {"z_loss", std::numeric_limits<double>::infinity(), 9, 1700000005.0},
};

TEST(TensorBoardEvents, ScalarRecordsAreTorchsBytes) {
  const std::string expected = slurp(GALE_TEST_DATA_DIR "/reference/tensorboard/scalars.records");
  std::string ours;
  for (const Scalar& s : kScalars)
    ours += tfrecord_frame(encode_scalar_event(s.tag, static_cast<float>(s.value), s.step, s.wall_time));
  ASSERT_EQ(ours.size(), expected.size());
  EXPECT_TRUE(ours == expected);
}

TEST(TensorBoardWriter, WritesTorchsFileNameFirstRecordAndScalars) {
  const std::string dir = ::testing::TempDir() + "gale_tb_writer/new/sub";
  fs::remove_all(::testing::TempDir() + "gale_tb_writer");
  const double before = unix_wall_time();
  StatusOr<std::unique_ptr<TensorBoardWriter>> w = TensorBoardWriter::open(dir, 1000);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const std::string path = w.value()->path();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::regex name(std::string(R"(events\.out\.tfevents\.(\d{10})\.)") + host + "\\." +
                        std::to_string(getpid()) + R"(\.0)");
  std::smatch m;
  const std::string file = fs::path(path).filename().string();
  ASSERT_TRUE(std::regex_match(file, m, name)) << file;
  EXPECT_NEAR(std::stod(m[1]), before, 2.0);
  EXPECT_EQ(fs::path(path).parent_path(), fs::path(dir));

  for (const Scalar& s : kScalars) w.value()->add_scalar(s.tag, s.value, s.step, s.wall_time);
  w.value()->add_scalar("now", 2.5, 3);  // wall time from the clock
  ASSERT_TRUE(w.value()->flush().ok());
  std::vector<std::string> payloads;
  std::string error;
  ASSERT_TRUE(read_tfrecords(slurp(path), &payloads, &error)) << error;
  ASSERT_EQ(payloads.size(), 2 + std::size(kScalars));
  const testing::TbEvent first = parse_event(payloads[0]);
  EXPECT_EQ(first.file_version, "brain.Event:2");
  EXPECT_FALSE(first.has_value);
  EXPECT_NEAR(first.wall_time, before, 2.0);
  EXPECT_EQ(first.step, 0);
  std::string scalars;
  for (size_t i = 1; i <= std::size(kScalars); ++i) scalars += tfrecord_frame(payloads[i]);
  EXPECT_TRUE(scalars == slurp(GALE_TEST_DATA_DIR "/reference/tensorboard/scalars.records"));
  const testing::TbEvent last = parse_event(payloads.back());
  EXPECT_EQ(last.tag, "now");
  EXPECT_EQ(last.value, 2.5f);
  EXPECT_EQ(last.step, 3);
  EXPECT_NEAR(last.wall_time, unix_wall_time(), 5.0);
}

TEST(TensorBoardWriter, KeepsQueueSizeRecordsThenWritesThemWhole) {
  const std::string dir = ::testing::TempDir() + "gale_tb_queue";
  fs::remove_all(dir);
  auto w = TensorBoardWriter::open(dir, 3);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const std::string path = w.value()->path();
  const size_t header = slurp(path).size();  // the file-version record is written at once
  EXPECT_GT(header, 0u);
  w.value()->add_scalar("a", 1.0, 1, 1.0);
  w.value()->add_scalar("a", 2.0, 2, 2.0);
  EXPECT_EQ(slurp(path).size(), header);  // two pending
  w.value()->add_scalar("a", 3.0, 3, 3.0);  // the third fills the queue
  const size_t three = slurp(path).size();
  EXPECT_GT(three, header);
  w.value()->add_scalar("a", 4.0, 4, 4.0);
  EXPECT_EQ(slurp(path).size(), three);
  w.value().reset();  // destruction writes the rest
  std::vector<std::string> payloads;
  std::string error;
  ASSERT_TRUE(read_tfrecords(slurp(path), &payloads, &error)) << error;
  ASSERT_EQ(payloads.size(), 5u);
  EXPECT_EQ(parse_event(payloads[4]).value, 4.0f);
}

TEST(TensorBoardWriter, DirectoryThatCannotBeCreatedIsAnError) {
  const std::string file = ::testing::TempDir() + "gale_tb_plain_file";
  std::ofstream(file) << "x";
  auto w = TensorBoardWriter::open(file + "/logs", 1000);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("cannot create directory " + file + "/logs"), std::string::npos)
      << w.status().message();
  auto same = TensorBoardWriter::open(file, 1000);
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.status().message().find(file), std::string::npos) << same.status().message();
}

}  // namespace
}  // namespace gale
