// The W&B offline-run writer: the record framing against a file wandb's own DataStore wrote for the
// same payloads, and a fixed run's records against wandb's protobuf classes' reading of them
// (tests/data/reference/wandb/, tools/reference/wandb_reference.py).
#include "core/wandb_writer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "testing_wandb.h"

namespace gale {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') out.push_back(line);
  return out;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + name + "_" + std::to_string(getpid());
  fs::remove_all(dir);
  return dir;
}

// The one run-*.wandb file under <dir>/wandb/offline-run-*/.
std::string run_file(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".wandb") found.push_back(e.path().string());
  EXPECT_EQ(found.size(), 1u) << dir;
  return found.empty() ? "" : found[0];
}

TEST(WandbWriter, ZlibCrc32CheckValue) {
  EXPECT_EQ(zlib_crc32(0, "123456789", 9), 0xcbf43926u);
  EXPECT_EQ(zlib_crc32(zlib_crc32(0, "1234", 4), "56789", 5), 0xcbf43926u);  // continued as zlib.crc32(data, crc)
}

// Describes framed bytes as wandb_reference.py `framing` does.
std::vector<std::string> describe_framing(const std::string& data, const std::vector<size_t>& sizes) {
  std::vector<std::string> out;
  std::string s = "sizes";
  for (size_t n : sizes) s += " " + std::to_string(n);
  out.push_back(s);
  char buf[160];
  std::string hex;
  for (int i = 0; i < 7; ++i) std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char>(data[i])), hex += buf;
  out.push_back("header " + hex);
  size_t pos = 7;
  while (pos < data.size()) {
    const size_t left = 32768 - pos % 32768;
    if (left < 7) {
      out.push_back("pad " + std::to_string(pos) + " " + std::to_string(left));
      pos += left;
      continue;
    }
    uint32_t crc;
    uint16_t len;
    std::memcpy(&crc, data.data() + pos, 4);
    std::memcpy(&len, data.data() + pos + 4, 2);
    std::snprintf(buf, sizeof buf, "record %zu type %d length %u crc %08x", pos, data[pos + 6], len, crc);
    out.push_back(buf);
    pos += 7 + len;
  }
  std::snprintf(buf, sizeof buf, "size %zu crc32 %08x", data.size(), zlib_crc32(0, data.data(), data.size()));
  out.push_back(buf);
  return out;
}

// Block boundaries, padding, records spanning blocks (FIRST/MIDDLE/LAST, and a FIRST with no data),
// empty records and checksums equal those of wandb 0.19.11's DataStore for the same payloads.
TEST(WandbWriter, FramingEqualsWandbsDataStore) {
  const std::vector<std::string> golden =
      lines_of(testing::read_file_bytes(std::string(GALE_TEST_DATA_DIR) + "/reference/wandb/framing.txt"));
  ASSERT_FALSE(golden.empty());
  std::vector<size_t> sizes;
  {
    std::istringstream in(golden[0].substr(6));
    for (size_t n; in >> n;) sizes.push_back(n);
  }
  ASSERT_EQ(sizes.size(), 8u);
  WandbRecordFramer framer;
  std::string data = framer.file_header();
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::string payload(sizes[i], '\0');
    for (size_t j = 0; j < sizes[i]; ++j) payload[j] = static_cast<char>((i * 31 + j * 7) % 251);
    data += framer.frame(payload);
  }
  EXPECT_EQ(framer.offset(), static_cast<int64_t>(data.size()));
  EXPECT_EQ(describe_framing(data, sizes), golden);
  std::vector<std::string> payloads;
  std::string error;
  ASSERT_TRUE(testing::read_wandb_records(data, &payloads, &error)) << error;
  ASSERT_EQ(payloads.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(payloads[i].size(), sizes[i]);
}

