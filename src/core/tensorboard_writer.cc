// TensorBoard event files: TFRecord framing, hand-encoded Event protobufs, the buffered writer.
#include "core/tensorboard_writer.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/fd_write.h"
#include "core/protobuf_wire.h"

namespace gale {

uint32_t crc32c(const void* data, size_t size) {
  // ISA-L's crc32_iscsi takes the running register and returns it without the final inversion.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t reg = 0xffffffffu;
  while (size > 0) {
    const int n = static_cast<int>(std::min<size_t>(size, INT_MAX));
    reg = crc32_iscsi(p, n, reg);
    p += n;
    size -= static_cast<size_t>(n);
  }
  return ~reg;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {

using namespace pbwire;

// Event's wall_time (1) and step (2), each left out when zero (proto3).
void put_event_header(std::string* out, double wall_time, int64_t step) {
  if (wall_time != 0.0 || std::signbit(wall_time)) put_double(out, 1, wall_time);
  if (step != 0) put_varint_field(out, 2, static_cast<uint64_t>(step));  // int64: two's complement
}

}  // namespace

std::string tfrecord_frame(std::string_view payload) {
  using pbwire::put_le;
  std::string out;
  out.reserve(payload.size() + 16);
  put_le(&out, payload.size(), 8);
  put_le(&out, masked_crc32c(out.data(), 8), 4);
  out.append(payload);
  put_le(&out, masked_crc32c(payload.data(), payload.size()), 4);
  return out;
}

std::string encode_file_version_event(double wall_time) {
  using pbwire::put_bytes;
  std::string event;
  put_event_header(&event, wall_time, 0);
  put_bytes(&event, 3, "brain.Event:2");
  return event;
}

std::string encode_scalar_event(std::string_view tag, float value, int64_t step, double wall_time) {
  using namespace pbwire;
  std::string v;
  if (!tag.empty()) put_bytes(&v, 1, tag);
  put_float(&v, 2, value);
  std::string summary;
  put_bytes(&summary, 1, v);
  std::string event;
  put_event_header(&event, wall_time, step);
  put_bytes(&event, 5, summary);
  return event;
}

double unix_wall_time() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::open(const std::string& dir, int64_t queue_size) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IOError("cannot create directory ", dir, ": ", ec.message());
  if (!std::filesystem::is_directory(dir, ec)) return IOError(dir, " is not a directory");
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  const double now = unix_wall_time();
  char name[400];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%lld.0", static_cast<long long>(now), host,
                static_cast<long long>(getpid()));
  std::string path = (std::filesystem::path(dir) / name).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IOError("cannot create ", path, ": ", std::strerror(errno));
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(std::move(path), fd, queue_size));
  w->pending_ = tfrecord_frame(encode_file_version_event(now));
  w->pending_records_ = 1;
  GALE_RETURN_IF_ERROR(w->flush());
  return w;
}

TensorBoardWriter::TensorBoardWriter(std::string path, int fd, int64_t queue_size)
    : path_(std::move(path)), fd_(fd), queue_size_(std::max<int64_t>(1, queue_size)) {}

TensorBoardWriter::~TensorBoardWriter() {
  (void)flush();
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::add_scalar(std::string_view tag, double value, int64_t step, double wall_time) {
  if (wall_time < 0.0) wall_time = unix_wall_time();
  pending_ += tfrecord_frame(encode_scalar_event(tag, static_cast<float>(value), step, wall_time));
  if (++pending_records_ >= queue_size_) (void)flush();
  if (observer_) observer_(tag, value, step);
}

Status TensorBoardWriter::flush() {
  if (!error_.ok()) return error_;
  error_ = write_all_to_fd(fd_, pending_, path_);
  pending_.clear();
  pending_records_ = 0;
  return error_;
}

}  // namespace gale
