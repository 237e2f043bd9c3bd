// Test helper: reads a W&B .wandb file (record framing with CRC checks, the Record fields Gale
// writes) and describes its records as tools/reference/wandb_reference.py `decode` does.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/wandb_writer.h"

namespace gale::testing {

// Splits a .wandb file into record payloads (FIRST/MIDDLE/LAST joined); false (with `error`) on a
// bad file header, a bad checksum, non-zero block padding or a misplaced record type.
inline bool read_wandb_records(const std::string& data, std::vector<std::string>* payloads, std::string* error) {
  constexpr size_t kBlock = 32768, kHeader = 7;
  if (data.size() < kHeader || data.compare(0, 4, ":W&B") != 0 || static_cast<unsigned char>(data[4]) != 0xe1 ||
      static_cast<unsigned char>(data[5]) != 0xbe || data[6] != 0)
    return *error = "bad file header", false;
  size_t pos = kHeader;
  std::string joined;
  bool in_record = false;
  while (pos < data.size()) {
    const size_t left = kBlock - pos % kBlock;
    if (left < kHeader) {
      for (size_t i = 0; i < left; ++i)
        if (pos + i < data.size() && data[pos + i] != 0) return *error = "non-zero padding", false;
      pos += left;
      continue;
    }
    if (data.size() - pos < kHeader) return *error = "truncated record header at " + std::to_string(pos), false;
    uint32_t crc;
    uint16_t len;
    std::memcpy(&crc, data.data() + pos, 4);
    std::memcpy(&len, data.data() + pos + 4, 2);
    const uint8_t type = static_cast<uint8_t>(data[pos + 6]);
    if (data.size() - pos - kHeader < len) return *error = "truncated record at " + std::to_string(pos), false;
    if (len + kHeader > left) return *error = "record crosses a block at " + std::to_string(pos), false;
    const std::string body = data.substr(pos + kHeader, len);
    if (zlib_crc32(zlib_crc32(0, &type, 1), body.data(), body.size()) != crc)
      return *error = "bad checksum at " + std::to_string(pos), false;
    if ((type == 1 || type == 2) == in_record || type < 1 || type > 4)
      return *error = "unexpected record type " + std::to_string(type) + " at " + std::to_string(pos), false;
    joined += body;
    in_record = type == 2 || type == 3;
    if (!in_record) payloads->push_back(std::move(joined)), joined.clear();
    pos += kHeader + len;
  }
  if (in_record) return *error = "file ends inside a record", false;
  return true;
}

// One protobuf field: number, wire type, varint value or bytes.
struct PbField {
  int number = 0, wire = 0;
  uint64_t varint = 0;
  std::string bytes;
};

inline std::vector<PbField> parse_pb(const std::string& m) {
  std::vector<PbField> out;
  size_t pos = 0;
  auto varint = [&]() {
    uint64_t v = 0;
    for (int shift = 0; pos < m.size(); shift += 7) {
      const uint8_t b = static_cast<uint8_t>(m[pos++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  };
  while (pos < m.size()) {
    PbField f;
    const uint64_t key = varint();
    f.number = static_cast<int>(key >> 3);
    f.wire = static_cast<int>(key & 7);
    if (f.wire == 0) {
      f.varint = varint();
    } else if (f.wire == 2) {
      const size_t n = varint();
      f.bytes = m.substr(pos, n);
      pos += n;
    } else if (f.wire == 1) {
      f.bytes = m.substr(pos, 8), pos += 8;
    } else if (f.wire == 5) {
      f.bytes = m.substr(pos, 4), pos += 4;
    } else {
      break;
    }
    out.push_back(std::move(f));
  }
  return out;
}

inline std::string pb_string(const std::vector<PbField>& fs, int number) {
  for (const PbField& f : fs)
    if (f.number == number) return f.bytes;
  return "";
}
inline int64_t pb_int(const std::vector<PbField>& fs, int number) {
  for (const PbField& f : fs)
    if (f.number == number) return static_cast<int64_t>(f.varint);
  return 0;
}

// key -> value_json of the repeated item field `number` (ConfigItem/HistoryItem/SummaryItem).
inline std::vector<std::pair<std::string, std::string>> pb_items(const std::vector<PbField>& fs, int number) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const PbField& f : fs)
    if (f.number == number) {
      const std::vector<PbField> item = parse_pb(f.bytes);
      out.emplace_back(pb_string(item, 1), pb_string(item, 16));
    }
  return out;
}

inline std::string describe_items(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string s;
  for (const auto& [k, v] : items)
    s += (s.empty() ? "" : " ") + k + "=" + (k == "_runtime" || k == "_timestamp" ? std::string("<t>") : v);
  return s;
}

// One line per record, as wandb_reference.py's describe().
inline std::string describe_wandb_record(const std::string& payload) {
  const std::vector<PbField> r = parse_pb(payload);
  const std::string num = std::to_string(pb_int(r, 1));
  for (const PbField& f : r) {
    const std::vector<PbField> m = f.wire == 2 ? parse_pb(f.bytes) : std::vector<PbField>{};
    switch (f.number) {
      case 21: {
        const std::vector<PbField> v = parse_pb(pb_string(m, 1));
        return num + " header producer=" + pb_string(v, 1) + " min_consumer=" + pb_string(v, 2);
      }
      case 17:
        return num + " run run_id=" + pb_string(m, 1) + " project=" + pb_string(m, 3) +
               " display_name=" + pb_string(m, 8) + " host=<h> start_time=<t> config: " +
               describe_items(pb_items(parse_pb(pb_string(m, 4)), 1));
      case 2:
        return num + " history step=" + std::to_string(pb_int(parse_pb(pb_string(m, 2)), 1)) +
               " items: " + describe_items(pb_items(m, 1));
      case 3:
        return num + " summary updates: " + describe_items(pb_items(m, 1));
      case 18:
        return num + " exit exit_code=" + std::to_string(static_cast<int32_t>(pb_int(m, 1))) + " runtime=<t>";
      default:
        break;
    }
  }
  return num + " unexpected record";
}

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The records of the one run-*.wandb file in `run_dir`, described; fails the test on a framing error.
inline std::vector<std::string> describe_wandb_run(const std::string& wandb_file) {
  std::vector<std::string> payloads, lines;
  std::string error;
  EXPECT_TRUE(read_wandb_records(read_file_bytes(wandb_file), &payloads, &error)) << wandb_file << ": " << error;
  for (const std::string& p : payloads) lines.push_back(describe_wandb_record(p));
  return lines;
}

// History rows of a run: step -> key -> value_json.
inline std::map<int64_t, std::map<std::string, std::string>> wandb_history(const std::string& wandb_file) {
  std::vector<std::string> payloads;
  std::string error;
  std::map<int64_t, std::map<std::string, std::string>> rows;
  EXPECT_TRUE(read_wandb_records(read_file_bytes(wandb_file), &payloads, &error)) << error;
  for (const std::string& p : payloads)
    for (const PbField& f : parse_pb(p))
      if (f.number == 2) {
        const std::vector<PbField> m = parse_pb(f.bytes);
        for (const auto& [k, v] : pb_items(m, 1)) rows[pb_int(parse_pb(pb_string(m, 2)), 1)][k] = v;
      }
  return rows;
}

}  // namespace gale::testing
