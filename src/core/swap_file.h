// An anonymous temporary file for swapping memory out (--swap-optimizer, --swap-attention).
//
// Created with mkstemp in a directory and unlinked at once, so nothing is left behind, even after a
// crash. Reads and writes are whole: partial transfers and EINTR are retried, and a failure is an
// IOError naming the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace gale {

class SwapFile {
 public:
  // Creates the file in `dir` and reserves `bytes` (posix_fallocate; a sparse file where the file
  // system has no fallocate); reads of unwritten bytes give zeros. The file is named
  // `stem`-XXXXXX; `flag` names the directory's flag in errors ("--swap-optimizer-dir /x: cannot
  // create the swap file /x/gale-swap-optimizer-Ab12Cd: No such file or directory").
  static StatusOr<std::unique_ptr<SwapFile>> create(const std::string& dir, int64_t bytes, const std::string& flag,
                                                    const std::string& stem);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  // Within [0, size()).
  Status write(int64_t offset, const void* data, int64_t bytes);
  Status read(int64_t offset, void* data, int64_t bytes) const;
  // Writes `bytes` at the end, growing the file; *offset gets where they went.
  Status append(const void* data, int64_t bytes, int64_t* offset);
  // The name it was created under (already unlinked), for messages.
  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }

 private:
  SwapFile(int fd, std::string path, int64_t size) : fd_(fd), path_(std::move(path)), size_(size) {}
  Status pwrite_all(int64_t offset, const void* data, int64_t bytes);
  int fd_;
  std::string path_;
  int64_t size_;
};

}  // namespace gale
