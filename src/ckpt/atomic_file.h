// Crash-safe file output: write to "<path>.tmp", fsync, rename over <path>, fsync the directory.
//
// After a crash at any point, <path> holds either its previous content or the complete new
// content, never a mix. Checkpoints, their tracker file and safetensors files are written this way.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace gale {

class AtomicFileWriter {
 public:
  AtomicFileWriter() = default;
  ~AtomicFileWriter();  // removes the temporary file unless commit() succeeded
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Creates (truncates) "<path>.tmp".
  Status open(const std::string& path);
  // Appends bytes; the running size and CRC-32 (zlib's) of everything written are kept.
  Status write(const void* data, size_t bytes);
  // fsync, close, rename to <path>, fsync the containing directory.
  Status commit();
  // Close without renaming or removing the temporary file: what a crash before commit() leaves
  // behind (used by tests that simulate one).
  void detach();

  uint64_t bytes_written() const { return bytes_; }
  uint32_t crc32() const { return crc_; }
  const std::string& path() const { return path_; }
  std::string temp_path() const { return path_ + ".tmp"; }

 private:
  void abandon();
  std::string path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

// Writes `content` to `path` atomically (as AtomicFileWriter).
Status write_file_atomically(const std::string& path, std::string_view content);

// fsync a directory so that renames and creations inside it are durable.
Status fsync_directory(const std::string& dir);

// CRC-32 (zlib polynomial) of a byte range, continuing from `crc` (0 to start).
uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes);

}  // namespace gale
