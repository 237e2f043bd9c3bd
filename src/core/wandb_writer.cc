// Weights & Biases offline runs: record framing, hand-encoded Record protobufs, the run writer.
#include "core/wandb_writer.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <system_error>

#include "core/fd_write.h"
#include "core/protobuf_wire.h"
#include "core/tensorboard_writer.h"  // unix_wall_time

namespace gale {

uint32_t zlib_crc32(uint32_t crc, const void* data, size_t size) {
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), size);
}

std::string WandbRecordFramer::file_header() {
  std::string h = ":W&B";
  pbwire::put_le(&h, 0xBEE1, 2);  // magic
  h.push_back('\0');               // version
  offset_ = kHeaderSize;
  return h;
}

std::string WandbRecordFramer::record(std::string_view data, uint8_t type) {
  std::string out;
  const unsigned char t = type;
  const uint32_t crc = zlib_crc32(zlib_crc32(0, &t, 1), data.data(), data.size());
  pbwire::put_le(&out, crc, 4);
  pbwire::put_le(&out, data.size(), 2);
  out.push_back(static_cast<char>(type));
  out.append(data);
  offset_ += kHeaderSize + static_cast<int64_t>(data.size());
  return out;
}

std::string WandbRecordFramer::frame(std::string_view payload) {
  std::string out;
  int64_t space = kBlockSize - offset_ % kBlockSize;
  if (space < kHeaderSize) {  // the block's tail cannot hold a record header: zero-filled
    out.append(static_cast<size_t>(space), '\0');
    offset_ += space;
    space = kBlockSize;
  }
  if (static_cast<int64_t>(payload.size()) + kHeaderSize <= space) return out + record(payload, 1);
  size_t used = static_cast<size_t>(space - kHeaderSize);
  out += record(payload.substr(0, used), 2);  // FIRST: ends on the block boundary
  constexpr size_t kData = kBlockSize - kHeaderSize;
  while (payload.size() - used > kData) {
    out += record(payload.substr(used, kData), 3);  // MIDDLE: a whole block
    used += kData;
  }
  out += record(payload.substr(used), 4);  // LAST
  return out;
}

std::string wandb_json_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string wandb_json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += b;
        } else {
          out.push_back(c);
        }
    }
  }
  return out + "\"";
}

namespace {

using namespace pbwire;

// An item message { string key = 1; string value_json = 16; } as field `field` of `out`.
void put_item(std::string* out, int field, const std::string& key, const std::string& value_json) {
  std::string item;
  if (!key.empty()) put_bytes(&item, 1, key);
  if (!value_json.empty()) put_bytes(&item, 16, value_json);
  put_bytes(out, field, item);
}

std::string record_with(int64_t num, int field, const std::string& message) {
  std::string r;
  if (num != 0) put_varint_field(&r, 1, static_cast<uint64_t>(num));
  put_bytes(&r, field, message);
  return r;
}

}  // namespace

std::string encode_wandb_header_record(int64_t num, std::string_view producer) {
  std::string version;
  if (!producer.empty()) put_bytes(&version, 1, producer);
  put_bytes(&version, 2, "0.40.0");  // min_consumer, as wandb 0.19 writes it
  std::string header;
  put_bytes(&header, 1, version);
  return record_with(num, 21, header);
}

std::string encode_wandb_run_record(int64_t num, const WandbRunInfo& run) {
  std::string r;
  if (!run.run_id.empty()) put_bytes(&r, 1, run.run_id);
  if (!run.project.empty()) put_bytes(&r, 3, run.project);
  std::string config;
  for (const auto& [k, v] : run.config) put_item(&config, 1, k, v);
  put_bytes(&r, 4, config);
  if (!run.display_name.empty()) put_bytes(&r, 8, run.display_name);
  if (!run.host.empty()) put_bytes(&r, 13, run.host);
  std::string ts;
  if (run.start_seconds != 0) put_varint_field(&ts, 1, static_cast<uint64_t>(run.start_seconds));
  if (run.start_nanos != 0) put_varint_field(&ts, 2, static_cast<uint64_t>(static_cast<int64_t>(run.start_nanos)));
  put_bytes(&r, 17, ts);
  return record_with(num, 17, r);
}

std::string encode_wandb_history_record(int64_t num, const WandbItems& items, int64_t step) {
  std::string h;
  for (const auto& [k, v] : items) put_item(&h, 1, k, v);
  std::string s;
  if (step != 0) put_varint_field(&s, 1, static_cast<uint64_t>(step));
  put_bytes(&h, 2, s);
  return record_with(num, 2, h);
}

