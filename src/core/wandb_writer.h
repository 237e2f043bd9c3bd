// Weights & Biases offline runs: the run directory `wandb sync` uploads, written without Python.
//
// An offline run is <dir>/wandb/offline-run-<YYYYMMDD_HHMMSS>-<run id>/ holding run-<run id>.wandb
// (and files/, logs/; <dir>/wandb/latest-run links to it). The .wandb file is a LevelDB-log-style
// record file (wandb/sdk/internal/datastore.py):
//   header: ":W&B", uint16 0xBEE1, uint8 version 0 (7 bytes, little-endian)
//   then 32 KiB blocks of records: uint32 checksum | uint16 length | uint8 type | data, where
//   type is FULL (1), FIRST (2), MIDDLE (3) or LAST (4), checksum is zlib's CRC-32 of the type
//   byte followed by the data, a record never crosses a block boundary (a payload that does not
//   fit is split FIRST, MIDDLE..., LAST) and a block tail shorter than the 7-byte record header
//   is zero-filled.
// Each payload is a serialized wandb_internal.Record (wandb/proto/wandb_internal.proto), hand-
// encoded with core/protobuf_wire.h. Gale writes these fields of it:
//   Record        { int64 num = 1; HistoryRecord history = 2; SummaryRecord summary = 3;
//                   RunRecord run = 17; RunExitRecord exit = 18; HeaderRecord header = 21; }
//   HeaderRecord  { VersionInfo version_info = 1; }  VersionInfo { string producer = 1; string min_consumer = 2; }
//   RunRecord     { string run_id = 1; string project = 3; ConfigRecord config = 4; string display_name = 8;
//                   string host = 13; google.protobuf.Timestamp start_time = 17; }
//   ConfigRecord  { repeated ConfigItem update = 1; }      ConfigItem  { string key = 1; string value_json = 16; }
//   HistoryRecord { repeated HistoryItem item = 1; HistoryStep step = 2; }   HistoryStep { int64 num = 1; }
//   HistoryItem   { string key = 1; string value_json = 16; }
//   SummaryRecord { repeated SummaryItem update = 1; }     SummaryItem { string key = 1; string value_json = 16; }
//   RunExitRecord { int32 exit_code = 1; int32 runtime = 2; }
// in the order header, run (with the config), then per step a history row and a summary update of
// the same values, and exit last. docs/formats/wandb.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace gale {

// zlib's CRC-32 (IEEE, reflected) continuing from `crc` (0 to start): zlib_crc32(0, "123456789")
// is 0xcbf43926. Intel ISA-L's crc32_gzip_refl.
uint32_t zlib_crc32(uint32_t crc, const void* data, size_t size);

// The .wandb record framing. Keeps the file offset so that records are split at 32 KiB blocks.
class WandbRecordFramer {
 public:
  static constexpr int64_t kBlockSize = 32768;
  static constexpr int64_t kHeaderSize = 7;  // both the file header and a record header
  // The file header; the offset becomes 7.
  std::string file_header();
  // `payload` as one FULL record or FIRST/MIDDLE.../LAST records (with the zero padding of a block
  // tail before it when needed), advancing the offset.
  std::string frame(std::string_view payload);
  int64_t offset() const { return offset_; }

 private:
  std::string record(std::string_view data, uint8_t type);
  int64_t offset_ = 0;
};

// A JSON value as wandb writes it for a Python float: the shortest decimal that reads back as the
// same double ("2" for 2.0, "0.1", "1e-05"), "NaN", "Infinity", "-Infinity".
std::string wandb_json_number(double v);
// A JSON string literal ("..." with \" \\ \n \t \uXXXX escapes).
std::string wandb_json_string(std::string_view s);

// key -> value_json pairs (config items, history items, summary updates).
using WandbItems = std::vector<std::pair<std::string, std::string>>;

// Serialized Record payloads (num: the record's sequence number, from 1).
std::string encode_wandb_header_record(int64_t num, std::string_view producer);
struct WandbRunInfo {
  std::string run_id, project, display_name, host;
  int64_t start_seconds = 0;
  int32_t start_nanos = 0;
  WandbItems config;
};
std::string encode_wandb_run_record(int64_t num, const WandbRunInfo& run);
std::string encode_wandb_history_record(int64_t num, const WandbItems& items, int64_t step);
std::string encode_wandb_summary_record(int64_t num, const WandbItems& items);
std::string encode_wandb_exit_record(int64_t num, int32_t exit_code, int32_t runtime_seconds);

// Writes one offline run, as wandb.init(mode="offline", dir=..., name=..., project=...,
// config=...) and wandb.log(..., step) would. Scalars logged at the same step form one history
// row, written when a later step is logged or at finish() (as wandb commits a row); a step lower
// than the current one is dropped (wandb drops it with a warning). Records are kept in memory and
// written (whole records, one write per batch) by flush() and finish(), so a crash leaves the
// file ending at a record boundary of the last write.
class WandbWriter {
 public:
  // Creates <dir>/wandb/offline-run-<local time>-<run id>/ (and parents), files/ and logs/ in it,
  // <dir>/wandb/latest-run (a symbolic link, best effort) and run-<run id>.wandb, and writes the
  // header and run records. `run_id`: 8 characters of [a-z0-9], random when empty. Errors name
  // the directory or file and the system's reason.
  static StatusOr<std::unique_ptr<WandbWriter>> open(const std::string& dir, const std::string& project,
                                                     const std::string& exp_name, const WandbItems& config,
                                                     std::string run_id = "");
  ~WandbWriter();  // finish(1) when finish() was not called (the run failed)
  WandbWriter(const WandbWriter&) = delete;
  WandbWriter& operator=(const WandbWriter&) = delete;

  // wandb.log({key: value}, step): adds to the row of `step`.
  void log(std::string_view key, double value, int64_t step);
  // Writes the pending records (not the open row). A write error is reported once and ends writing.
  Status flush();
  // Writes the open row, the exit record (exit code, whole seconds since open) and closes the file.
  Status finish(int32_t exit_code);

  const std::string& run_dir() const { return run_dir_; }
  const std::string& path() const { return path_; }
  const std::string& run_id() const { return run_id_; }

 private:
  WandbWriter() = default;
  void add_record(const std::string& payload);
  void commit_row();

  std::string run_dir_, path_, run_id_;
  int fd_ = -1;
  double start_time_ = 0.0;
  int64_t num_ = 0;
  WandbRecordFramer framer_;
  std::string pending_;
  Status error_;
  bool finished_ = false;
  int64_t row_step_ = -1;  // the open row's step (-1: none yet)
  WandbItems row_;
};

}  // namespace gale
