// Temporary-file + fsync + rename writer, directory fsync and CRC-32.
#include "ckpt/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace gale {

namespace {
std::string parent_dir(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}
}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
  const Bytef* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (bytes > 0) {  // zlib takes uInt lengths
    uInt chunk = bytes > (1u << 30) ? (1u << 30) : static_cast<uInt>(bytes);
    c = ::crc32(c, p, chunk);
    p += chunk;
    bytes -= chunk;
  }
  return static_cast<uint32_t>(c);
}

AtomicFileWriter::~AtomicFileWriter() { abandon(); }

void AtomicFileWriter::abandon() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(temp_path().c_str());
  }
}

void AtomicFileWriter::detach() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status AtomicFileWriter::open(const std::string& path) {
  abandon();
  path_ = path;
  bytes_ = 0;
  crc_ = 0;
  fd_ = ::open(temp_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return IOError(temp_path(), ": cannot create: ", std::strerror(errno));
  return Status::Ok();
}

Status AtomicFileWriter::write(const void* data, size_t bytes) {
  if (fd_ < 0) return FailedPrecondition(path_, ": write to a file that is not open");
  const char* p = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s =
          IOError(temp_path(), ": write failed after ", bytes_ + (bytes - left), " bytes: ", std::strerror(errno));
      abandon();
      return s;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  crc_ = crc32_update(crc_, data, bytes);
  bytes_ += bytes;
  return Status::Ok();
}

Status AtomicFileWriter::commit() {
  if (fd_ < 0) return FailedPrecondition(path_, ": commit of a file that is not open");
  if (::fsync(fd_) != 0) {
    Status s = IOError(temp_path(), ": fsync failed: ", std::strerror(errno));
    abandon();
    return s;
  }
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(temp_path().c_str());
    return IOError(temp_path(), ": close failed: ", std::strerror(errno));
  }
  fd_ = -1;
  if (::rename(temp_path().c_str(), path_.c_str()) != 0) {
    Status s = IOError(path_, ": cannot rename ", temp_path(), " into place: ", std::strerror(errno));
    ::unlink(temp_path().c_str());
    return s;
  }
  return fsync_directory(parent_dir(path_));
}

Status write_file_atomically(const std::string& path, std::string_view content) {
  AtomicFileWriter w;
  GALE_RETURN_IF_ERROR(w.open(path));
  GALE_RETURN_IF_ERROR(w.write(content.data(), content.size()));
  return w.commit();
}

Status fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IOError(dir, ": cannot open directory to fsync it: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return IOError(dir, ": directory fsync failed: ", std::strerror(err));
  return Status::Ok();
}

}  // namespace gale