std::string encode_wandb_summary_record(int64_t num, const WandbItems& items) {
  std::string s;
  for (const auto& [k, v] : items) put_item(&s, 1, k, v);
  return record_with(num, 3, s);
}

std::string encode_wandb_exit_record(int64_t num, int32_t exit_code, int32_t runtime_seconds) {
  std::string e;  // int32: negative values are sign-extended to ten bytes
  if (exit_code != 0) put_varint_field(&e, 1, static_cast<uint64_t>(static_cast<int64_t>(exit_code)));
  if (runtime_seconds != 0) put_varint_field(&e, 2, static_cast<uint64_t>(static_cast<int64_t>(runtime_seconds)));
  return record_with(num, 18, e);
}

StatusOr<std::unique_ptr<WandbWriter>> WandbWriter::open(const std::string& dir, const std::string& project,
                                                         const std::string& exp_name, const WandbItems& config,
                                                         std::string run_id) {
  namespace fs = std::filesystem;
  if (run_id.empty()) {
    std::random_device rd;
    std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid()));
    const char* alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
    for (int i = 0; i < 8; ++i) run_id.push_back(alphabet[gen() % 36]);
  }
  const double now = unix_wall_time();
  const std::time_t secs = static_cast<std::time_t>(now);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &tm);
  const fs::path wandb_dir = fs::path(dir) / "wandb";
  const std::string run_name = std::string("offline-run-") + stamp + "-" + run_id;
  const fs::path run_dir = wandb_dir / run_name;
  std::error_code ec;
  for (const fs::path& d : {run_dir / "files", run_dir / "logs"}) {
    fs::create_directories(d, ec);
    if (ec) return IOError("cannot create directory ", d.string(), ": ", ec.message());
  }
  const fs::path latest = wandb_dir / "latest-run";  // as wandb: replaced by each new run
  fs::remove(latest, ec);
  fs::create_directory_symlink(run_name, latest, ec);  // best effort (some file systems refuse links)

  std::unique_ptr<WandbWriter> w(new WandbWriter());
  w->run_dir_ = run_dir.string();
  w->path_ = (run_dir / ("run-" + run_id + ".wandb")).string();
  w->run_id_ = run_id;
  w->start_time_ = now;
  w->fd_ = ::open(w->path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return IOError("cannot create ", w->path_, ": ", std::strerror(errno));
  w->pending_ = w->framer_.file_header();
  w->add_record(encode_wandb_header_record(++w->num_, "gale"));
  WandbRunInfo run;
  run.run_id = run_id;
  run.project = project;
  run.display_name = exp_name;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  run.host = host;
  run.start_seconds = static_cast<int64_t>(now);
  run.start_nanos = static_cast<int32_t>(std::lround((now - std::floor(now)) * 1e6)) * 1000;
  run.config = config;
  w->add_record(encode_wandb_run_record(++w->num_, run));
  GALE_RETURN_IF_ERROR(w->flush());
  return w;
}

WandbWriter::~WandbWriter() {
  if (!finished_) (void)finish(1);
}

void WandbWriter::add_record(const std::string& payload) { pending_ += framer_.frame(payload); }

void WandbWriter::log(std::string_view key, double value, int64_t step) {
  if (finished_ || step < row_step_) return;
  if (step > row_step_) {
    commit_row();
    row_step_ = step;
  }
  const std::string json = wandb_json_number(value);
  for (auto& [k, v] : row_)
    if (k == key) {
      v = json;
      return;
    }
  row_.emplace_back(std::string(key), json);
}

void WandbWriter::commit_row() {
  if (row_.empty()) return;
  const double now = unix_wall_time();
  WandbItems items = row_;
  items.emplace_back("_step", std::to_string(row_step_));
  items.emplace_back("_runtime", wandb_json_number(now - start_time_));
  items.emplace_back("_timestamp", wandb_json_number(now));
  add_record(encode_wandb_history_record(++num_, items, row_step_));
  add_record(encode_wandb_summary_record(++num_, items));  // the summary: each key's last value
  row_.clear();
}

Status WandbWriter::flush() {
  if (!error_.ok()) return error_;
  error_ = write_all_to_fd(fd_, pending_, path_);
  pending_.clear();
  return error_;
}

Status WandbWriter::finish(int32_t exit_code) {
  if (finished_) return error_;
  commit_row();
  const double runtime = unix_wall_time() - start_time_;
  add_record(encode_wandb_exit_record(++num_, exit_code, static_cast<int32_t>(runtime)));
  finished_ = true;
  Status st = flush();
  if (fd_ >= 0 && ::close(fd_) != 0 && st.ok()) st = IOError("cannot close ", path_, ": ", std::strerror(errno));
  fd_ = -1;
  return st;
}

}  // namespace gale
