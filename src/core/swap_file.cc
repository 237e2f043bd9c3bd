// The anonymous swap file: mkstemp + unlink, reserved blocks, whole pread/pwrite.
#include "core/swap_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/check.h"

namespace gale {

namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

StatusOr<std::unique_ptr<SwapFile>> SwapFile::create(const std::string& dir, int64_t bytes, const std::string& flag,
                                                     const std::string& stem) {
  std::string path = (dir.empty() ? std::string(".") : dir) + "/" + stem + "-XXXXXX";
  std::vector<char> name(path.begin(), path.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  path.assign(name.data());
  if (fd < 0) return IOError(flag, " ", dir, ": cannot create the swap file ", path, ": ", errno_text());
  ::unlink(path.c_str());  // anonymous from now on: gone when closed, even after a crash
  if (bytes > 0) {
    // Reserve the blocks now, so that a full disk shows at start-up; file systems without
    // fallocate get a sparse file of the right size.
    int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
    if (rc != 0) {
      ::close(fd);
      return IOError(flag, " ", dir, ": cannot reserve ", bytes, " bytes for the swap file ", path, ": ",
                     std::strerror(rc));
    }
  }
  return std::unique_ptr<SwapFile>(new SwapFile(fd, path, bytes));
}

SwapFile::~SwapFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status SwapFile::pwrite_all(int64_t offset, const void* data, int64_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, static_cast<size_t>(bytes), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return IOError("swap file ", path_, ": write of ", bytes, " bytes at ", offset, " failed: ",
                     n < 0 ? errno_text() : std::string("nothing written"));
    p += n;
    offset += n;
    bytes -= n;
  }
  return Status::Ok();
}

Status SwapFile::write(int64_t offset, const void* data, int64_t bytes) {
  GALE_CHECK(offset >= 0 && offset + bytes <= size_) << "swap file " << path_ << ": write past its " << size_ << " bytes";
  return pwrite_all(offset, data, bytes);
}

Status SwapFile::append(const void* data, int64_t bytes, int64_t* offset) {
  *offset = size_;
  GALE_RETURN_IF_ERROR(pwrite_all(size_, data, bytes));
  size_ += bytes;
  return Status::Ok();
}

Status SwapFile::read(int64_t offset, void* data, int64_t bytes) const {
  GALE_CHECK(offset >= 0 && offset + bytes <= size_) << "swap file " << path_ << ": read past its " << size_ << " bytes";
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, static_cast<size_t>(bytes), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return IOError("swap file ", path_, ": read of ", bytes, " bytes at ", offset, " failed: ",
                     n < 0 ? errno_text() : std::string("end of file"));
    p += n;
    offset += n;
    bytes -= n;
  }
  return Status::Ok();
}

}  // namespace gale
