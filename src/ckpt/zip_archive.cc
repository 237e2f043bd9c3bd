// Zip archives as torch.save writes them: a central-directory reader (stored entries, zip64) and a stored-entry writer.
#include "ckpt/zip_archive.h"

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "ckpt/atomic_file.h"

namespace gale {

namespace {

constexpr uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50, kEndOfCentral = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50, kZip64Locator = 0x07064b50;
constexpr size_t kAlignment = 64;  // torch aligns each entry's data to 64 bytes (mmap-able)

uint64_t get_le(const std::string& b, uint64_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

StatusOr<ZipArchive> ZipArchive::open(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_bytes(std::move(ss).str(), path);
}

StatusOr<ZipArchive> ZipArchive::from_bytes(std::string bytes, const std::string& path) {
  const uint64_t n = bytes.size();
  if (n < 22) return DataLoss(path, ": expected a zip archive (torch.save's format), found ", n, " bytes");
  // The end-of-central-directory record: the last signature within the final 22 + 65535 bytes.
  int64_t eocd = -1;
  const uint64_t lowest = n > 22 + 65535 ? n - 22 - 65535 : 0;
  for (uint64_t at = n - 22 + 1; at-- > lowest;)
    if (get_le(bytes, at, 4) == kEndOfCentral && at + 22 + get_le(bytes, at + 20, 2) == n) {
      eocd = static_cast<int64_t>(at);
      break;
    }
  if (eocd < 0)
    return DataLoss(path, ": expected a zip archive (torch.save's format), found no end-of-central-directory record "
                          "(not a zip file, or truncated)");
  uint64_t count = get_le(bytes, eocd + 10, 2), cd_size = get_le(bytes, eocd + 12, 4), cd_offset = get_le(bytes, eocd + 16, 4);
  if (count == 0xffff || cd_size == 0xffffffffu || cd_offset == 0xffffffffu) {
    if (eocd < 20 || get_le(bytes, eocd - 20, 4) != kZip64Locator)
      return DataLoss(path, ": zip64 sizes without a zip64 end-of-central-directory locator");
    const uint64_t z = get_le(bytes, eocd - 20 + 8, 8);
    if (z + 56 > n || get_le(bytes, z, 4) != kZip64End)
      return DataLoss(path, ": the zip64 end-of-central-directory record at ", z, " is missing or truncated");
    count = get_le(bytes, z + 32, 8);
    cd_size = get_le(bytes, z + 40, 8);
    cd_offset = get_le(bytes, z + 48, 8);
  }
  if (cd_offset > n || cd_size > n - cd_offset)
    return DataLoss(path, ": the central directory (", cd_size, " bytes at ", cd_offset, ") lies beyond the file's ",
                    n, " bytes (truncated?)");
  ZipArchive z;
  z.path_ = path;
  uint64_t at = cd_offset;
  for (uint64_t e = 0; e < count; ++e) {
    if (at + 46 > cd_offset + cd_size || get_le(bytes, at, 4) != kCentralHeader)
      return DataLoss(path, ": central-directory entry ", e, " of ", count, " is missing or corrupt");
    const uint64_t method = get_le(bytes, at + 10, 2);
    uint64_t csize = get_le(bytes, at + 20, 4), usize = get_le(bytes, at + 24, 4);
    const uint64_t name_len = get_le(bytes, at + 28, 2), extra_len = get_le(bytes, at + 30, 2),
                   comment_len = get_le(bytes, at + 32, 2);
    uint64_t local = get_le(bytes, at + 42, 4);
    if (at + 46 + name_len + extra_len + comment_len > cd_offset + cd_size)
      return DataLoss(path, ": central-directory entry ", e, " runs past the directory");
    std::string name = bytes.substr(at + 46, name_len);
    for (uint64_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint64_t id = get_le(bytes, x, 2), len = get_le(bytes, x + 2, 2);
      if (x + 4 + len > at + 46 + name_len + extra_len) break;
      if (id == 0x0001) {  // zip64: the fields saturated above, in this order
        uint64_t f = x + 4;
        if (usize == 0xffffffffu && f + 8 <= x + 4 + len) usize = get_le(bytes, f, 8), f += 8;
        if (csize == 0xffffffffu && f + 8 <= x + 4 + len) csize = get_le(bytes, f, 8), f += 8;
        if (local == 0xffffffffu && f + 8 <= x + 4 + len) local = get_le(bytes, f, 8), f += 8;
      }
      x += 4 + len;
    }
    if (method != 0)
      return Unimplemented(path, ": entry '", name, "' is compressed (method ", method,
                           "); expected stored entries as torch.save writes them (compressed entries: not supported yet)");
    if (csize != usize) return DataLoss(path, ": stored entry '", name, "' has sizes ", csize, " and ", usize);
    if (local + 30 > n || get_le(bytes, local, 4) != kLocalHeader)
      return DataLoss(path, ": the local header of entry '", name, "' at ", local, " is missing or corrupt");
    const uint64_t data = local + 30 + get_le(bytes, local + 26, 2) + get_le(bytes, local + 28, 2);
    if (data > n || csize > n - data)
      return DataLoss(path, ": entry '", name, "' (", csize, " bytes at ", data, ") runs past the end of the file (",
                      n, " bytes: truncated?)");
    if (!z.entries_.emplace(name, Entry{data, csize}).second)
      return DataLoss(path, ": entry '", name, "' appears twice");
    z.order_.push_back(std::move(name));
    at += 46 + name_len + extra_len + comment_len;
  }
  z.bytes_ = std::make_shared<const std::string>(std::move(bytes));
  return z;
}

std::vector<std::string> ZipArchive::names() const { return order_; }

StatusOr<std::string_view> ZipArchive::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_, ": the archive has no entry '", name, "'");
  return std::string_view(*bytes_).substr(it->second.offset, it->second.size);
}

void ZipWriter::add(const std::string& name, std::string_view data) { entries_.emplace_back(name, std::string(data)); }

StatusOr<std::string> ZipWriter::finish() const {
  std::string out, central;
  std::set<std::string> seen;
  for (const auto& entry : entries_) {
    const std::string& name = entry.first;  // (not a structured binding: the lambda below captures it)
    const std::string& data = entry.second;
    if (!seen.insert(name).second) return InvalidArgument("zip archive: entry '", name, "' added twice");
    const uint64_t offset = out.size();
    const uint32_t crc = crc32_update(0, data.data(), data.size());
    // Pad with an extra field ("FB", as torch) so the data starts on a 64-byte boundary.
    size_t header_end = offset + 30 + name.size() + 4;
    const size_t pad = (kAlignment - header_end % kAlignment) % kAlignment;
    auto header = [&](std::string& o, bool central_entry) {
      put_le(o, central_entry ? kCentralHeader : kLocalHeader, 4);
      if (central_entry) put_le(o, 0, 2);  // version made by
      put_le(o, 0, 2);                       // version needed
      put_le(o, 0, 2);                       // flags
      put_le(o, 0, 2);                       // method: stored
      put_le(o, 0, 2);                       // time
      put_le(o, 0, 2);                       // date
      put_le(o, crc, 4);
      put_le(o, data.size(), 4);
      put_le(o, data.size(), 4);
      put_le(o, name.size(), 2);
      put_le(o, central_entry ? 0 : 4 + pad, 2);
      if (central_entry) {
        put_le(o, 0, 2);  // comment
        put_le(o, 0, 2);  // disk
        put_le(o, 0, 2);  // internal attributes
        put_le(o, 0, 4);  // external attributes
        put_le(o, offset, 4);
      }
      o += name;
    };
    header(out, false);
    put_le(out, 0x4246, 2);  // "FB"
    put_le(out, pad, 2);
    out.append(pad, 'Z');
    out += data;
    header(central, true);
    if (out.size() >= 0xffffffffu)
      return Unimplemented("zip archive of ", out.size(), " bytes: 4 GiB or more needs zip64 (not supported yet)");
  }
  const uint64_t cd_offset = out.size();
  out += central;
  put_le(out, kEndOfCentral, 4);
  put_le(out, 0, 2);
  put_le(out, 0, 2);
  put_le(out, entries_.size(), 2);
  put_le(out, entries_.size(), 2);
  put_le(out, central.size(), 4);
  put_le(out, cd_offset, 4);
  put_le(out, 0, 2);
  if (entries_.size() >= 0xffff) return Unimplemented("zip archive of ", entries_.size(), " entries: zip64 (not supported yet)");
  return out;
}

Status ZipWriter::write(const std::string& path) const {
  GALE_ASSIGN_OR_RETURN(std::string bytes, finish());
  return write_file_atomically(path, bytes);
}

}  // namespace gale
