// The zip archives torch.save writes (stored entries, 64-byte aligned data): reading and writing.
//
//   GALE_ASSIGN_OR_RETURN(ZipArchive z, ZipArchive::open("model_optim_rng.pt"));
//   GALE_ASSIGN_OR_RETURN(std::string_view pkl, z.entry("model_optim_rng/data.pkl"));
//
//   ZipWriter w;                      // entries are stored (method 0), their data 64-byte aligned
//   w.add("archive/version", "3\n");  // as torch's PyTorchStreamWriter does
//   GALE_RETURN_IF_ERROR(w.write("out.pt"));
//
// The reader takes the whole file into memory and serves stored entries only (torch never
// compresses); zip64 sizes and offsets are understood. A file that is not a zip archive, a
// truncated one or a compressed entry is an error naming the file and what was expected and found.
// The writer refuses archives of 4 GiB or more (zip64 output: not supported yet).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gale {

class ZipArchive {
 public:
  static StatusOr<ZipArchive> open(const std::string& path);
  // An archive already in memory (`path` names it in messages).
  static StatusOr<ZipArchive> from_bytes(std::string bytes, const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // in central-directory order
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  // The entry's bytes (valid while the archive lives); NotFound naming the archive when absent.
  StatusOr<std::string_view> entry(const std::string& name) const;

 private:
  struct Entry {
    uint64_t offset = 0, size = 0;
  };
  std::string path_;
  std::shared_ptr<const std::string> bytes_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
};

class ZipWriter {
 public:
  // Copies `data`; names must be unique.
  void add(const std::string& name, std::string_view data);
  // The archive's bytes.
  StatusOr<std::string> finish() const;
  // finish() written atomically to `path`.
  Status write(const std::string& path) const;

 private:
  std::vector<std::pair<std::string, std::string>> entries_;
};

}  // namespace gale
