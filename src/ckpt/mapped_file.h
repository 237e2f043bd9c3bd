// Read-only memory mapping of a whole file, shared by everything that reads from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace gale {

class MappedFile {
 public:
  // Maps `path` read-only. NotFound when it does not exist, IOError when it cannot be read.
  static StatusOr<std::shared_ptr<const MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }  // nullptr when the file is empty
  uint64_t size() const { return size_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace gale