TEST(WandbWriter, JsonNumbersAsWandbWritesThem) {
  EXPECT_EQ(wandb_json_number(2.0), "2");
  EXPECT_EQ(wandb_json_number(0.1), "0.1");
  EXPECT_EQ(wandb_json_number(1e-5), "1e-05");
  EXPECT_EQ(wandb_json_number(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(wandb_json_number(-std::numeric_limits<double>::infinity()), "-Infinity");
  EXPECT_EQ(wandb_json_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
}

// The fixed run: rows merge at one step, a lower step is dropped, the exit record comes last.
// GALE_WANDB_KEEP=DIR writes it there too, for `wandb_reference.py decode`.
void write_fixed_run(const std::string& dir) {
  WandbItems config = {{"lr", "0.003"}, {"name", "\"x\""}, {"flag", "true"}, {"none", "null"}, {"list", "[1, 2]"}};
  StatusOr<std::unique_ptr<WandbWriter>> w = WandbWriter::open(dir, "proj", "exp1", config, "gale0001");
  ASSERT_TRUE(w.ok()) << w.status().message();
  WandbWriter& r = *w.value();
  r.log("lm loss", 2.5, 1);
  r.log("learning-rate", 0.1, 1);
  r.log("lm loss", 2.25, 1);  // replaces 2.5 in the row of step 1
  r.log("lm loss", 1.0 / 3.0, 2);
  r.log("grad-norm", std::numeric_limits<double>::quiet_NaN(), 2);
  r.log("lm loss", 9.0, 1);  // lower than the current step: dropped
  ASSERT_TRUE(r.flush().ok());
  r.log("lm loss validation", 1e-5, 5);
  ASSERT_TRUE(r.finish(0).ok());
}

TEST(WandbWriter, FixedRunEqualsWandbsReading) {
  const std::string dir = fresh_dir("gale_wandb_fixed");
  write_fixed_run(dir);
  if (const char* keep = std::getenv("GALE_WANDB_KEEP")) write_fixed_run(keep);
  ASSERT_TRUE(fs::is_directory(dir + "/wandb"));
  const std::string file = run_file(dir);
  EXPECT_EQ(fs::path(file).filename(), "run-gale0001.wandb");
  EXPECT_EQ(fs::path(file).parent_path().filename().string().substr(0, 12), "offline-run-");
  EXPECT_TRUE(fs::is_directory(fs::path(file).parent_path() / "files"));
  const std::vector<std::string> golden =
      lines_of(testing::read_file_bytes(std::string(GALE_TEST_DATA_DIR) + "/reference/wandb/fixed_run.txt"));
  EXPECT_EQ(testing::describe_wandb_run(file), golden);
  fs::remove_all(dir);
}

// Without finish() (a failed run) the destructor writes the open row and exit code 1; every flush
// leaves whole records.
TEST(WandbWriter, FlushLeavesWholeRecordsAndAnUnfinishedRunExitsWithOne) {
  const std::string dir = fresh_dir("gale_wandb_unfinished");
  std::string file;
  {
    StatusOr<std::unique_ptr<WandbWriter>> w = WandbWriter::open(dir, "p", "e", {}, "abcd1234");
    ASSERT_TRUE(w.ok()) << w.status().message();
    for (int step = 1; step <= 3; ++step) {
      w.value()->log("lm loss", step, step);
      ASSERT_TRUE(w.value()->flush().ok());
    }
    file = w.value()->path();
    // Rows of steps 1 and 2 are written; step 3's is still open.
    const std::vector<std::string> mid = testing::describe_wandb_run(file);
    ASSERT_EQ(mid.size(), 6u);
    EXPECT_EQ(mid[4].substr(0, 17), "5 history step=2 ");
  }
  const std::vector<std::string> lines = testing::describe_wandb_run(file);
  ASSERT_EQ(lines.size(), 9u);
  EXPECT_EQ(lines[6].substr(0, 17), "7 history step=3 ");
  EXPECT_EQ(lines[8], "9 exit exit_code=1 runtime=<t>");
  fs::remove_all(dir);
}

// A write that fails (here the file-size limit, as a full disk would) is reported with the file's
// path and the system's reason, and every later flush returns the same error. In a child process,
// which lowers its own RLIMIT_FSIZE (SIGXFSZ ignored, so write() fails with EFBIG).
TEST(WandbWriter, AFailedWriteIsReportedOnceAndSticks) {
  const std::string dir = fresh_dir("gale_wandb_full");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    StatusOr<std::unique_ptr<WandbWriter>> w = WandbWriter::open(dir, "p", "e", {}, "full0001");
    if (!w.ok()) _exit(10);
    const auto size = static_cast<rlim_t>(fs::file_size(w.value()->path()));
    rlimit lim{size + 16, size + 16};
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(11);
    for (int step = 1; step <= 50; ++step) w.value()->log("lm loss", step, step);
    const Status st = w.value()->flush();
    w.value()->log("lm loss", 1.0, 60);
    const Status again = w.value()->flush();
    const std::string expected = "cannot write " + w.value()->path() + ": File too large";
    if (st.ok() || st.message().find(expected) == std::string::npos) _exit(12);
    if (again.message() != st.message()) _exit(13);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: open failed, 11: setrlimit, 12: no or wrong error, 13: not sticky";
  fs::remove_all(dir);
}

TEST(WandbWriter, OpenErrorsNameThePath) {
  const std::string base = fresh_dir("gale_wandb_bad");
  fs::create_directories(base);
  std::ofstream(base + "/file") << "x";
  StatusOr<std::unique_ptr<WandbWriter>> w = WandbWriter::open(base + "/file/sub", "p", "e", {});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("cannot create directory " + base + "/file/sub/wandb/offline-run-"),
            std::string::npos)
      << w.status().message();
  fs::remove_all(base);
}

}  // namespace
}  // namespace gale
