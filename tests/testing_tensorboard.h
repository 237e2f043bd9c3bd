// Test helper: reads a TensorBoard event file (TFRecord framing, the Event fields Gale writes),
// checking every record's length and payload CRCs.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensorboard_writer.h"

namespace gale::testing {

struct TbEvent {
  double wall_time = 0.0;
  int64_t step = 0;
  std::string file_version;
  std::string tag;  // the summary's (single) value, when there is one
  float value = 0.0f;
  bool has_value = false;
};

// Splits framed records; returns false (with `error`) on a short record or a CRC mismatch.
inline bool read_tfrecords(const std::string& data, std::vector<std::string>* payloads, std::string* error) {
  size_t pos = 0;
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, data.data() + at, 4);
    return v;
  };
  while (pos < data.size()) {
    if (data.size() - pos < 12) return *error = "truncated length at byte " + std::to_string(pos), false;
    uint64_t len;
    std::memcpy(&len, data.data() + pos, 8);
    if (u32(pos + 8) != masked_crc32c(data.data() + pos, 8)) return *error = "bad length CRC", false;
    if (data.size() - pos - 12 < len + 4) return *error = "truncated record at byte " + std::to_string(pos), false;
    if (u32(pos + 12 + len) != masked_crc32c(data.data() + pos + 12, len)) return *error = "bad payload CRC", false;
    payloads->push_back(data.substr(pos + 12, len));
    pos += 12 + len + 4;
  }
  return true;
}

namespace tb_detail {
inline uint64_t varint(const std::string& s, size_t* pos) {
  uint64_t v = 0;
  for (int shift = 0; *pos < s.size(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(s[(*pos)++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) break;
  }
  return v;
}
// Calls f(field, wire_type, pos_of_value) for each field; length-delimited values come as strings.
template <class F>
void fields(const std::string& s, F f) {
  size_t pos = 0;
  while (pos < s.size()) {
    const uint64_t key = varint(s, &pos);
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    std::string bytes;
    uint64_t number = 0;
    if (wire == 0) number = varint(s, &pos);
    if (wire == 1) std::memcpy(&number, s.data() + pos, 8), pos += 8;
    if (wire == 5) std::memcpy(&number, s.data() + pos, 4), pos += 4;
    if (wire == 2) {
      const uint64_t n = varint(s, &pos);
      bytes = s.substr(pos, n);
      pos += n;
    }
    f(field, number, bytes);
  }
}
}  // namespace tb_detail

inline TbEvent parse_event(const std::string& payload) {
  TbEvent e;
  tb_detail::fields(payload, [&](int field, uint64_t number, const std::string& bytes) {
    if (field == 1) std::memcpy(&e.wall_time, &number, 8);
    if (field == 2) e.step = static_cast<int64_t>(number);
    if (field == 3) e.file_version = bytes;
    if (field == 5)
      tb_detail::fields(bytes, [&](int, uint64_t, const std::string& value) {
        tb_detail::fields(value, [&](int vf, uint64_t vn, const std::string& vb) {
          if (vf == 1) e.tag = vb;
          if (vf == 2) {
            const uint32_t bits = static_cast<uint32_t>(vn);
            std::memcpy(&e.value, &bits, 4);
            e.has_value = true;
          }
        });
      });
  });
  return e;
}

// The events.out.tfevents.* files in `dir`.
inline std::vector<std::filesystem::path> event_files(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  if (!std::filesystem::is_directory(dir)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(entry.path());
  return out;
}

// The scalar events of the only event file in `dir` (the file-version record checked and dropped);
// a missing or second file, a damaged record or a record without a value fails the test.
inline std::vector<TbEvent> read_scalar_events(const std::string& dir) {
  std::vector<std::filesystem::path> files = event_files(dir);
  EXPECT_EQ(files.size(), 1u) << dir;
  if (files.empty()) return {};
  std::ifstream in(files[0], std::ios::binary);
  std::stringstream data;
  data << in.rdbuf();
  std::vector<std::string> payloads;
  std::string error;
  EXPECT_TRUE(read_tfrecords(data.str(), &payloads, &error)) << error;
  std::vector<TbEvent> out;
  for (size_t i = 0; i < payloads.size(); ++i) {
    TbEvent e = parse_event(payloads[i]);
    if (i == 0) {
      EXPECT_EQ(e.file_version, "brain.Event:2");
      continue;
    }
    EXPECT_TRUE(e.has_value) << "record " << i;
    out.push_back(e);
  }
  return out;
}

}  // namespace gale::testing
