// TensorBoard event files: scalars written as torch.utils.tensorboard's SummaryWriter writes them.
//
// An event file is a sequence of TFRecord records:
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | payload | uint32 masked
//   CRC-32C of the payload,
// with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8. Each payload is a serialized
// `tensorflow.Event` protobuf, of which Gale writes only the fields below (hand-encoded, proto3
// rules: zero scalars are left out, fields in number order):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }   (simple_value is in a oneof: always written)
// The first record is Event{wall_time, file_version: "brain.Event:2"}; every scalar is its own
// Event{wall_time, step, summary{value{tag, simple_value}}}. docs/formats/tensorboard.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace gale {

// CRC-32C (Castagnoli, reflected, initial and final value 0xffffffff) of `data`: "123456789"
// gives 0xe3069283. Computed by Intel ISA-L's crc32_iscsi (hardware instructions where present).
uint32_t crc32c(const void* data, size_t size);
// TFRecord's masked CRC-32C.
uint32_t masked_crc32c(const void* data, size_t size);

// One TFRecord: length, masked CRC of the length, payload, masked CRC of the payload.
std::string tfrecord_frame(std::string_view payload);

// Serialized Event protobufs (the payloads above).
std::string encode_file_version_event(double wall_time);
std::string encode_scalar_event(std::string_view tag, float value, int64_t step, double wall_time);

// Seconds since the Unix epoch as a double (TensorBoard's wall_time).
double unix_wall_time();

// Appends events to one new event file in a directory. Records are kept in memory and written
// (whole records, one write per batch) when `queue_size` of them are pending, on flush() and on
// destruction, so a crash leaves the file ending at a record boundary of the last write.
class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) if missing and the file
  // events.out.tfevents.<unix seconds, 10 digits>.<hostname>.<pid>.0 in it (the name torch's
  // SummaryWriter gives its first file), then writes the file-version record. Errors name the
  // directory or file and the system's reason.
  static StatusOr<std::unique_ptr<TensorBoardWriter>> open(const std::string& dir, int64_t queue_size);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Queues Event{wall_time (now unless given), step, summary{value{tag, float(value)}}}.
  void add_scalar(std::string_view tag, double value, int64_t step, double wall_time = -1.0);
  // Writes the pending records to the file. A write error is reported once and ends writing.
  Status flush();

  // Called with every scalar add_scalar queues, after queueing it: how the same scalars also reach
  // the Weights & Biases run (train/wandb_log.h). Empty: none.
  using ScalarObserver = std::function<void(std::string_view tag, double value, int64_t step)>;
  void set_scalar_observer(ScalarObserver f) { observer_ = std::move(f); }

  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, int fd, int64_t queue_size);

  std::string path_;
  int fd_ = -1;
  int64_t queue_size_ = 1;
  int64_t pending_records_ = 0;
  std::string pending_;
  Status error_;
  ScalarObserver observer_;
};

}  // namespace gale
